// The block ranges of the causal mask, on the host: the forward walks key
// blocks [0, n_block_end(m)) of a query block, the backward walks query blocks
// [m_block_begin(n), end) of a key block, and the deterministic backward
// counts the adds a dQ tile receives from the first. They must describe the
// same set of (m, n) pairs, or a deterministic run waits for an add that
// never comes.
#include <gtest/gtest.h>

#include "kernels/attention_mask.cuh"

namespace {

template <bool kCausal, int kBlockM, int kBlockN>
void expect_ranges_agree(int seqlen_q, int seqlen_k) {
  flash3::kernels::AttentionMask<kCausal, kBlockM, kBlockN> const mask{seqlen_q, seqlen_k};
  int const m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  int const n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  for (int m = 0; m < m_blocks; ++m) {
    for (int n = 0; n < n_blocks; ++n) {
      bool const backward_visits = m >= mask.m_block_begin(n);
      bool const forward_visits = n < mask.n_block_end(m);
      ASSERT_EQ(backward_visits, forward_visits)
          << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k << " m " << m << " n " << n;
      // Whatever the ranges say, a pair holding a visible score is in them.
      int const last_row = std::min((m + 1) * kBlockM, seqlen_q) - 1;
      bool const sees = !kCausal || n * kBlockN <= last_row + (seqlen_k - seqlen_q);
      ASSERT_EQ(forward_visits, sees) << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k
                                      << " m " << m << " n " << n;
    }
  }
}

TEST(AttentionMask, BlockRangesAgree) {
  for (int seqlen_q : {1, 17, 63, 64, 65, 128, 200, 333, 1000}) {
    for (int seqlen_k : {1, 17, 64, 127, 128, 129, 300, 555, 1000}) {
      expect_ranges_agree<true, 64, 128>(seqlen_q, seqlen_k);
      expect_ranges_agree<true, 64, 64>(seqlen_q, seqlen_k);
      expect_ranges_agree<true, 128, 128>(seqlen_q, seqlen_k);
      expect_ranges_agree<true, 128, 80>(seqlen_q, seqlen_k);
      expect_ranges_agree<false, 64, 128>(seqlen_q, seqlen_k);
    }
  }
}

}  // namespace
