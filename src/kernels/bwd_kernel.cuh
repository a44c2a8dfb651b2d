// The backward kernel: one producer warpgroup feeding two consumer
// warpgroups; one (key block, KV head, batch) tile per CTA. dK and dV are
// written at the end; dQ is added into the fp32 workspace per query block
// (dq_accumulator.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/bwd_mainloop.cuh"
#include "kernels/bwd_traits.cuh"
#include "kernels/fragment_store.cuh"

namespace flash3::kernels {

using namespace cute;

// Warps of the producer warpgroup: warp 0's first thread issues the loads.
enum class ProducerWarp : int { kLoad = 0, kDQWriter = 1 };

template <class Traits, class FragDKV>
CUTE_DEVICE void store_dkv(BwdKernelParams<Traits> const& p, BwdTile tile, int thread, int which,
                           FragDKV& acc, float scale) {
  using Element = typename Traits::Element;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) *= scale;
  Tensor frag = make_tensor<Element>(acc.layout());
  convert_fragment(acc, frag);
  typename Traits::TiledMmaDKV mma_dkv;
  Tensor tc = mma_dkv.get_thread_slice(thread).partition_C(
      make_identity_tensor(Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}));
  Tensor coords = make_tensor(tc.data(), acc_rowcol_layout(tc.layout()));
  int const row0 = tile.n_block * Traits::kBlockN;
  Element* out = (which == 0 ? p.dk : p.dv) + tile.batch * p.dkv_batch_stride[which] +
                 tile.kv_head * p.dkv_head_stride[which] + row0 * p.dkv_row_stride[which];
  store_fragment_rows(as_rowcol(frag), coords, out, p.dkv_row_stride[which], p.seqlen_k - row0);
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kernel(CUTE_GRID_CONSTANT BwdKernelParams<Traits> const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineQ = typename Traits::PipelineQ;
  using Mainloop = BwdMainloop<Traits>;

  extern __shared__ char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  auto const role = WarpGroupRole(cutlass::canonical_warp_group_idx());
  bool const is_producer_thread = threadIdx.x == 0;

  typename PipelineQ::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kQTileBytes + Traits::kRowStatBytes;
  pipeline_params.role = role == WarpGroupRole::kProducer ? PipelineQ::ThreadCategory::Producer
                                                          : PipelineQ::ThreadCategory::Consumer;
  pipeline_params.is_leader = is_producer_thread;
  pipeline_params.num_consumers = Traits::kNumConsumerThreads;
  PipelineQ pipeline_q(smem.pipeline_q, pipeline_params, Shape<_1, _1, _1>{});
  PipelineQ pipeline_do(smem.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});
  if (is_producer_thread) smem.barrier_kv.init(1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  // Derived after setmaxnreg in each branch: values live across it are spilled.
  auto const work = [&] {
    // Deterministic banded adds go from high key blocks to low (DQAccumulator::turn).
    int const n_block = abs(params.n_block_flip - int(blockIdx.x));
    BwdTile const tile{n_block, int(blockIdx.y), int(blockIdx.z)};
    typename Mainloop::Mask const mask{params.seqlen_q, params.seqlen_k, params.key_lo,
                                       params.key_hi};
    int const head_begin = tile.kv_head * params.heads_per_kv_head;
    // Key blocks no query sees (left of every window) still write dK = dV = 0.
    int const m_begin = mask.m_block_begin(tile.n_block);
    int const m_end = max(m_begin, mask.m_block_end(tile.n_block));
    return cute::make_tuple(tile, m_begin, m_end, head_begin, head_begin + params.heads_per_kv_head);
  };

  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    auto const [tile, m_begin, m_end, head_begin, head_end] = work();
    int const warp = cutlass::canonical_warp_idx_sync();
    if (is_producer_thread) {
      Mainloop::load_kv(params, smem, tile);
      auto write = cutlass::make_producer_start_state<PipelineQ>();
      for (int head = head_begin; head < head_end; ++head)
        Mainloop::load_q_do(params, smem, tile, head, m_begin, m_end, pipeline_q, pipeline_do, write);
    } else if (Traits::kDQInSmem && warp == int(ProducerWarp::kDQWriter)) {
      for (int head = head_begin; head < head_end; ++head)
        DQAccumulator<Traits>::writer(params, smem.dq.data(), tile.batch, head, tile.n_block,
                                      m_begin, m_end, head + 1 == head_end);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    auto const [tile, m_begin, m_end, head_begin, head_end] = work();
    int const thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    typename Traits::TiledMmaDKV mma_dkv;
    using TileKV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
    Tensor acc_dk = partition_fragment_C(mma_dkv, TileKV{});
    Tensor acc_dv = partition_fragment_C(mma_dkv, TileKV{});
    clear(acc_dk);
    clear(acc_dv);
    smem.barrier_kv.wait(0);
    typename Traits::PipelineState read;
    int step = 0;
    for (int head = head_begin; head < head_end; ++head)
      Mainloop::compute(params, smem, tile, head, m_begin, m_end, thread, pipeline_q, pipeline_do,
                        read, step, acc_dk, acc_dv);
    store_dkv<Traits>(params, tile, thread, 0, acc_dk, params.softmax_scale);
    store_dkv<Traits>(params, tile, thread, 1, acc_dv, 1.f);
  }
#endif
}

}  // namespace flash3::kernels
