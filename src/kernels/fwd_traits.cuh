// Compile-time shape of one forward kernel: tiles, shared-memory layouts,
// WGMMA atoms, TMA copy types, pipelines and warp roles.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <type_traits>

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

// K-major shared-memory atom for rows of kKElems elements: 128-byte swizzle
// when a row fills it (every 16-bit tile; fp8 rows of 128 keys or more), else
// 64-byte (fp8 at head dim 64).
template <class Element, int kKElems>
using KMajorSmemAtom = std::conditional_t<(kKElems * sizeof(Element)) % 128 == 0,
                                          GMMA::Layout_K_SW128_Atom<Element>,
                                          GMMA::Layout_K_SW64_Atom<Element>>;

// V^T as the second GEMM reads it, (head_dim, keys, stage). 16-bit: the same
// bytes as the (keys, head_dim) V tile, read MN-major; TMA loads V.
template <class Element, int kHeadDim, int kBlockN, int kStages, class SmemLayoutV,
          bool kFp8 = sizeof(Element) == 1>
struct FwdVtLayout {
  using Smem = decltype(composition(
      SmemLayoutV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using LoadSmem = SmemLayoutV;
  using LoadBox = Shape<Int<kBlockN>, Int<kHeadDim>>;
  template <class GmemTensorKV>
  using Gmem = GmemTensorKV;
};

// FP8 WGMMA takes only K-major B: V arrives transposed in global memory,
// (head_dim, padded keys, heads, batch) with keys contiguous
// (fp8_quantize.cu), and TMA loads it into its own K-major tile.
template <class Element, int kHeadDim, int kBlockN, int kStages, class SmemLayoutV>
struct FwdVtLayout<Element, kHeadDim, kBlockN, kStages, SmemLayoutV, true> {
  using Smem = decltype(tile_to_shape(KMajorSmemAtom<Element, kBlockN>{},
                                      Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}));
  static_assert(cosize_v<Smem> == cosize_v<SmemLayoutV>);
  using LoadSmem = Smem;
  using LoadBox = Shape<Int<kHeadDim>, Int<kBlockN>>;
  template <class GmemTensorKV>
  using Gmem = decltype(make_tensor(
      make_gmem_ptr(static_cast<Element const*>(nullptr)),
      Layout<Shape<Int<kHeadDim>, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>{}));
};

// Element: bf16 / fp16, or e4m3 (FP8: output bf16, V read as V^T, block
// scales; fwd_kernel_params.cuh). kBanded: causal or sliding-window mask
// (attention_mask.cuh). kVarlen: packed sequences of different lengths (fwd_kernel_params.cuh); always
// banded, since each sequence's mask bounds are relative to its own lengths
// (full attention is the band no row reaches the edge of). kKvCache: K / V
// from a cache (per-batch key ranges, batch index, page table) and split-KV
// (fwd_kernel_params.cuh); banded for the same reason as varlen.
// kHeadDimV: V's and O's head dim where it differs from Q's and K's
// (DeepSeek's (192, 128)); 16-bit, not with a KV cache.
template <class Element_, int kHeadDim_, bool kBanded_, bool kVarlen_ = false,
          bool kKvCache_ = false, int kHeadDimV_ = kHeadDim_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr bool kBanded = kBanded_;
  static constexpr bool kVarlen = kVarlen_;
  static constexpr bool kKvCache = kKvCache_;
  static_assert(kBanded || !kVarlen, "varlen kernels take the mask as a band");
  static_assert(kBanded || !kKvCache, "KV-cache kernels take the mask as a band");
  static_assert(!(kVarlen && kKvCache), "a KV cache is read from unpacked k and v (varlen q is a run-time switch)");
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using OutElement = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  static_assert(!(kFp8 && kVarlen), "FP8 kernels take fixed-length batches");
  static_assert(!(kFp8 && kKvCache), "FP8 kernels read no KV cache");
  static_assert(kHeadDimV == kHeadDim || !(kFp8 || kKvCache),
                "only 16-bit kernels without a KV cache take a separate V head dim");
  static constexpr FwdTileConfig kTile = kKvCache ? fwd_kvcache_tile_config(kHeadDim)
                                                 : fwd_tile_config(kHeadDim, kFp8, kHeadDimV);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.kv_stages;
  // FP8: P = 2^8 p in e4m3 (online_softmax.cuh).
  static constexpr int kSoftmaxMaxOffset = kFp8 ? 8 : 0;

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
  using TileShapeV = Shape<Int<kBlockN>, Int<kHeadDimV>>;              // one V block
  using TileShapeO = Shape<Int<kBlockM>, Int<kHeadDimV>>;
  using ConsumerAtoms = Layout<Shape<Int<kNumConsumerWarpgroups>, _1, _1>>;

  // S = Q K^T: both operands K-major in shared memory.
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      ConsumerAtoms{}));
  // O += P V: P from registers, V^T from shared memory (FwdVtLayout).
  static constexpr GMMA::Major kVtMajor = kFp8 ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>,
                           GMMA::Major::K, kVtMajor>(),
      ConsumerAtoms{}));

  // Rows fill whole 64-byte swizzle rows at least (d = 96: 192 bytes).
  static_assert(kHeadDim * sizeof(Element) % 64 == 0 && kHeadDimV * sizeof(Element) % 64 == 0);
  using SmemAtom = KMajorSmemAtom<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  // K's stages. V has its own, the same layout unless kHeadDimV differs (so
  // the KV-cache kernel's page boxes, cut from this one, serve both).
  using SmemLayoutKV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(KMajorSmemAtom<Element, kHeadDimV>{},
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  using VtLayout = FwdVtLayout<Element, kHeadDimV, kBlockN, kStages, SmemLayoutV>;
  using SmemLayoutVt = typename VtLayout::Smem;

  // Global tensors as TMA sees them: (seqlen, head_dim, heads, batch).
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <int kCols>
  using GmemRows = decltype(make_tensor(
      make_gmem_ptr(static_cast<Element const*>(nullptr)),
      Layout<Shape<int32_t, Int<kCols>, int32_t, int32_t>, GmemStride>{}));
  using GmemTensor = GmemRows<kHeadDim>;
  using GmemTensorVRows = GmemRows<kHeadDimV>;

  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      select<0, 2>(TileShape{}), _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{}),
                                       select<1, 2>(TileShape{}), _1{}));
  // Paged KV: a key block is loaded as boxes of kPageBoxRows rows, each from
  // its own page, so any page size that is a multiple of it works (a box
  // never straddles pages). A box is rows [r, r + kPageBoxRows) of a stage's
  // K / V tile: starting on a whole 128-byte swizzle atom (8 rows), it has the
  // tile's own layout. (Pages holding whole key blocks skip the boxes: one
  // TMA per block, FwdMainloop::whole_blocks_per_page.)
  static constexpr int kPageBoxRows = 16;
  static_assert(kBlockN % kPageBoxRows == 0);
  using PageBoxShape = Shape<Int<kPageBoxRows>, Int<kHeadDim>>;
  using SmemLayoutPageBox = decltype(composition(
      take<0, 2>(SmemLayoutKV{}), Layout<PageBoxShape, Stride<_1, Int<kBlockN>>>{}));
  using TmaKVPage = std::conditional_t<
      kKvCache,
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutPageBox{}, PageBoxShape{}, _1{})),
      cute::tuple<>>;
  using GmemTensorV = typename VtLayout::template Gmem<GmemTensorVRows>;
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{},
                                      take<0, 2>(typename VtLayout::LoadSmem{}),
                                      typename VtLayout::LoadBox{}, _1{}));

  static constexpr uint32_t kQBytes = sizeof(Element) * size(SmemLayoutQ{});
  static constexpr uint32_t kKStageBytes = sizeof(Element) * size(take<0, 2>(SmemLayoutKV{}));
  static constexpr uint32_t kVStageBytes = sizeof(Element) * size(take<0, 2>(SmemLayoutV{}));

  // K and V have separate pipelines so S = Q K^T can start before V lands.
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename PipelineKV::PipelineState;

  struct SharedStorage {
    // 128-byte swizzled tiles must start on 1024-byte boundaries.
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    // The consumers are done reading Q: the producer may load the next tile's.
    cutlass::arch::ClusterBarrier barrier_q_free;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "exceeds Hopper's shared memory per block");
};

}  // namespace flash3::kernels
