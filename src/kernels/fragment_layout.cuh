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
