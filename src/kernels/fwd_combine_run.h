// Seam between the host API and the split-KV combine kernel (fwd_combine.cu).
// Declared without CUTLASS types so host code compiles as plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// `params` is validated: num_splits, batch, seqlen, heads >= 1, head_dim in
// [1, kCombineMaxHeadDim], out_dtype fp16 / bf16 / fp32.
cudaError_t run_combine(const CombineParams& params, cudaStream_t stream);

inline constexpr int kCombineMaxHeadDim = 256;

}  // namespace flash3::kernels
