// The forward kernel: one producer warpgroup feeding two consumer warpgroups
// through TMA pipelines, over the (query block, head, batch) tiles the
// scheduler gives the CTA. The K / V pipeline states run on across tiles.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/fwd_epilogue.cuh"
#include "kernels/fwd_mainloop.cuh"
#include "kernels/fwd_tile_scheduler.cuh"
#include "kernels/fwd_traits.cuh"
#include "kernels/online_softmax.cuh"

namespace flash3::kernels {

using namespace cute;

// kPersistent: a grid smaller than the tile count (fwd_launch.cuh); without
// it each CTA runs one tile and the tile loop compiles away.
template <class Traits, bool kPersistent>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    fwd_kernel(CUTE_GRID_CONSTANT FwdKernelParams<Traits> const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineKV = typename Traits::PipelineKV;
  using Mainloop = FwdMainloop<Traits>;

  extern __shared__ char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  auto const role = WarpGroupRole(cutlass::canonical_warp_group_idx());
  // KV cache: one thread issues K's copies, one of the next warp V's (a
  // paged block is up to 16 copies each, which one thread issues too slowly
  // to keep the pipeline full).
  bool const is_producer_thread = threadIdx.x == 0;
  bool const is_v_producer_thread =
      threadIdx.x == (Traits::kKvCache ? cutlass::NumThreadsPerWarp : 0);

  typename PipelineKV::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kKStageBytes;
  pipeline_params.role = role == WarpGroupRole::kProducer
                             ? PipelineKV::ThreadCategory::Producer
                             : PipelineKV::ThreadCategory::Consumer;
  pipeline_params.is_leader = is_producer_thread;
  pipeline_params.num_consumers = Traits::kNumConsumerThreads;
  PipelineKV pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  pipeline_params.is_leader = is_v_producer_thread;
  pipeline_params.transaction_bytes = Traits::kVStageBytes;
  PipelineKV pipeline_v(smem.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  if (is_producer_thread) {
    smem.barrier_q.init(1);
    smem.barrier_q_free.init(Traits::kNumConsumerThreads);
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  // Split-KV's combine kernel is launched programmatically dependent on this
  // one: it may start (and wait, in griddepcontrol.wait, for this grid to
  // finish and flush) while these CTAs still run, instead of after a launch gap.
  if constexpr (Traits::kKvCache) cudaTriggerProgrammaticLaunchCompletion();

  // Tile t's work: derived inside each role's loop, after setmaxnreg (values
  // live across it are spilled). Both roles skip the same tiles and count the
  // same Q loads, which gives the Q barriers' phases.
  // (KV cache: the scheduler's heads are PackGQA's groups of `pack`.)
  FwdTileScheduler<kPersistent, Traits::kKvCache> const scheduler{
      params.m_blocks, Traits::kKvCache ? params.heads_q / params.pack : params.heads_q,
      params.num_tiles, params.num_splits};
  auto const work = [&](int t) {
    FwdTileIndex const index = scheduler(t);
    FwdTile const tile =
        Mainloop::make_tile(params, index.m_block, index.head, index.batch, index.split);
    auto const mask = Mainloop::make_mask(params, tile);
    int n_block_begin = mask.n_block_begin(tile.m_block);
    int n_block_end = mask.n_block_end(tile.m_block);
    if constexpr (Traits::kKvCache) {  // split-KV: an equal share of the tile's key blocks
      int const per_split = ceil_div(max(n_block_end - n_block_begin, 0), params.num_splits);
      n_block_begin += tile.split * per_split;
      n_block_end = min(n_block_end, n_block_begin + per_split);
    }
    return cute::make_tuple(tile, n_block_begin, n_block_end);
  };
  // Varlen (q): the grid covers the longest sequence; the others' surplus
  // blocks have no rows (KV cache: PackGQA's rows are queries times pack).
  auto const has_rows = [&params](FwdTile const& tile) {
    if constexpr (Traits::kVarlen) return tile.m_block * Traits::kBlockM < tile.seqlen_q;
    if constexpr (Traits::kKvCache) return tile.m_block * Traits::kBlockM < tile.seqlen_q * params.pack;
    return true;
  };

  // Append (KV cache): the consumers write the new keys into the cache, and
  // the producer's loading warps wait for them (kAppended) first. One
  // barrier phase per CTA: a KV-cache (banded) grid runs one tile per CTA,
  // whose consumers arrive whether or not it has rows (varlen q: seqlen_q,
  // the longest sequence, sizes every sequence's grid).
  static_assert(!(Traits::kKvCache && (kPersistent || Traits::kVarlen)));
  bool const appends = Traits::kKvCache && params.seqlen_new > 0;

  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    // (The warp index is a shuffle: asked by the whole warpgroup. Outside the
    // tile loop, which would hold more than the producer's registers.)
    if (appends && cutlass::canonical_warp_idx_sync() < Mainloop::kLoadingWarps)
      cutlass::arch::NamedBarrier::sync(Mainloop::kAppendedThreads,
                                        uint32_t(FwdNamedBarrier::kAppended));
    if (!is_producer_thread && !is_v_producer_thread) return;
    auto write = cutlass::make_producer_start_state<PipelineKV>();
    int q_loads = 0;
    for (int t = scheduler.first(); !scheduler.done(t); t = scheduler.next(t)) {
      auto const [tile, n_block_begin, n_block_end] = work(t);
      // Rows that see no key need no loads; the consumers write 0 and -inf.
      if (!has_rows(tile) || n_block_begin >= n_block_end) continue;
      // (KV cache: the consumers gather Q themselves; FwdMainloop::gather_q.)
      if (!Traits::kKvCache && q_loads > 0) smem.barrier_q_free.wait((q_loads - 1) & 1);
      Mainloop::load(params, smem, tile, n_block_begin, n_block_end, pipeline_k, pipeline_v,
                     write, is_producer_thread, is_v_producer_thread);
      ++q_loads;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    int const thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    typename Traits::PipelineState read_k, read_v;
    int q_loads = 0;
    for (int t = scheduler.first(); !scheduler.done(t); t = scheduler.next(t)) {
      auto const [tile, n_block_begin, n_block_end] = work(t);
      if (!has_rows(tile)) {
        if (appends) Mainloop::appended();
        continue;
      }
      typename Traits::TiledMmaO mma_o;
      Tensor acc_o = partition_fragment_C(mma_o, typename Traits::TileShapeO{});
      clear(acc_o);
      constexpr int kRows = decltype(size<0>(acc_rowcol_layout(acc_o.layout())))::value;
      OnlineSoftmax<kRows, Traits::kSoftmaxMaxOffset> softmax;
      float o_units = 1.f;  // what acc_o is in units of (FwdMainloop::compute)
      if (appends) Mainloop::append_kv(params, tile, n_block_begin, n_block_end, thread);
      if (n_block_begin < n_block_end) {
        o_units = Mainloop::compute(params, smem, tile, n_block_begin, n_block_end, thread,
                                    q_loads & 1, pipeline_k, pipeline_v, read_k, read_v, acc_o,
                                    softmax);
        ++q_loads;
      }
      FwdEpilogue<Traits>::store(params, tile, thread, acc_o, softmax, o_units);
    }
  }
#endif
}

}  // namespace flash3::kernels
