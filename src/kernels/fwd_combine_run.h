// Seam between the host API and the split-KV combine kernel (fwd_combine.cu).
// Declared without CUTLASS types so host code compiles as plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// Varlen q's output rows (forward() only): batch entry b's row r is row
// cu_seqlens[b] + r of out (its batch stride 0), rows past the sequence's
// length are not written, and lse is (heads, total) (packed_sequence.cuh).
struct CombineVarlenRows {
  const int32_t* cu_seqlens = nullptr;
  const int32_t* seqused = nullptr;
  int total = 0;
};

// `params` is validated: num_splits, batch, seqlen, heads >= 1, head_dim in
// [1, kCombineMaxHeadDim], out_dtype fp16 / bf16 / fp32.
cudaError_t run_combine(const CombineParams& params, cudaStream_t stream,
                        CombineVarlenRows const& varlen = {});

inline constexpr int kCombineMaxHeadDim = 256;

}  // namespace flash3::kernels
