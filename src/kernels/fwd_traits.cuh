// Compile-time shape of one forward kernel: tiles, shared-memory layouts,
// WGMMA atoms, TMA copy types, pipelines and warp roles.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/tile_config.h"

// Schedule switches of the forward mainloop; compile-time so that the
// ablation in docs/performance.md can build each variant (CMake options
// FLASH3_FWD_PINGPONG / FLASH3_FWD_OVERLAP). The shipped kernel overlaps but
// does not ping-pong: as built now, ping-pong measured 10 % slower (d = 128,
// s = 8k; docs/performance.md).
#ifndef FLASH3_FWD_PINGPONG
#define FLASH3_FWD_PINGPONG 0
#endif
#ifndef FLASH3_FWD_OVERLAP
#define FLASH3_FWD_OVERLAP 1
#endif

namespace flash3::kernels {

using namespace cute;

enum class WarpGroupRole : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// kBanded: causal or sliding-window mask (attention_mask.cuh). kVarlen:
// packed sequences of different lengths (fwd_kernel_params.cuh); always
// banded, since each sequence's mask bounds are relative to its own lengths
// (full attention is the band no row reaches the edge of).
template <class Element_, int kHeadDim_, bool kBanded_, bool kVarlen_ = false>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kBanded = kBanded_;
  static constexpr bool kVarlen = kVarlen_;
  static_assert(kBanded || !kVarlen, "varlen kernels take the mask as a band");
  static constexpr FwdTileConfig kTile = fwd_tile_config(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.kv_stages;

  static constexpr bool kPingPong = FLASH3_FWD_PINGPONG;
  static constexpr bool kIntraWarpgroupOverlap = FLASH3_FWD_OVERLAP;

  static constexpr int kNumConsumerWarpgroups = 2;
  static constexpr int kNumConsumerThreads = kNumConsumerWarpgroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kNumThreads = kNumConsumerThreads + cutlass::NumThreadsPerWarpGroup;
  static_assert(kBlockM == 64 * kNumConsumerWarpgroups, "each consumer warpgroup owns 64 query rows");
  // 24 + 2 x 240 registers x 128 threads fills the 64K register file; the
  // producer only issues TMA and needs almost none.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, D)
  using ConsumerAtoms = Layout<Shape<Int<kNumConsumerWarpgroups>, _1, _1>>;

  // S = Q K^T: both operands K-major in shared memory.
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      ConsumerAtoms{}));
  // O += P V: P from registers, V^T is MN-major (head_dim contiguous).
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      ConsumerAtoms{}));

  // Every supported head dim is a multiple of 64 elements = one 128-byte swizzle row.
  static_assert(kHeadDim % 64 == 0);
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // The same V bytes seen as (head_dim, keys, stage) for the second GEMM.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Global tensors as TMA sees them: (seqlen, head_dim, heads, batch).
  using GmemShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemLayout = Layout<GmemShape, GmemStride>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}));

  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      select<0, 2>(TileShape{}), _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{}),
                                       select<1, 2>(TileShape{}), _1{}));

  static constexpr uint32_t kQBytes = sizeof(Element) * size(SmemLayoutQ{});
  static constexpr uint32_t kKVStageBytes = sizeof(Element) * size(take<0, 2>(SmemLayoutKV{}));

  // K and V have separate pipelines so S = Q K^T can start before V lands.
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename PipelineKV::PipelineState;

  struct SharedStorage {
    // 128-byte swizzled tiles must start on 1024-byte boundaries.
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    // The consumers are done reading Q: the producer may load the next tile's.
    cutlass::arch::ClusterBarrier barrier_q_free;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "exceeds Hopper's shared memory per block");
};

}  // namespace flash3::kernels
