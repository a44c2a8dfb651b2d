// Which scores of a (block_m x block_n) tile a query row may see: keys past
// seqlen_k (TMA zero-fills them, which would read as score 0) and, for a
// banded mask, keys outside the row's band: query i sees key j iff
//   i + key_lo <= j <= i + key_hi,
// with key_lo = d - window_left, key_hi = d + window_right, d = seqlen_k -
// seqlen_q (bottom-right aligned). Causal is key_hi = d with key_lo below
// every key. The host resolves the window (window.hpp) so that both fit
// int32 arithmetic here. Kernels pass key_lo / key_hi straight from their
// parameters: SASS reads them from the constant bank, which keeps the
// banded mask from costing registers in the mainloops.
//
// kPacked (PackGQA, pack_gqa.h): the tile's rows are query rows times
// `pack` heads, row r being query r / pack; seqlen_q counts queries, the
// rows are seqlen_q * pack.
#pragma once
#include <cute/tensor.hpp>

#include <climits>
#include <cmath>

namespace flash3::kernels {

using namespace cute;

template <bool kBanded, int kBlockM, int kBlockN, bool kPacked = false>
struct AttentionMask {
  int seqlen_q;
  int seqlen_k;
  int key_lo;  // banded only
  int key_hi;  // banded only
  int pack = 1;  // kPacked only
  CUTE_HOST_DEVICE int rows() const { return kPacked ? seqlen_q * pack : seqlen_q; }
  CUTE_HOST_DEVICE int query(int row) const { return kPacked ? row / pack : row; }
  CUTE_HOST_DEVICE int n_blocks() const { return ceil_div(seqlen_k, kBlockN); }
  CUTE_HOST_DEVICE int m_blocks() const { return ceil_div(rows(), kBlockM); }

  // Key blocks [n_block_begin(m), n_block_end(m)) are exactly those holding a
  // key some row of m_block sees, and query blocks [m_block_begin(n),
  // m_block_end(n)) exactly those holding a row that sees some key of n_block:
  // the forward walks the first, the backward the second, and deterministic
  // dQ ordering relies on both naming the same (m, n) pairs
  // (attention_mask_test.cu). A block pair holds a visible score iff the
  // differences key - row it spans meet [key_lo, key_hi].
  CUTE_HOST_DEVICE int n_block_begin(int m_block) const {
    if constexpr (!kBanded) {
      return 0;
    } else {
      int const first_key = query(m_block * kBlockM) + key_lo;
      return first_key > seqlen_k - 1 ? n_blocks() : max(first_key, 0) / kBlockN;
    }
  }
  CUTE_HOST_DEVICE int n_block_end(int m_block) const {
    if constexpr (!kBanded) {
      return n_blocks();
    } else {
      int const last_row = query(min((m_block + 1) * kBlockM, rows()) - 1);
      int const last_key = last_row + key_hi;
      return last_key < 0 ? 0 : min(n_blocks(), last_key / kBlockN + 1);
    }
  }
  CUTE_HOST_DEVICE int m_block_begin(int n_block) const {
    static_assert(!kPacked, "the backward walks unpacked query blocks");
    if constexpr (!kBanded) {
      return 0;
    } else {
      int const first_row = n_block * kBlockN - key_hi;
      return first_row > seqlen_q - 1 ? m_blocks() : max(first_row, 0) / kBlockM;
    }
  }
  CUTE_HOST_DEVICE int m_block_end(int n_block) const {
    static_assert(!kPacked, "the backward walks unpacked query blocks");
    if constexpr (!kBanded) {
      return m_blocks();
    } else {
      int const last_key = min((n_block + 1) * kBlockN, seqlen_k) - 1;
      int const last_row = last_key - key_lo;
      return last_row < 0 ? 0 : min(m_blocks(), last_row / kBlockM + 1);
    }
  }

  // Whether some score of block (m_block, n_block) is masked (conservative:
  // rows past seqlen_q count as rows): right of some row's last visible key
  // (band or sequence end), or left of some row's first.
  CUTE_DEVICE bool needs_right_mask(int m_block, int n_block) const {
    bool const past_end = (n_block + 1) * kBlockN > seqlen_k;
    if constexpr (!kBanded) {
      return past_end;
    } else {
      return past_end || (n_block + 1) * kBlockN - 1 > query(m_block * kBlockM) + key_hi;
    }
  }
  CUTE_DEVICE bool needs_left_mask(int m_block, int n_block) const {
    return kBanded && n_block * kBlockN < query((m_block + 1) * kBlockM - 1) + key_lo;
  }
  CUTE_DEVICE bool needs_mask(int m_block, int n_block) const {
    return needs_right_mask(m_block, n_block) || needs_left_mask(m_block, n_block);
  }

  // scores: (rows, cols) view; coords: the same view of (row, col) in the
  // tile. The two edges are separate passes: one with both bounds per row
  // costs the d = 256 forward registers it does not have (measured: spills).
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_right(Scores&& scores, Coords const& coords, int m_block,
                               int n_block) const {
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int col_end = seqlen_k;
      if constexpr (kBanded) col_end = min(col_end, query(row0 + get<0>(coords(i, 0))) + key_hi + 1);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        if (col0 + get<1>(coords(i, j)) >= col_end) scores(i, j) = -INFINITY;
      }
    }
  }
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_left(Scores&& scores, Coords const& coords, int m_block,
                              int n_block) const {
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      int const col_begin = query(row0 + get<0>(coords(i, 0))) + key_lo;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        if (col0 + get<1>(coords(i, j)) < col_begin) scores(i, j) = -INFINITY;
      }
    }
  }

  // The same rule on a transposed tile: rows are keys, columns are queries.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_transposed(Scores&& scores_t, Coords const& coords, int m_block,
                                    int n_block) const {
    static_assert(!kPacked, "the backward walks unpacked query blocks");
    int const row0 = m_block * kBlockM;
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores_t); ++i) {
      int const key = col0 + get<0>(coords(i, 0));
      // Query `row` sees `key` iff key - key_hi <= row <= key - key_lo.
      int row_begin = INT_MIN, row_end = INT_MAX;
      if constexpr (kBanded) {
        row_begin = key - key_hi;
        row_end = key - key_lo + 1;
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
