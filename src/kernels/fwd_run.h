// Seam between the host API and the forward kernels: the host validates, then
// calls the instantiation that matches dtype and head dim. Declared without
// CUTLASS types so host code compiles as plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// Defined once per (dtype, head dim) in instantiations/fwd_<dtype>_hdim<d>.cu,
// and per (dtype, head dim, V's head dim) in fwd_<dtype>_hdim<d>x<dv>.cu
// (16-bit; params.head_dim_v = kHeadDimV, no KV cache).
// `params` is validated and resolved: seqlen_k >= 1, batch >= 1, seqlen_q >=
// 1, softmax_scale set, and the mask as host/window.hpp gives it: window_left
// = window_right = -1 for full attention, both >= 0 for a band (causal is
// window_right = 0); varlen (cu_seqlens_q set) always a band, relative to each
// sequence, with total_k >= 1 and total_q >= 1.
template <DType kDType, int kHeadDim, int kHeadDimV = kHeadDim>
cudaError_t run_fwd(const ForwardParams& params, cudaStream_t stream);

// The KV-cache kernel (instantiations/fwd_kvcache_<dtype>_hdim<d>.cu), for
// 16-bit dtypes: params resolved as above, always a band (relative to each
// batch entry's keys), cache_batch >= 1 and num_splits >= 1; num_splits > 1
// writes the partial results into params.workspace (split_kv.h) and leaves
// out and lse to the combine kernel.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_kvcache(const ForwardParams& params, cudaStream_t stream);

// seqlen_k == 0: out = 0, lse = -inf or the sink (rows that see no key).
// Fixed-length layout only (varlen callers pass their packed rows as one
// sequence).
cudaError_t run_fwd_empty_keys(const ForwardParams& params, cudaStream_t stream);

}  // namespace flash3::kernels
