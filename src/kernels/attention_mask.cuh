// Which scores of a (block_m x block_n) tile a query row may see: keys past
// seqlen_k (TMA zero-fills them, which would read as score 0) and, for causal,
// keys right of the bottom-right-aligned diagonal.
#pragma once

#include <cute/tensor.hpp>

#include <climits>
#include <cmath>

namespace flash3::kernels {

using namespace cute;

template <bool kCausal, int kBlockM, int kBlockN>
struct AttentionMask {
  int seqlen_q;
  int seqlen_k;

  // Query row i sees key j iff j <= i + (seqlen_k - seqlen_q).
  CUTE_HOST_DEVICE int causal_offset() const { return seqlen_k - seqlen_q; }

  // Key blocks [0, n_block_end) hold every key some row of m_block may see:
  // exactly the key blocks whose m_block_begin is <= m_block (deterministic
  // dQ ordering relies on the two agreeing; attention_mask_test.cu).
  CUTE_HOST_DEVICE int n_block_end(int m_block) const {
    int const n_blocks = ceil_div(seqlen_k, kBlockN);
    if constexpr (!kCausal) {
      return n_blocks;
    } else {
      int const last_row = min((m_block + 1) * kBlockM, seqlen_q) - 1;
      int const last_key = last_row + causal_offset();
      return last_key < 0 ? 0 : min(n_blocks, last_key / kBlockN + 1);
    }
  }

  // Query blocks [m_block_begin, ceil(seqlen_q / kBlockM)) hold every query
  // that sees some key of n_block (the backward walks them).
  CUTE_HOST_DEVICE int m_block_begin(int n_block) const {
    if constexpr (!kCausal) {
      return 0;
    } else {
      int const first_row = max(0, n_block * kBlockN - causal_offset());
      return min(first_row, seqlen_q) / kBlockM;
    }
  }

  // Whether some score of block (m_block, n_block) is masked.
  CUTE_DEVICE bool needs_mask(int m_block, int n_block) const {
    bool const past_end = (n_block + 1) * kBlockN > seqlen_k;
    if constexpr (!kCausal) {
      return past_end;
    } else {
      int const first_row = m_block * kBlockM;
      return past_end || (n_block + 1) * kBlockN - 1 > first_row + causal_offset();
    }
  }

  // scores: (rows, cols) view; coords: the same view of (row, col) in the tile.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores&& scores, Coords const& coords, int m_block, int n_block) const {
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int col_end = seqlen_k;
      if constexpr (kCausal) {
        col_end = min(col_end, row0 + get<0>(coords(i, 0)) + causal_offset() + 1);
      }
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        if (col0 + get<1>(coords(i, j)) >= col_end) scores(i, j) = -INFINITY;
      }
    }
  }

  // The same rule on a transposed tile: rows are keys, columns are queries.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_transposed(Scores&& scores_t, Coords const& coords, int m_block,
                                    int n_block) const {
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores_t); ++i) {
      int const key = col0 + get<0>(coords(i, 0));
      // Query `row` sees `key` iff row >= key - causal_offset().
      int const row_begin = key >= seqlen_k ? INT_MAX : kCausal ? key - causal_offset() : INT_MIN;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores_t); ++j) {
        if (row0 + get<1>(coords(i, j)) < row_begin) scores_t(i, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flash3::kernels
