// Seam between the host API and the backward kernels (plain C++, like fwd_run.h).
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// Row statistics and the dQ accumulator, laid out per (batch, head) with the
// query rows padded to whole query blocks, so that every tile's loads and
// atomic adds stay inside the buffers. Carved out of the caller's workspace.
// Varlen: per head, (heads_q, head_rows), sequence b's rows from
// padded_sequence_start (packed_sequence.cuh); rows between sequences are
// padding.
struct BwdWorkspaceView {
  float* lse_log2;    // (batch, heads_q, head_rows): LSE * log2(e); +inf for rows without keys and padding
  float* dpsum;       // (batch, heads_q, head_rows): rowsum(dO * O); 0 for padding
  float* dq_accum;    // (batch, heads_q, head_rows * head_dim): sum of dS K, unscaled; each
                      // query block's tile in the order of dq_accumulator.cuh
  int* dq_semaphore;  // (batch, heads_q, head_rows / block_m): key blocks that have added to dQ
  // With dsinks: (batch, heads_q, sink_key_blocks), each key block's share of
  // sum_j P_sink,j sum_i P_ij (dP_ij - D_j) (written by the main kernel); else null.
  float* sink_partials;
  int head_rows;  // a multiple of block_m
  int sink_key_blocks;
};

// Defined once per (dtype, head dim) in instantiations/bwd_<dtype>_hdim<d>.cu,
// and per (dtype, head dim, V's head dim) in bwd_<dtype>_hdim<d>x<dv>.cu
// (params.head_dim_v = kHeadDimV).
// `params` is validated and resolved; batch, seqlen_q, seqlen_k >= 1; the
// workspace has been prepared by run_bwd_preprocess. Runs the main kernel,
// then writes dq = softmax_scale * dq_accum in the input dtype.
template <DType kDType, int kHeadDim, int kHeadDimV = kHeadDim>
cudaError_t run_bwd(const BackwardParams& params, const BwdWorkspaceView& ws, cudaStream_t stream);

// Writes lse_log2 and dpsum, and zeroes dq_accum and dq_semaphore.
cudaError_t run_bwd_preprocess(const BackwardParams& params, const BwdWorkspaceView& ws,
                               cudaStream_t stream);
// dsinks[h] from the main kernel's partials and the row statistics, in a
// fixed order (after run_bwd).
cudaError_t run_bwd_sink_grad(const BackwardParams& params, const BwdWorkspaceView& ws,
                              cudaStream_t stream);
// Writes zeros into a (batch, seqlen, heads, head_dim) tensor of 16-bit
// elements (gradients of tensors that nothing depends on).
cudaError_t run_zero_fill(const Tensor4d& t, int batch, int seqlen, int heads, int head_dim,
                          cudaStream_t stream);

}  // namespace flash3::kernels
