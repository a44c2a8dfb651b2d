// Online softmax over the S accumulator of one consumer warpgroup, in fp32
// with exp2 and the softmax scale folded into one FFMA per score.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace flash3::kernels {

using namespace cute;

CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The 4 threads of a quad hold the columns of the same rows (WGMMA layout).
CUTE_DEVICE float quad_allreduce_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
CUTE_DEVICE float quad_allreduce_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// kMaxOffset (log2 units): the exps come out as 2^kMaxOffset * p, which the
// row sum carries too, so O / sum and the LSE are unchanged. FP8 sets 8: P in
// e4m3 then spans (2^-6, 256] in normal numbers instead of subnormals below
// 2^-6, and stays under e4m3's 448.
template <int kRows, int kMaxOffset = 0>
struct OnlineSoftmax {
  static constexpr int kNumRows = kRows;
  // Running max of each row's scores times the step's scale: the log2-domain
  // logit, so that steps with different scales (FP8 block scales) compare.
  float row_max[kRows];
  float row_sum[kRows];  // this thread's partial sum; quad-reduced in finalize

  CUTE_DEVICE OnlineSoftmax() {
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.f;
    }
  }

  // A row with no visible key so far keeps max -inf; exponentiate against 0
  // then so that exp2(-inf - -inf) never produces NaN.
  CUTE_DEVICE static float safe_max(float m) { return m == -INFINITY ? 0.f : m; }

  // Turns scores (rows, cols) into probabilities in place and returns, per
  // row, the factor by which the previous O accumulator must be scaled.
  // `scale_log2`: what turns this step's scores into log2-domain logits (> 0).
  template <class Tensor2d>
  CUTE_DEVICE cute::array<float, kRows> step(Tensor2d&& scores, float scale_log2) {
    static_assert(decltype(size<0>(scores))::value == kRows);
    cute::array<float, kRows> o_scale;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float m = scores(i, 0);
      CUTE_UNROLL
      for (int j = 1; j < size<1>(scores); ++j) m = fmaxf(m, scores(i, j));
      m = fmaxf(row_max[i], quad_allreduce_max(m) * scale_log2);
      o_scale[i] = fast_exp2(row_max[i] - safe_max(m));
      row_max[i] = m;
      float const max_scaled = safe_max(m) - float(kMaxOffset);
      float sum = 0.f;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j) {
        scores(i, j) = fast_exp2(fmaf(scores(i, j), scale_log2, -max_scaled));
        sum += scores(i, j);
      }
      row_sum[i] = row_sum[i] * o_scale[i] + sum;
    }
    return o_scale;
  }

  // Returns per row the factor that normalizes O and writes the natural-log
  // LSE. `sinks[i]`: row i's logit joining the denominator with a zero value vector
  // (-inf: none). The sum is held relative to the row max; the sink is added
  // relative to the larger of the two, so a large sink cannot overflow. Rows
  // that saw no key get factor 0 and LSE -inf (the sink with one).
  CUTE_DEVICE cute::array<float, kRows> finalize(float const (&sinks)[kRows], float (&lse)[kRows]) {
    cute::array<float, kRows> o_scale;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float const sum = quad_allreduce_sum(row_sum[i]);
      // The logit the sum is relative to; -inf for rows that saw no key.
      float const max_logit = (row_max[i] - float(kMaxOffset)) * float(M_LN2);
      float const sink = sinks[i];
      float const top = fmaxf(max_logit, sink);
      if (top == -INFINITY) {
        o_scale[i] = 0.f;
        lse[i] = -INFINITY;
      } else {
        float const keys_weight = __expf(max_logit - top);  // 1 without a sink above the max
        float const total = sum * keys_weight + __expf(sink - top);
        o_scale[i] = keys_weight / total;
        lse[i] = top + __logf(total);
      }
    }
    return o_scale;
  }
};

CUTE_DEVICE float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Softcap: scores -> tanh(scores * input_scale); the logit scale (softcap)
// is applied with the softmax's. MUFU.TANH's relative error (2^-11) is below
// the 16-bit inputs' rounding.
template <class Tensor2d>
CUTE_DEVICE void apply_softcap(Tensor2d&& scores, float input_scale) {
  CUTE_UNROLL
  for (int i = 0; i < size(scores); ++i) scores(i) = fast_tanh(scores(i) * input_scale);
}

template <class Tensor2d, class RowFactors>
CUTE_DEVICE void scale_rows(Tensor2d&& t, RowFactors const& factor) {
  CUTE_UNROLL
  for (int i = 0; i < size<0>(t); ++i) {
    CUTE_UNROLL
    for (int j = 0; j < size<1>(t); ++j) t(i, j) *= factor[i];
  }
}

}  // namespace flash3::kernels
