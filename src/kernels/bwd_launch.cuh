// Host side of one backward instantiation: TMA descriptors, grid, launch of
// the main kernel and of the dQ conversion (the row statistics kernel is
// generic over head dims, in bwd_preprocess.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>

#include <cmath>

#include "kernels/bwd_kernel.cuh"
#include "kernels/bwd_run.h"
#include "kernels/launch_common.cuh"

namespace flash3::kernels {

template <class Traits>
cudaError_t launch_bwd(BackwardParams const& p, BwdWorkspaceView const& ws, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kDv = Traits::kHeadDimV;
  constexpr bool kVarlen = Traits::kVarlen;
  // Varlen as in launch_fwd: one batch entry of packed rows, bands relative to each sequence.
  int const rows_q = kVarlen ? p.total_q : p.seqlen_q;
  int const rows_k = kVarlen ? p.total_k : p.seqlen_k;
  int const tma_batch = kVarlen ? 1 : p.batch;
  int const diagonal = kVarlen ? 0 : p.seqlen_k - p.seqlen_q;
  BwdKernelParams<Traits> kp{
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.q, tma_batch, rows_q, p.heads_q),
                    take<0, 2>(typename Traits::SmemLayoutQ{}), typename Traits::TileQ{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits, kDv>(p.dout, tma_batch, rows_q, p.heads_q),
                    take<0, 2>(typename Traits::SmemLayoutdO{}), typename Traits::TileDO{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.k, tma_batch, rows_k, p.heads_kv),
                    typename Traits::SmemLayoutK{}, typename Traits::TileK{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits, kDv>(p.v, tma_batch, rows_k, p.heads_kv),
                    typename Traits::SmemLayoutV{}, typename Traits::TileV{}, _1{}),
      static_cast<Element*>(p.dk.data),
      static_cast<Element*>(p.dv.data),
      {kVarlen ? 0 : p.dk.stride[0], kVarlen ? 0 : p.dv.stride[0]},
      {p.dk.stride[1], p.dv.stride[1]},
      {p.dk.stride[2], p.dv.stride[2]},
      ws,
      p.batch,
      p.seqlen_q,
      p.seqlen_k,
      p.heads_q,
      p.heads_q / p.heads_kv,
      diagonal - p.window_left,   // key_lo (unused unless banded)
      diagonal + p.window_right,  // key_hi
      p.softmax_scale,
      p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f,
      (p.softcap > 0.f ? p.softcap : p.softmax_scale) * float(M_LOG2E),
      p.deterministic,
      Traits::kBanded && p.deterministic ? ceil_div(p.seqlen_k, Traits::kBlockN) - 1 : 0,
      p.dsinks != nullptr ? p.sinks : nullptr,
      p.alibi_slopes,
      p.alibi_slopes_batch_stride,
      p.cu_seqlens_q,
      p.cu_seqlens_k,
      p.seqused_q,
      p.seqused_k,
      p.total_q,
      p.total_k,
  };
  auto kernel = bwd_kernel<Traits>;
  constexpr int kSmemBytes = int(sizeof(typename Traits::SharedStorage));
  if (cudaError_t e = allow_shared_memory<bwd_kernel<Traits>>(kSmemBytes); e != cudaSuccess) return e;
  // Key blocks vary fastest: in deterministic mode a CTA waits only on CTAs
  // of the same head that were dispatched before it (DQAccumulator::turn).
  dim3 const grid(ceil_div(p.seqlen_k, Traits::kBlockN), p.heads_kv, p.batch);
  kernel<<<grid, Traits::kNumThreads, kSmemBytes, stream>>>(kp);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  dim3 const convert_grid(ceil_div(p.seqlen_q, Traits::kBlockM), p.heads_q, p.batch);
  bwd_dq_convert_kernel<Traits><<<convert_grid, Traits::kNumConsumerThreads, 0, stream>>>(
      kp, static_cast<Element*>(p.dq.data), kVarlen ? 0 : p.dq.stride[0], p.dq.stride[1], p.dq.stride[2]);
  return cudaGetLastError();
}

// `params` is resolved like the forward's (fwd_run.h): banded iff
// window_left >= 0, and varlen is always banded.
template <DType kDType, int kHeadDim, int kHeadDimV>
cudaError_t run_bwd(BackwardParams const& params, BwdWorkspaceView const& ws, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  if (params.cu_seqlens_q != nullptr)
    return launch_bwd<BwdTraits<Element, kHeadDim, true, true, kHeadDimV>>(params, ws, stream);
  return params.window_left >= 0
             ? launch_bwd<BwdTraits<Element, kHeadDim, true, false, kHeadDimV>>(params, ws, stream)
             : launch_bwd<BwdTraits<Element, kHeadDim, false, false, kHeadDimV>>(params, ws, stream);
}

}  // namespace flash3::kernels
