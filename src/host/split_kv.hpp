// Which forward calls run the KV-cache kernel, and split-KV's split count.
// Pure host code (the SM count is an argument), unit-tested without a GPU.
#pragma once

#include <cstddef>

#include "flash3/flash3.hpp"

namespace flash3::host {

// Most splits a call may ask for or be given.
inline constexpr int kMaxSplits = 128;
// Fewest key blocks per split the heuristic leaves: a split's fixed costs
// (Q load, epilogue, its share of the combine) amortize over at least this many.
inline constexpr int kMinBlocksPerSplit = 2;

// K / V through the KV-cache kernel: cache arrays (seqused_k without varlen
// k, kv_batch_idx, leftpad_k, page_table), varlen q over unpacked k and v,
// `splits` > 1, or GQA that PackGQA packs (kernels/pack_gqa.h: few query
// rows per head, or pack_gqa on).
bool uses_kv_cache_kernel(const ForwardParams& params, int splits);

// num_splits = 0's choice for `ctas` CTAs without splits, each over
// `key_blocks` key blocks, on `sms` SMs: as many splits as fit in one wave
// (floor(sms / ctas)), at most key_blocks / kMinBlocksPerSplit and
// kMaxSplits; 1 once the CTAs fill half the SMs or more.
int choose_splits(long long ctas, int key_blocks, int sms);

// Workspace bytes for `splits` splits of this (validated) call; 0 for 1.
size_t split_workspace_bytes(const ForwardParams& params, int splits);

// The split count forward() runs with: num_splits when given (>= 1), else
// choose_splits() for this call, reduced to what workspace_bytes holds.
// 1 for what split-KV does not support (FP8, varlen k).
int resolve_splits(const ForwardParams& params, int sms, bool limit_to_workspace = true);

}  // namespace flash3::host
