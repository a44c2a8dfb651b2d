// Compile-time shape of one backward kernel: tiles, shared-memory layouts,
// WGMMA atoms for the five GEMMs, TMA copy types, pipelines.
//
// A CTA keeps one block of keys (K, V) resident and walks the query blocks.
// Per query block the two consumer warpgroups compute, in the transposed
// orientation (keys as rows, so that P^T and dS^T are accumulators with the
// key dimension as M):
//   S^T = K Q^T, dP^T = V dO^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T - D)
//   dV += P^T dO, dK += dS^T Q, dQ (+)= dS K  (atomically into fp32 memory)
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/fwd_traits.cuh"
#include "kernels/tile_config.h"

namespace flash3::kernels {

using namespace cute;

// The widest K-major swizzle atom (16-bit elements) whose width divides
// `kColumns`: a tile that a GEMM later reads MN-major in slices of kColumns
// must not cut a swizzle atom (d = 96's dQ reads K in slices of 48).
template <class Element, int kColumns>
using SmemAtomForColumns = std::conditional_t<
    kColumns % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<kColumns % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                       GMMA::Layout_K_SW32_Atom<Element>>>;

// The same bytes as `Layout` (rows, cols[, stage]) seen as (cols, rows[, stage]).
template <class Layout, class Shape2d>
using TransposedView = decltype(composition(
    Layout{}, make_ordered_layout(Shape2d{}, Step<_2, _1, _3>{})));

// kBanded: causal or sliding-window mask (attention_mask.cuh). kVarlen:
// packed sequences (BwdKernelParams), always banded as in the forward.
// kHeadDimV: V's, O's (and dO's, dV's) head dim, as in FwdTraits.
template <class Element_, int kHeadDim_, bool kBanded_, bool kVarlen_ = false,
          int kHeadDimV_ = kHeadDim_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr bool kBanded = kBanded_;
  static constexpr bool kVarlen = kVarlen_;
  static_assert(kBanded || !kVarlen, "varlen kernels take the mask as a band");
  static constexpr BwdTileConfig kTile = bwd_tile_config(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.q_stages;

  static constexpr int kNumConsumerWarpgroups = 2;
  static constexpr int kNumConsumerThreads = kNumConsumerWarpgroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kNumThreads = kNumConsumerThreads + cutlass::NumThreadsPerWarpGroup;
  // The launch gives every thread 168 registers (64512 for 384 threads);
  // setmaxnreg only moves them between warpgroups: 24 + 2 x 240 = 3 x 168.
  // The producer's loops (loads, dQ writer) fit in 24 when not unrolled,
  // except d = 64 banded, whose loops also keep the band's query-block range
  // (ptxas: 12 bytes spilled at 24, none at 32). d = 64 consumers hold half
  // of d = 128's dK / dV accumulators: no spills at 232 (32 + 2 x 232 <= 3 x 168).
  static constexpr int kProducerRegisters = kHeadDim == 64 ? 32 : 24;
  static constexpr int kConsumerRegisters = kHeadDim == 64 ? 232 : 240;

  // S^T / dP^T: split over keys when there are 64 per warpgroup, else over queries.
  static constexpr int kSdPWarpgroupsM = kBlockN / 64;
  static constexpr int kSdPWarpgroupsN = kNumConsumerWarpgroups / kSdPWarpgroupsM;
  static_assert(kSdPWarpgroupsM * kSdPWarpgroupsN == kNumConsumerWarpgroups);
  // Split over keys, a warpgroup's P^T and dS^T rows are exactly the rows of
  // its dV and dK: they feed those GEMMs from registers.
  static constexpr bool kDKVFromRegisters = kSdPWarpgroupsM == kNumConsumerWarpgroups;

  // (The same atoms for both: their K, Q's or V's head dim, is walked in steps of 16.)
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kBlockM / kSdPWarpgroupsN>, Int<kHeadDim>>>(),
      Layout<Shape<Int<kSdPWarpgroupsM>, Int<kSdPWarpgroupsN>, _1>>{}));

  // dK += dS^T Q and dV += P^T dO: M = keys, N = kColumns (Q's or V's head
  // dim: all of it per warpgroup, or half at d > 128), K = queries.
  template <int kColumns>
  static constexpr int kColumnsPerWarpgroup = kDKVFromRegisters ? kColumns : kColumns / kNumConsumerWarpgroups;
  template <int kColumns>
  using TiledMmaGrad = std::conditional_t<
      kDKVFromRegisters,
      decltype(make_tiled_mma(
          GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kColumns>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          Layout<Shape<Int<kNumConsumerWarpgroups>, _1, _1>>{})),
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float,
                               Shape<_64, Int<kColumnsPerWarpgroup<kColumns>>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          Layout<Shape<_1, Int<kNumConsumerWarpgroups>, _1>>{}))>;
  using TiledMmaDK = TiledMmaGrad<kHeadDim>;
  using TiledMmaDV = TiledMmaGrad<kHeadDimV>;

  // dQ = dS K: M = queries, N = head dim (split between the warpgroups), K = keys.
  static constexpr int kDQColumnsPerWarpgroup = kHeadDim / kNumConsumerWarpgroups;
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kDQColumnsPerWarpgroup>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kNumConsumerWarpgroups>, _1>>{}));

  static_assert(kBlockM == 64);
  // Q and dO: (queries, head dim, stage); read K-major by S^T / dP^T and
  // MN-major (head dim as N) in slices of kColumnsPerWarpgroup by dK / dV.
  template <int kColumns>
  using SmemLayoutRows = decltype(tile_to_shape(SmemAtomForColumns<Element, kColumnsPerWarpgroup<kColumns>>{},
                                                Shape<Int<kBlockM>, Int<kColumns>, Int<kStages>>{}));
  using SmemLayoutQ = SmemLayoutRows<kHeadDim>;
  using SmemLayoutQt = TransposedView<SmemLayoutQ, Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>>;
  using SmemLayoutdO = SmemLayoutRows<kHeadDimV>;
  using SmemLayoutdOt = TransposedView<SmemLayoutdO, Shape<Int<kHeadDimV>, Int<kBlockM>, Int<kStages>>>;
  // K: (keys, head dim); dQ reads it MN-major in slices of kDQColumnsPerWarpgroup.
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomForColumns<Element, kDQColumnsPerWarpgroup>{},
                                             Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = TransposedView<SmemLayoutK, Shape<Int<kHeadDim>, Int<kBlockN>, _1>>;
  // V: (keys, V's head dim), read K-major only (dP^T).
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomForColumns<Element, kHeadDimV>{},
                                             Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  // dS^T (and P^T when they go through shared memory): (keys, queries,
  // buffer), double-buffered so one barrier per step orders writers and readers.
  static constexpr int kDSBuffers = 2;
  using SmemLayoutPdS = decltype(tile_to_shape(SmemAtomForColumns<Element, kBlockM>{},
                                               Shape<Int<kBlockN>, Int<kBlockM>, Int<kDSBuffers>>{}));
  using SmemLayoutPdSt = TransposedView<SmemLayoutPdS, Shape<Int<kBlockM>, Int<kBlockN>, Int<kDSBuffers>>>;

  template <int kCols>
  using GmemRows = typename FwdTraits<Element, kHeadDim, kBanded>::template GmemRows<kCols>;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileDO = Shape<Int<kBlockM>, Int<kHeadDimV>>;
  using TileK = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileV = Shape<Int<kBlockN>, Int<kHeadDimV>>;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemRows<kHeadDim>{}, take<0, 2>(SmemLayoutQ{}),
                                      TileQ{}, _1{}));
  using TmaDO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemRows<kHeadDimV>{}, take<0, 2>(SmemLayoutdO{}),
                                       TileDO{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemRows<kHeadDim>{}, SmemLayoutK{}, TileK{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemRows<kHeadDimV>{}, SmemLayoutV{}, TileV{}, _1{}));

  // The dQ tile goes through shared memory to a bulk reduce where it fits
  // (dq_accumulator.cuh): d = 192 then takes 225 KB, and its backward ran
  // 1.3-1.5x faster than with float4 atomics (docs/performance.md); d = 256
  // uses all 227 KB without it.
  static constexpr bool kDQInSmem = kHeadDim <= 192;

  static constexpr uint32_t kQTileBytes = sizeof(Element) * size(take<0, 2>(SmemLayoutQ{}));
  static constexpr uint32_t kDOTileBytes = sizeof(Element) * size(take<0, 2>(SmemLayoutdO{}));
  static constexpr uint32_t kRowStatBytes = sizeof(float) * kBlockM;
  static constexpr uint32_t kKVBytes = sizeof(Element) * kBlockN * (kHeadDim + kHeadDimV);

  // One pipeline for Q (+ its LSE), one for dO (+ its D = rowsum(dO * O)).
  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename PipelineQ::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutPdS>, 1024> ds;
    cute::array_aligned<Element, kDKVFromRegisters ? 1 : cute::cosize_v<SmemLayoutPdS>, 1024> p;
    cute::array_aligned<float, kDQInSmem ? kBlockM * kHeadDim : 1, 128> dq;
    cute::array_aligned<float, kBlockM * kStages, 128> lse_log2;
    cute::array_aligned<float, kBlockM * kStages, 128> dpsum;
    float sink_sums[kNumConsumerThreads / 32];  // one per consumer warp (BwdMainloop::write_sink_partial)
    int sequence_lengths[2];  // varlen: this CTA's seqlen_q, seqlen_k (BwdMainloop::step_mask)
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineQ::SharedStorage pipeline_do;
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "exceeds Hopper's shared memory per block");
};

}  // namespace flash3::kernels
