// Host side of one forward instantiation: TMA descriptors, grid, launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/fwd_kernel.cuh"
#include "kernels/launch_common.cuh"
#include "kernels/pack_gqa.h"
#include "kernels/fwd_run.h"
#include "kernels/split_kv.h"

namespace flash3::kernels {

// Full attention (the only kernels with a persistent variant) runs a
// persistent grid (fwd_tile_scheduler.cuh) where it measured faster: over
// at most 2k keys, where each tile is a few key blocks and hiding the next
// tile's loads under the epilogue gains 1-22 % (most at s <= 1k;
// docs/performance.md, 2026-12-04). Longer full attention measured 1-5 %
// slower, and causal 1-30 % slower (its tiles differ in cost, which the
// static walk does not balance and the hardware's hand-out does); varlen's
// empty and uneven tiles likewise keep one CTA per tile.
inline bool persistent_fwd_grid(ForwardParams const& p) {
  constexpr int kMaxPersistentKeys = 2048;
  return p.seqlen_k <= kMaxPersistentKeys;
}

inline Fp8ScaleView fp8_scale_view(Fp8Scale const& s) {
  return {s.data, s.stride[0], s.stride[1], s.stride[2]};
}

// V's TMA: the V tile, or FP8's V^T (flash3.hpp: ForwardParams).
template <class Traits>
typename Traits::TmaV make_tma_copy_v(ForwardParams const& p, int tma_batch, int rows_k) {
  // (16-bit: tma_batch and rows_k are K's and V's.)
  if constexpr (Traits::kFp8) {
    static_assert(Traits::kBlockM == kFp8ScaleBlock && Traits::kBlockN == kFp8ScaleBlock,
                  "an FP8 tile is one block of the scales");
    using Element = typename Traits::Element;
    auto const vt = make_tensor(
        make_gmem_ptr(static_cast<Element const*>(p.v.data)),
        make_layout(make_shape(Int<Traits::kHeadDim>{}, int32_t(fp8_vt_keys(p.seqlen_k)),
                               int32_t(p.heads_kv), int32_t(tma_batch)),
                    make_stride(p.v.stride[1], _1{}, p.v.stride[2], p.v.stride[0])));
    return make_tma_copy(SM90_TMA_LOAD{}, vt, take<0, 2>(typename Traits::VtLayout::LoadSmem{}),
                         Shape<Int<Traits::kHeadDim>, Int<Traits::kBlockN>>{}, _1{});
  } else {
    return make_tma_copy(SM90_TMA_LOAD{},
                         gmem_tensor<Traits, Traits::kHeadDimV>(p.v, tma_batch, rows_k, p.heads_kv),
                         take<0, 2>(typename Traits::SmemLayoutV{}), typename Traits::TileShapeV{}, _1{});
  }
}

template <class Traits>
cudaError_t launch_fwd(ForwardParams const& p, cudaStream_t stream) {
  using SharedStorage = typename Traits::SharedStorage;
  constexpr bool kVarlen = Traits::kVarlen;
  constexpr bool kKvCache = Traits::kKvCache;
  // KV cache: tiles of PackGQA's rows, queries times `pack` heads.
  int const pack =
      kKvCache ? pack_gqa_factor(p.seqlen_q, p.heads_q / p.heads_kv, Traits::kBlockM, p.pack_gqa) : 1;
  int const m_blocks = int(ceil_div(int64_t{p.seqlen_q} * pack, Traits::kBlockM));
  int const splits = kKvCache ? p.num_splits : 1;
  int64_t const tiles = int64_t{m_blocks} * (p.heads_q / pack) * p.batch * splits;
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  float const logit_scale = p.softcap > 0.f ? p.softcap : p.softmax_scale;
  // Varlen: TMA sees the packed tensors as one batch entry of total rows, and
  // the band is relative to each sequence (fwd_kernel_params.cuh); a KV
  // cache's band is relative to each batch entry's keys, and K / V have
  // cache_batch entries (pages, when paged, of page_size rows). Varlen q
  // over a cache packs q and out only.
  bool const packed_q = p.cu_seqlens_q != nullptr;
  int const rows_q = packed_q ? p.total_q : p.seqlen_q;
  int const tma_batch_q = packed_q ? 1 : p.batch;
  int const rows_k = kVarlen ? p.total_k : p.seqlen_k;
  int const tma_batch = kVarlen ? 1 : p.batch;
  int const tma_batch_kv = kKvCache ? p.cache_batch : tma_batch;
  // Paged: these descriptors go unused (load_paged_block), but describe the pages.
  int const rows_kv = kKvCache && p.page_table != nullptr ? p.page_size : rows_k;
  int const diagonal = kVarlen || kKvCache ? 0 : p.seqlen_k - p.seqlen_q;
  FwdKernelParams<Traits> kp{
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.q, tma_batch_q, rows_q, p.heads_q),
                    typename Traits::SmemLayoutQ{}, select<0, 2>(typename Traits::TileShape{}), _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(p.k, tma_batch_kv, rows_kv, p.heads_kv),
                    take<0, 2>(typename Traits::SmemLayoutKV{}),
                    select<1, 2>(typename Traits::TileShape{}), _1{}),
      make_tma_copy_v<Traits>(p, tma_batch_kv, rows_kv),
      static_cast<typename Traits::OutElement*>(p.out.data),
      packed_q ? 0 : p.out.stride[0],
      p.out.stride[1],
      p.out.stride[2],
      p.lse,
      p.batch,
      p.seqlen_q,
      p.seqlen_k,
      p.heads_q,
      p.heads_q / p.heads_kv,
      m_blocks,
      int(tiles),
      diagonal - p.window_left,   // key_lo (unused unless banded)
      diagonal + p.window_right,  // key_hi
      p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f,
      logit_scale * float(M_LOG2E),
      p.sinks,
      p.alibi_slopes,
      p.alibi_slopes_batch_stride,
      1.f / logit_scale,
      p.cu_seqlens_q,
      p.cu_seqlens_k,
      p.seqused_q,
      p.seqused_k,
      p.total_q,
      p.total_k,
      fp8_scale_view(p.q_scale),
      fp8_scale_view(p.k_scale),
      fp8_scale_view(p.v_scale),
      int(fp8_vt_keys(p.seqlen_k)),
      nullptr,  // KV cache and split-KV: set below
      nullptr,
      0,
      nullptr,
      0,
      0,
      {},
      {},
      pack,
      {},
      splits,
      nullptr,
      nullptr,
      0,  // append: set below
      {},
      {},
      {},
      {},
      {},
      false,
  };
  if constexpr (kKvCache) {
    kp.kv_batch_idx = p.kv_batch_idx;
    kp.leftpad_k = p.leftpad_k;
    kp.cache_batch = p.cache_batch;
    kp.page_table = p.page_table;
    kp.page_table_stride = p.page_table_stride;
    kp.page_size = p.page_size;
    using Element = typename Traits::Element;
    kp.q = strided_rows<Element const>(p.q);
    if (packed_q) kp.q.batch_stride = 0;  // (a C caller's stride[0] is ignored)
    if (p.seqlen_new > 0) {
      kp.seqlen_new = p.seqlen_new;
      kp.k_new = strided_rows<Element const>(p.k_new);
      kp.v_new = strided_rows<Element const>(p.v_new);
      kp.k_cache = strided_rows<Element>(p.k);
      kp.v_cache = strided_rows<Element>(p.v);
      if (p.rotary_dim > 0) {
        kp.rotary = {static_cast<Element const*>(p.rotary_cos), static_cast<Element const*>(p.rotary_sin),
                     p.rotary_dim, p.rotary_seqlen, p.rotary_interleaved};
        kp.rotary_q_per_row = p.rotary_q_per_row;
      }
    }
    if (p.page_table != nullptr) {
      auto const page_box = [&](Tensor4d const& t) {
        return make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Traits>(t, p.cache_batch, p.page_size, p.heads_kv),
                             typename Traits::SmemLayoutPageBox{}, typename Traits::PageBoxShape{}, _1{});
      };
      kp.tma_k_page = page_box(p.k);
      kp.tma_v_page = page_box(p.v);
    }
    if (splits > 1) {
      SplitWorkspace const w =
          split_workspace(p.workspace, splits, p.batch, p.heads_q, p.seqlen_q, Traits::kHeadDim);
      kp.o_partial = w.o;
      kp.lse_partial = w.lse;
    }
  }
  constexpr int kSmemBytes = int(sizeof(SharedStorage));
  if constexpr (!Traits::kBanded) {
    if (persistent_fwd_grid(p)) {
      constexpr auto kernel = fwd_kernel<Traits, true>;
      if (cudaError_t e = allow_shared_memory<kernel>(kSmemBytes); e != cudaSuccess) return e;
      int sms = 0;
      if (cudaError_t e = multiprocessor_count(&sms); e != cudaSuccess) return e;
      kernel<<<int(std::min<int64_t>(tiles, sms)), Traits::kNumThreads, kSmemBytes, stream>>>(kp);
      return cudaGetLastError();
    }
  }
  constexpr auto kernel = fwd_kernel<Traits, false>;
  if (cudaError_t e = allow_shared_memory<kernel>(kSmemBytes); e != cudaSuccess) return e;
  kernel<<<int(tiles), Traits::kNumThreads, kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

// `params` is resolved (fwd_run.h): a banded mask has window_left >= 0, and
// varlen is always banded.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_kvcache(ForwardParams const& params, cudaStream_t stream) {
  return launch_fwd<FwdTraits<ElementOf<kDType>, kHeadDim, true, false, true>>(params, stream);
}

template <DType kDType, int kHeadDim, int kHeadDimV>
cudaError_t run_fwd(ForwardParams const& params, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  if constexpr (kDType != DType::kFloat8E4M3) {  // FP8 has no varlen kernel (validated)
    if (params.cu_seqlens_q != nullptr)
      return launch_fwd<FwdTraits<Element, kHeadDim, true, true, false, kHeadDimV>>(params, stream);
  }
  return params.window_left >= 0
             ? launch_fwd<FwdTraits<Element, kHeadDim, true, false, false, kHeadDimV>>(params, stream)
             : launch_fwd<FwdTraits<Element, kHeadDim, false, false, false, kHeadDimV>>(params, stream);
}

}  // namespace flash3::kernels
