// Which tiles a forward CTA works on. Tile t is query block
// m_blocks - 1 - t % m_blocks of head (t / m_blocks) % heads_q of batch entry
// t / (m_blocks * heads_q): a head's heaviest causal blocks first, and the
// blocks of one head next to each other, so that CTAs running together share
// that head's K and V in L2. A CTA walks t = blockIdx.x, + gridDim.x, ...:
// with a persistent grid (one CTA per SM) the producer loads the next tile's
// Q, K and V while the consumers finish the current one; with one CTA per
// tile the loop runs once and the hardware hands tiles out as SMs free up.
// Split-KV (kSplit) adds the split between head and batch entry: the CTAs of
// one split of all heads run together, and a KV head's query heads share
// their keys in L2.
#pragma once

#include <cute/config.hpp>

namespace flash3::kernels {

struct FwdTileIndex {
  int m_block;
  int head;
  int batch;
  int split;
};

template <bool kPersistent, bool kSplit = false>
struct FwdTileScheduler {
  int m_blocks;
  int heads;
  int num_tiles;
  int splits = 1;  // kSplit only

  CUTE_DEVICE int first() const { return int(blockIdx.x); }
  // One tile per CTA: past the last tile, which the compiler sees, so the
  // loop body runs once with no loop around it.
  CUTE_DEVICE int next(int t) const { return kPersistent ? t + int(gridDim.x) : num_tiles; }
  CUTE_DEVICE bool done(int t) const { return t >= num_tiles; }
  CUTE_DEVICE FwdTileIndex operator()(int t) const {
    int const head_tile = t / m_blocks;
    int const m_block = m_blocks - 1 - (t - head_tile * m_blocks);
    int const head = head_tile % heads;
    if constexpr (kSplit) {
      int const batch_split = head_tile / heads;
      return {m_block, head, batch_split / splits, batch_split % splits};
    } else {
      return {m_block, head, head_tile / heads, 0};
    }
  }
};

}  // namespace flash3::kernels
