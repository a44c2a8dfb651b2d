// Host side of one forward instantiation: TMA descriptors, grid, launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <cmath>

#include "kernels/fwd_kernel.cuh"
#include "kernels/launch_common.cuh"
#include "kernels/fwd_run.h"

namespace flash3::kernels {

template <class Traits>
cudaError_t launch_fwd(ForwardParams const& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  float const logit_scale = p.softcap > 0.f ? p.softcap : p.softmax_scale;
  FwdKernelParams<Traits> kp{
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.q, p.batch, p.seqlen_q, p.heads_q),
                    typename Traits::SmemLayoutQ{}, select<0, 2>(typename Traits::TileShape{}), _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.k, p.batch, p.seqlen_k, p.heads_kv),
                    take<0, 2>(typename Traits::SmemLayoutKV{}),
                    select<1, 2>(typename Traits::TileShape{}), _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.v, p.batch, p.seqlen_k, p.heads_kv),
                    take<0, 2>(typename Traits::SmemLayoutKV{}),
                    select<1, 2>(typename Traits::TileShape{}), _1{}),
      static_cast<Element*>(p.out.data),
      p.out.stride[0],
      p.out.stride[1],
      p.out.stride[2],
      p.lse,
      p.batch,
      p.seqlen_q,
      p.seqlen_k,
      p.heads_q,
      p.heads_q / p.heads_kv,
      p.seqlen_k - p.seqlen_q - p.window_left,   // key_lo (unused unless banded)
      p.seqlen_k - p.seqlen_q + p.window_right,  // key_hi
      p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f,
      logit_scale,
      logit_scale * float(M_LOG2E),
      p.sinks,
  };
  auto kernel = fwd_kernel<Traits>;
  constexpr int kSmemBytes = int(sizeof(SharedStorage));
  if (cudaError_t e = allow_shared_memory(kernel, kSmemBytes); e != cudaSuccess) return e;
  dim3 const grid(ceil_div(p.seqlen_q, Traits::kBlockM), p.heads_q, p.batch);
  kernel<<<grid, Traits::kNumThreads, kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

// `params` is resolved (fwd_run.h): a banded mask has window_left >= 0.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd(ForwardParams const& params, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  return params.window_left >= 0
             ? launch_fwd<FwdTraits<Element, kHeadDim, true>>(params, stream)
             : launch_fwd<FwdTraits<Element, kHeadDim, false>>(params, stream);
}

}  // namespace flash3::kernels
