// The forward kernel: one producer warpgroup feeding two consumer warpgroups
// through TMA pipelines, one (query block, head, batch) tile per CTA.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/fwd_epilogue.cuh"
#include "kernels/fwd_mainloop.cuh"
#include "kernels/fwd_traits.cuh"
#include "kernels/online_softmax.cuh"

namespace flash3::kernels {

using namespace cute;

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    fwd_kernel(CUTE_GRID_CONSTANT FwdKernelParams<Traits> const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineKV = typename Traits::PipelineKV;
  using Mainloop = FwdMainloop<Traits>;

  extern __shared__ char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  auto const role = WarpGroupRole(cutlass::canonical_warp_group_idx());
  bool const is_producer_thread = threadIdx.x == 0;

  typename PipelineKV::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kKVStageBytes;
  pipeline_params.role = role == WarpGroupRole::kProducer
                             ? PipelineKV::ThreadCategory::Producer
                             : PipelineKV::ThreadCategory::Consumer;
  pipeline_params.is_leader = is_producer_thread;
  pipeline_params.num_consumers = Traits::kNumConsumerThreads;
  PipelineKV pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  PipelineKV pipeline_v(smem.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  if (is_producer_thread) smem.barrier_q.init(1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  // Derived after setmaxnreg in each branch: values live across it are spilled.
  auto const work = [&] {
    // Heavy causal tiles (the last query blocks) first.
    FwdTile const tile = Mainloop::make_tile(params, int(gridDim.x - 1 - blockIdx.x),
                                             int(blockIdx.y), int(blockIdx.z));
    auto const mask = Mainloop::make_mask(params, tile);
    return cute::make_tuple(tile, mask.n_block_begin(tile.m_block), mask.n_block_end(tile.m_block));
  };
  // Varlen: the grid covers the longest sequence; the others' surplus blocks
  // have no rows (the whole CTA leaves, before any barrier is used).
  if constexpr (Traits::kVarlen) {
    FwdTile const tile = get<0>(work());
    if (tile.m_block * Traits::kBlockM >= tile.seqlen_q) return;
  }

  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    auto const [tile, n_block_begin, n_block_end] = work();
    bool const sees_keys = n_block_begin < n_block_end;
    // Rows that see no key need no loads; the consumers write 0 and -inf.
    if (is_producer_thread && sees_keys) {
      auto write = cutlass::make_producer_start_state<PipelineKV>();
      Mainloop::load(params, smem, tile, n_block_begin, n_block_end, pipeline_k, pipeline_v,
                     write);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    auto const [tile, n_block_begin, n_block_end] = work();
    bool const sees_keys = n_block_begin < n_block_end;
    int const thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    typename Traits::TiledMmaO mma_o;
    Tensor acc_o = partition_fragment_C(mma_o, select<0, 2>(typename Traits::TileShape{}));
    clear(acc_o);
    constexpr int kRows = decltype(size<0>(acc_rowcol_layout(acc_o.layout())))::value;
    OnlineSoftmax<kRows> softmax(params.scale_log2);
    if (sees_keys) {
      typename Traits::PipelineState read_k, read_v;
      Mainloop::compute(params, smem, tile, n_block_begin, n_block_end, thread, pipeline_k,
                        pipeline_v, read_k, read_v, acc_o, softmax);
    }
    FwdEpilogue<Traits>::store(params, tile, thread, acc_o, softmax);
  }
#endif
}

}  // namespace flash3::kernels
