// One warpgroup-wide GEMM over the K dimension of the fragments: issues the
// WGMMAs and commits them as one batch; the caller decides when to wait.
#pragma once

#include <cute/tensor.hpp>

namespace flash3::kernels {

using namespace cute;

template <bool kZeroAccumulator, class TiledMma, class FragA, class FragB, class FragC>
CUTE_DEVICE void warpgroup_gemm(TiledMma& mma, FragA&& a, FragB const& b, FragC& c) {
  // A comes either as shared-memory descriptors or as registers (P in O += P V).
  constexpr bool kARegisters =
      !std::is_same_v<typename std::decay_t<FragA>::iterator, GMMA::DescriptorIterator>;
  if constexpr (kARegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroAccumulator ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(a);
}

}  // namespace flash3::kernels
