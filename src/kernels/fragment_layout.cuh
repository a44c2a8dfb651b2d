// Views of WGMMA register fragments that the softmax and the second GEMM need.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flash3::kernels {

using namespace cute;

// A WGMMA accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): per 8-column
// group a thread holds 2 adjacent columns of 2 rows (r and r + 8). Softmax
// wants it as (rows, cols) so it can reduce along a row.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_rowcol_layout(Layout acc) {
  static_assert(rank(acc) == 3);
  auto v = get<0>(acc);
  static_assert(rank(v) == 3);
  return make_layout(make_layout(get<1>(v), get<1>(acc)),
                     make_layout(get<0>(v), get<2>(v), get<2>(acc)));
}

template <class Engine, class Layout>
CUTE_DEVICE auto as_rowcol(Tensor<Engine, Layout>& acc) {
  return make_tensor(acc.data(), acc_rowcol_layout(acc.layout()));
}

// For 16-bit inputs the S accumulator of m64nN and the register A operand of
// m64nNk16 assign the same (row, col) to the same register index (PTX ISA,
// wgmma fragment figures): P can feed O += P V without any data movement. The
// A operand is ((2, 2, 2), MMA_M, MMA_K): split the N/8 column groups in pairs.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_operand_a_layout(Layout acc) {
  auto v = get<0>(acc);
  auto groups = flatten(logical_divide(get<2>(v), Shape<_2>{}));  // (2, N/16)
  return make_layout(make_layout(get<0>(v), get<1>(v), get<0>(groups)), get<1>(acc),
                     coalesce(make_layout(get<1>(groups), get<2>(acc))));
}

// FP8: the A operand of m64nNk32 (e4m3) gives each register 4 consecutive k
// of one row: per 32 columns a thread holds, for rows r and r + 8, k = 4q ..
// 4q + 3 and 16 + 4q .. 16 + 4q + 3 (q = lane % 4; PTX ISA, wgmma fragment
// figures). The accumulator gives the same thread columns 2q, 2q + 1 of every
// 8. Rather than move values between threads, each register takes the
// thread's own accumulator pairs 2q + {0, 1} + {0, 8} (+ 16): A's k position
// 4q + i (+ 16) then holds key sigma = 2q + (i & 1) + 8 (i >> 1) (+ 16), and
// V^T carries its keys in that order (fp8_v_key_position, fp8_quantize.cu).
template <class AccEngine, class AccLayout, class PEngine, class PLayout>
CUTE_DEVICE void convert_p_fp8(Tensor<AccEngine, AccLayout> const& acc,
                               Tensor<PEngine, PLayout>& p) {
  using To = typename PEngine::value_type;
  static_assert(sizeof(To) == 1);
  constexpr int kSize = decltype(size(acc))::value;
  static_assert(kSize % 16 == 0 && kSize == decltype(size(p))::value);
  float const* in = acc.data();
  auto* out = reinterpret_cast<cutlass::Array<To, 4>*>(p.data());
  cutlass::NumericArrayConverter<To, float, 4> convert;
  // Per 16 accumulator values (32 columns): registers (row r, low 16),
  // (r + 8, low), (r, high), (r + 8, high) take pairs {0, 4}, {2, 6}, {8, 12},
  // {10, 14} (+ 1).
  CUTE_UNROLL
  for (int reg = 0; reg < kSize / 4; ++reg) {
    int const base = (reg / 4) * 16 + (reg % 2) * 2 + ((reg / 2) % 2) * 8;
    cutlass::Array<float, 4> pair_of_pairs;
    pair_of_pairs[0] = in[base];
    pair_of_pairs[1] = in[base + 1];
    pair_of_pairs[2] = in[base + 4];
    pair_of_pairs[3] = in[base + 5];
    out[reg] = convert(pair_of_pairs);
  }
}

// Element-wise conversion of a whole register fragment into another one of
// the same size (layouts may differ), vectorized by CUTLASS.
template <class SrcEngine, class SrcLayout, class DstEngine, class DstLayout>
CUTE_DEVICE void convert_fragment(Tensor<SrcEngine, SrcLayout> const& src,
                                  Tensor<DstEngine, DstLayout>& dst) {
  using From = typename SrcEngine::value_type;
  using To = typename DstEngine::value_type;
  constexpr int kSize = decltype(size(src))::value;
  static_assert(kSize == decltype(size(dst))::value);
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kSize> const*>(src.data()));
}

}  // namespace flash3::kernels
