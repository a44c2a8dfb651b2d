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

// which: 0 for dK (TiledMma = TiledMmaDK, Tile = TileK), 1 for dV.
template <class Traits, class TiledMma, class Tile, class FragDKV>
CUTE_DEVICE void store_dkv(BwdKernelParams<Traits> const& p, BwdTile tile, int thread, int which,
                           FragDKV& acc, float scale) {
  using Element = typename Traits::Element;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) *= scale;
  Tensor frag = make_tensor<Element>(acc.layout());
  convert_fragment(acc, frag);
  Tensor tc = TiledMma{}.get_thread_slice(thread).partition_C(make_identity_tensor(Tile{}));
  Tensor coords = make_tensor(tc.data(), acc_rowcol_layout(tc.layout()));
  int const row0 = tile.n_block * Traits::kBlockN;
  Element* out = (which == 0 ? p.dk : p.dv) + tile.batch * p.dkv_batch_stride[which] +
                 tile.kv_head * p.dkv_head_stride[which] +
                 (tile.offset_k + row0) * p.dkv_row_stride[which];
  store_fragment_rows(as_rowcol(frag), coords, out, p.dkv_row_stride[which],
                      BwdMainloop<Traits>::seqlen_k(p, tile) - row0);
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
  pipeline_params.transaction_bytes = Traits::kDOTileBytes + Traits::kRowStatBytes;
  PipelineQ pipeline_do(smem.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});
  if (is_producer_thread) {
    smem.barrier_kv.init(1);
    if constexpr (Traits::kVarlen) {
      BwdTile const tile = Mainloop::make_tile(params, 0, 0, int(blockIdx.z));
      smem.sequence_lengths[0] = tile.seqlen_q;
      smem.sequence_lengths[1] = tile.seqlen_k;
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  // Derived after setmaxnreg in each branch: values live across it are spilled.
  auto const work = [&] {
    // Deterministic banded adds go from high key blocks to low (DQAccumulator::turn).
    int const n_block = abs(params.n_block_flip - int(blockIdx.x));
    BwdTile const tile = Mainloop::make_tile(params, n_block, int(blockIdx.y), int(blockIdx.z));
    auto const mask = Mainloop::make_mask(params, tile);
    int const head_begin = tile.kv_head * params.heads_per_kv_head;
    // Key blocks no query sees (left of every window) still write dK = dV = 0.
    // Varlen: the grid covers the longest sequence; the others' surplus key
    // blocks see no query (and store no rows).
    int const m_begin = mask.m_block_begin(tile.n_block);
    bool const past_keys = Traits::kVarlen && tile.n_block * Traits::kBlockN >= tile.seqlen_k;
    int const m_end = past_keys ? m_begin : max(m_begin, mask.m_block_end(tile.n_block));
    return cute::make_tuple(tile, mask, m_begin, m_end, head_begin,
                            head_begin + params.heads_per_kv_head);
  };
  // Each head derives its work again (varlen: cu_seqlens re-read, a few
  // cached loads per head) so nothing of it lives across the head loop: held
  // there, d = 128's sequence bounds spilled in both roles.
  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    int const warp = cutlass::canonical_warp_idx_sync();
    if (is_producer_thread) {
      Mainloop::load_kv(params, smem, get<0>(work()));
      auto write = cutlass::make_producer_start_state<PipelineQ>();
      for (int i = 0; i < params.heads_per_kv_head; ++i) {
        auto const [tile, mask, m_begin, m_end, head_begin, head_end] = work();
        Mainloop::load_q_do(params, smem, tile, head_begin + i, m_begin, m_end, pipeline_q, pipeline_do,
                            write);
      }
    } else if (Traits::kDQInSmem && warp == int(ProducerWarp::kDQWriter)) {
      for (int i = 0; i < params.heads_per_kv_head; ++i) {
        auto const [tile, mask, m_begin, m_end, head_begin, head_end] = work();
        DQAccumulator<Traits>::writer(params, mask, smem.dq.data(),
                                      Mainloop::stats_row(params, tile, head_begin + i), tile.n_block,
                                      m_begin, m_end, head_begin + i + 1 == head_end);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    int const thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    using TiledMmaDK = typename Traits::TiledMmaDK;
    using TiledMmaDV = typename Traits::TiledMmaDV;
    Tensor acc_dk = partition_fragment_C(TiledMmaDK{}, typename Traits::TileK{});
    Tensor acc_dv = partition_fragment_C(TiledMmaDV{}, typename Traits::TileV{});
    clear(acc_dk);
    clear(acc_dv);
    smem.barrier_kv.wait(0);
    typename Traits::PipelineState read;
    int step = 0;
    for (int i = 0; i < params.heads_per_kv_head; ++i) {
      auto const [tile, mask, m_begin, m_end, head_begin, head_end] = work();
      Mainloop::compute(params, smem, tile, head_begin + i, m_begin, m_end, thread, pipeline_q,
                        pipeline_do, read, step, acc_dk, acc_dv);
    }
    BwdTile const tile = get<0>(work());
    store_dkv<Traits, TiledMmaDK, typename Traits::TileK>(params, tile, thread, 0, acc_dk,
                                                           params.softmax_scale);
    store_dkv<Traits, TiledMmaDV, typename Traits::TileV>(params, tile, thread, 1, acc_dv, 1.f);
  }
#endif
}

// dq = softmax_scale * (the accumulated tile), in the input dtype. One CTA of
// kNumConsumerThreads per (query block, head, batch): thread t reads the
// values consumer thread t added and writes them where its fragment lies.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNumConsumerThreads)
    bwd_dq_convert_kernel(CUTE_GRID_CONSTANT BwdKernelParams<Traits> const p, typename Traits::Element* dq,
                          int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  using Accumulator = DQAccumulator<Traits>;
  using Element = typename Traits::Element;
  using TileQ = typename Traits::TileQ;
  using Mainloop = BwdMainloop<Traits>;
  int const m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  BwdTile const seq = Mainloop::make_tile(p, 0, 0, batch);
  int const row0 = m_block * Traits::kBlockM;
  int const rows = Mainloop::seqlen_q(p, seq) - row0;
  if (rows <= 0) return;  // varlen: the grid covers the longest sequence
  int const thread = threadIdx.x;
  typename Traits::TiledMmaDQ mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, TileQ{});
  float* tile = Accumulator::global_tile(p, Mainloop::stats_row(p, seq, head), m_block);
  CUTE_UNROLL
  for (int c = 0; c < Accumulator::kValues / 4; ++c) {
    float4 const v = *Accumulator::chunk(tile, thread, c);
    acc(4 * c) = v.x * p.softmax_scale;
    acc(4 * c + 1) = v.y * p.softmax_scale;
    acc(4 * c + 2) = v.z * p.softmax_scale;
    acc(4 * c + 3) = v.w * p.softmax_scale;
  }
  Tensor out = make_tensor<Element>(acc.layout());
  convert_fragment(acc, out);
  Tensor tc = mma_dq.get_thread_slice(thread).partition_C(make_identity_tensor(TileQ{}));
  Tensor coords = make_tensor(tc.data(), acc_rowcol_layout(tc.layout()));
  store_fragment_rows(as_rowcol(out), coords,
                      dq + batch * batch_stride + head * head_stride + (seq.offset_q + row0) * row_stride,
                      row_stride, rows);
}

}  // namespace flash3::kernels
