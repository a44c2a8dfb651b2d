// The block ranges of the attention masks, on the host: the forward walks key
// blocks [n_block_begin(m), n_block_end(m)) of a query block, the backward
// walks query blocks [m_block_begin(n), m_block_end(n)) of a key block, and
// the deterministic backward counts the adds a dQ tile receives from the
// first. They must describe the same set of (m, n) pairs, or a deterministic
// run waits for an add that never comes; and that set must be exactly the
// pairs holding a visible score, or work is skipped or wasted. PackGQA's
// masks (rows of `pack` heads per query) are walked by the forward only.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/attention_mask.cuh"

namespace {

// Brute force: some row of block m sees some key of block n; row r is query
// r / pack.
template <int kBlockM, int kBlockN>
bool pair_sees(int seqlen_q, int seqlen_k, int left, int right, bool banded, int m, int n,
               int pack = 1) {
  for (int r = m * kBlockM; r < std::min((m + 1) * kBlockM, seqlen_q * pack); ++r)
    for (int j = n * kBlockN; j < std::min((n + 1) * kBlockN, seqlen_k); ++j) {
      int const diagonal = r / pack + seqlen_k - seqlen_q;
      if (!banded || (j >= diagonal - left && j <= diagonal + right)) return true;
    }
  return false;
}

template <bool kBanded, int kBlockM, int kBlockN>
void expect_ranges_agree(int seqlen_q, int seqlen_k, int left, int right) {
  int const d = seqlen_k - seqlen_q;
  flash3::kernels::AttentionMask<kBanded, kBlockM, kBlockN> const mask{seqlen_q, seqlen_k,
                                                                       d - left, d + right};
  int const m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  int const n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  for (int m = 0; m < m_blocks; ++m) {
    for (int n = 0; n < n_blocks; ++n) {
      bool const backward_visits = m >= mask.m_block_begin(n) && m < mask.m_block_end(n);
      bool const forward_visits = n >= mask.n_block_begin(m) && n < mask.n_block_end(m);
      bool const sees = pair_sees<kBlockM, kBlockN>(seqlen_q, seqlen_k, left, right, kBanded, m, n);
      ASSERT_EQ(forward_visits, sees) << "forward: seqlen_q " << seqlen_q << " seqlen_k "
                                      << seqlen_k << " window (" << left << ", " << right
                                      << ") m " << m << " n " << n;
      ASSERT_EQ(backward_visits, sees) << "backward: seqlen_q " << seqlen_q << " seqlen_k "
                                       << seqlen_k << " window (" << left << ", " << right
                                       << ") m " << m << " n " << n;
    }
  }
}

template <bool kBanded, int kBlockM, int kBlockN>
void expect_packed_ranges(int seqlen_q, int seqlen_k, int left, int right, int pack) {
  int const d = seqlen_k - seqlen_q;
  flash3::kernels::AttentionMask<kBanded, kBlockM, kBlockN, true> const mask{
      seqlen_q, seqlen_k, d - left, d + right, pack};
  int const m_blocks = (seqlen_q * pack + kBlockM - 1) / kBlockM;
  ASSERT_EQ(mask.m_blocks(), m_blocks);
  for (int m = 0; m < m_blocks; ++m) {
    for (int n = 0; n < mask.n_blocks(); ++n) {
      bool const visits = n >= mask.n_block_begin(m) && n < mask.n_block_end(m);
      bool const sees =
          pair_sees<kBlockM, kBlockN>(seqlen_q, seqlen_k, left, right, kBanded, m, n, pack);
      ASSERT_EQ(visits, sees) << "packed " << pack << ": seqlen_q " << seqlen_q << " seqlen_k "
                              << seqlen_k << " window (" << left << ", " << right << ") m " << m
                              << " n " << n;
    }
  }
}

// Windows as the host resolves them (window.hpp): unbounded left is
// seqlen_k, unbounded right is seqlen_q; causal is right 0.
template <int kBlockM, int kBlockN>
void expect_all_windows(int seqlen_q, int seqlen_k) {
  int const windows[][2] = {{seqlen_k, 0}, {0, 0},     {1, 0},        {100, 0},  {0, 5},
                            {7, 300},      {seqlen_k, 64}, {200, seqlen_q}, {129, 1}};
  for (auto const& w : windows) {
    int const left = std::min(w[0], seqlen_k), right = std::min(w[1], seqlen_q);
    expect_ranges_agree<true, kBlockM, kBlockN>(seqlen_q, seqlen_k, left, right);
    for (int pack : {1, 3, 4, 8})
      expect_packed_ranges<true, kBlockM, kBlockN>(seqlen_q, seqlen_k, left, right, pack);
  }
  expect_ranges_agree<false, kBlockM, kBlockN>(seqlen_q, seqlen_k, 0, 0);
}

TEST(AttentionMask, BlockRangesAgree) {
  for (int seqlen_q : {1, 17, 63, 64, 65, 128, 200, 333, 1000}) {
    for (int seqlen_k : {1, 17, 64, 127, 128, 129, 300, 555, 1000}) {
      expect_all_windows<64, 128>(seqlen_q, seqlen_k);
      expect_all_windows<64, 64>(seqlen_q, seqlen_k);
      expect_all_windows<128, 128>(seqlen_q, seqlen_k);
      expect_all_windows<128, 80>(seqlen_q, seqlen_k);
    }
  }
}

}  // namespace
