// Which scores of a (block_m x block_n) tile a query row may see: keys past
// seqlen_k (TMA zero-fills them, which would read as score 0) and, for a
// banded mask, keys outside the row's window. Banded covers causal (window
// right 0, left unbounded) and sliding windows; the window is aligned to the
// bottom-right corner: query i sees key j iff
//   i + offset - window_left <= j <= i + offset + window_right,
// offset = seqlen_k - seqlen_q. The host resolves "unbounded" to a bound no
// row reaches (window.hpp), so both are >= 0 here and nothing overflows.
#pragma once

#include <cute/tensor.hpp>

#include <climits>
#include <cmath>

namespace flash3::kernels {

using namespace cute;

template <bool kBanded, int kBlockM, int kBlockN>
struct AttentionMask {
  int seqlen_q;
  int seqlen_k;
  int window_left;   // banded only
  int window_right;  // banded only

  CUTE_HOST_DEVICE int offset() const { return seqlen_k - seqlen_q; }
  CUTE_HOST_DEVICE int n_blocks() const { return ceil_div(seqlen_k, kBlockN); }
  CUTE_HOST_DEVICE int m_blocks() const { return ceil_div(seqlen_q, kBlockM); }

  // Key blocks [n_block_begin(m), n_block_end(m)) are exactly those holding a
  // key some row of m_block sees, and query blocks [m_block_begin(n),
  // m_block_end(n)) exactly those holding a row that sees some key of n_block:
  // the forward walks the first, the backward the second, and deterministic
  // dQ ordering relies on both naming the same (m, n) pairs
  // (attention_mask_test.cu). A block pair holds a visible score iff the
  // differences key - row it spans meet [offset - left, offset + right].
  CUTE_HOST_DEVICE int n_block_begin(int m_block) const {
    if constexpr (!kBanded) {
      return 0;
    } else {
      int const first_key = m_block * kBlockM + offset() - window_left;
      return first_key > seqlen_k - 1 ? n_blocks() : max(first_key, 0) / kBlockN;
    }
  }
  CUTE_HOST_DEVICE int n_block_end(int m_block) const {
    if constexpr (!kBanded) {
      return n_blocks();
    } else {
      int const last_row = min((m_block + 1) * kBlockM, seqlen_q) - 1;
      int const last_key = last_row + offset() + window_right;
      return last_key < 0 ? 0 : min(n_blocks(), last_key / kBlockN + 1);
    }
  }
  CUTE_HOST_DEVICE int m_block_begin(int n_block) const {
    if constexpr (!kBanded) {
      return 0;
    } else {
      int const first_row = n_block * kBlockN - offset() - window_right;
      return first_row > seqlen_q - 1 ? m_blocks() : max(first_row, 0) / kBlockM;
    }
  }
  CUTE_HOST_DEVICE int m_block_end(int n_block) const {
    if constexpr (!kBanded) {
      return m_blocks();
    } else {
      int const last_key = min((n_block + 1) * kBlockN, seqlen_k) - 1;
      int const last_row = last_key - offset() + window_left;
      return last_row < 0 ? 0 : min(m_blocks(), last_row / kBlockM + 1);
    }
  }

  // Whether some score of block (m_block, n_block) is masked (conservative:
  // rows past seqlen_q count as rows).
  CUTE_DEVICE bool needs_mask(int m_block, int n_block) const {
    bool const past_end = (n_block + 1) * kBlockN > seqlen_k;
    if constexpr (!kBanded) {
      return past_end;
    } else {
      int const first_row = m_block * kBlockM;
      int const last_row = first_row + kBlockM - 1;
      bool const right = (n_block + 1) * kBlockN - 1 > first_row + offset() + window_right;
      bool const left = n_block * kBlockN < last_row + offset() - window_left;
      return past_end || right || left;
    }
  }

  // scores: (rows, cols) view; coords: the same view of (row, col) in the tile.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores&& scores, Coords const& coords, int m_block, int n_block) const {
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int col_begin = INT_MIN;
      int col_end = seqlen_k;
      if constexpr (kBanded) {
        int const diagonal = row0 + get<0>(coords(i, 0)) + offset();
        col_begin = diagonal - window_left;
        col_end = min(col_end, diagonal + window_right + 1);
      }
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        int const col = col0 + get<1>(coords(i, j));
        if (col >= col_end || col < col_begin) scores(i, j) = -INFINITY;
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
      // Query `row` sees `key` iff key - offset - right <= row <= key - offset + left.
      int row_begin = INT_MIN, row_end = INT_MAX;
      if constexpr (kBanded) {
        row_begin = key - offset() - window_right;
        row_end = key - offset() + window_left + 1;
      }
      if (key >= seqlen_k) row_begin = INT_MAX;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores_t); ++j) {
        int const row = row0 + get<1>(coords(i, j));
        if (row < row_begin || row >= row_end) scores_t(i, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flash3::kernels
