#include "split_kv.hpp"

#include <algorithm>

#include "kernels/pack_gqa.h"
#include "kernels/split_kv.h"
#include "kernels/tile_config.h"
#include "validate.hpp"

namespace flash3::host {
namespace {

// (The KV-cache kernel, which splits and packs, takes neither FP8, packed k
// and v, nor a V head dim of its own.)
bool splittable(const ForwardParams& p) {
  return p.dtype != DType::kFloat8E4M3 && !varlen_kv(p) && head_dim_v(p) == p.head_dim;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// PackGQA (only the KV-cache kernel packs; FP8 has none).
int pack_gqa(const ForwardParams& p) {
  if (!splittable(p) || p.heads_kv <= 0) return 1;
  return kernels::pack_gqa_factor(p.seqlen_q, p.heads_q / p.heads_kv,
                                  kernels::fwd_kvcache_tile_config(p.head_dim).block_m, p.pack_gqa);
}

}  // namespace

bool uses_kv_cache_kernel(const ForwardParams& p, int splits) {
  if (varlen_kv(p)) return false;
  return p.cu_seqlens_q != nullptr || splits > 1 || p.seqused_k != nullptr || p.kv_batch_idx != nullptr ||
         p.leftpad_k != nullptr || p.page_table != nullptr || pack_gqa(p) > 1;
}

int choose_splits(long long ctas, int key_blocks, int sms) {
  if (ctas <= 0 || sms <= 0 || 2 * ctas >= sms) return 1;
  long long const per_wave = sms / ctas;
  long long const by_keys = key_blocks / kMinBlocksPerSplit;
  return int(std::max(1LL, std::min({per_wave, by_keys, static_cast<long long>(kMaxSplits)})));
}

size_t split_workspace_bytes(const ForwardParams& p, int splits) {
  if (splits <= 1) return 0;
  return kernels::split_workspace_bytes(splits, p.batch, p.heads_q, p.seqlen_q, p.head_dim);
}

int resolve_splits(const ForwardParams& p, int sms, bool limit_to_workspace) {
  if (!splittable(p)) return 1;
  if (p.num_splits >= 1) return p.num_splits;
  kernels::FwdTileConfig const tile = kernels::fwd_kvcache_tile_config(p.head_dim);
  int const pack = pack_gqa(p);
  long long const ctas =
      (static_cast<long long>(p.seqlen_q) * pack + tile.block_m - 1) / tile.block_m *
      (p.heads_q / pack) * p.batch;
  int splits = choose_splits(ctas, ceil_div(p.seqlen_k, tile.block_n), sms);
  if (!limit_to_workspace) return splits;
  if (p.workspace == nullptr) return 1;
  size_t const per_split = split_workspace_bytes(p, 2) / 2;
  if (per_split > 0) splits = int(std::min<size_t>(splits, p.workspace_bytes / per_split));
  return std::max(splits, 1);
}

}  // namespace flash3::host
