// PackGQA: the query heads of one KV head as the rows of one tile. Row r of
// a packed tile sequence is query r / pack of head head0 + r % pack, so a
// decode step (one query row per head) fills a 128-row tile with the group's
// heads instead of leaving 127 rows empty in each of them, and reads the
// group's K / V once instead of once per head. Plain C++ (host and kernels).
#pragma once

#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// The pack factor of the KV-cache kernel: the GQA group size when packing
// needs fewer tiles than one head per tile (PackGqa::kAuto) or is asked for
// (kOn), else 1.
inline int pack_gqa_factor(int seqlen_q, int heads_per_kv_head, int block_m,
                           PackGqa mode = PackGqa::kAuto) {
  if (heads_per_kv_head <= 1 || mode == PackGqa::kOff) return 1;
  if (mode == PackGqa::kOn) return heads_per_kv_head;
  int64_t const packed = (int64_t{seqlen_q} * heads_per_kv_head + block_m - 1) / block_m;
  int64_t const unpacked = int64_t{heads_per_kv_head} * ((seqlen_q + block_m - 1) / block_m);
  return packed < unpacked ? heads_per_kv_head : 1;
}

}  // namespace flash3::kernels
