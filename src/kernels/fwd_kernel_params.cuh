// What a forward kernel receives (by value, __grid_constant__).
#pragma once

#include <cstdint>

#include "kernels/rotary.cuh"

namespace flash3::kernels {

// Rows of a (batch, rows, heads, head_dim) tensor with unit stride along
// head_dim; `batch` counts pages for a paged cache.
template <class T>
struct StridedRows {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  __host__ __device__ T* row(int batch, int row, int head) const {
    return data + batch * batch_stride + row * row_stride + head * head_stride;
  }
};

// FP8 dequantization scales of one tensor, indexed (batch, head, block of
// kFp8ScaleBlock rows); a per-tensor or per-head descale has block stride 0.
struct Fp8ScaleView {
  float const* data;
  int64_t batch_stride;
  int64_t head_stride;
  int64_t block_stride;

  __host__ __device__ float operator()(int batch, int head, int block) const {
    return data[batch * batch_stride + head * head_stride + block * block_stride];
  }
};

template <class Traits>
struct FwdKernelParams {
  using OutElement = typename Traits::OutElement;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaV tma_v;  // FP8: loads V^T
  OutElement* out;
  int64_t out_batch_stride;
  int64_t out_row_stride;
  int64_t out_head_stride;
  float* lse;  // (batch, heads_q, seqlen_q), with varlen (heads_q, total_q); or null
  int batch;
  int seqlen_q;
  int seqlen_k;
  int heads_q;
  int heads_per_kv_head;  // heads_q / heads_kv (GQA group size)
  int m_blocks;           // query blocks per (head, batch entry) of the grid
  int num_tiles;          // m_blocks * heads_q * batch (fwd_tile_scheduler.cuh)
  // Banded kernels: the band (attention_mask.cuh). Varlen: relative to each
  // sequence, which adds its seqlen_k - seqlen_q.
  int key_lo;
  int key_hi;
  // The scores the softmax sees are raw q.k, or with softcap tanh(q.k *
  // softcap_input_scale) (softcap_input_scale = softmax_scale / softcap; 0 =
  // no softcap); times softmax_scale (or softcap) they are logits.
  float softcap_input_scale;
  float scale_log2;       // softmax_scale (or softcap) * log2(e)
  float const* sinks;     // (heads_q) logits joining each row's denominator, or null
  // ALiBi (flash3.hpp), or null: the slope of (b, h) is alibi_slopes[b *
  // alibi_batch_stride + h]; alibi_score_scale (1 / softmax_scale, or 1 /
  // softcap) takes the logit bias into the units of the scores above.
  float const* alibi_slopes;
  int64_t alibi_batch_stride;
  float alibi_score_scale;
  // Varlen (Traits::kVarlen; else null but for the KV cache's below): sequence b is rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed q and out (only the
  // first seqused_q[b] of them when given), keys likewise; batch is the
  // number of sequences, seqlen_q / seqlen_k the longest. TMA sees the packed
  // tensors as one batch entry of total_q / total_k rows. KV cache:
  // cu_seqlens_q (and seqused_q) may be set, varlen q over the cache: q,
  // out and lse packed, cu_seqlens_k null (seqused_k: see below).
  int const* cu_seqlens_q;
  int const* cu_seqlens_k;
  int const* seqused_q;
  int const* seqused_k;
  int total_q;
  int total_k;
  // FP8 only: q.k^T and P V are in quantized units; the true values are
  // times q_scale(b, h, m_block) * k_scale(b, kv_head, n_block), and
  // v_scale(b, kv_head, n_block). vt_keys: V^T's padded key extent.
  Fp8ScaleView q_scale;
  Fp8ScaleView k_scale;
  Fp8ScaleView v_scale;
  int vt_keys;
  // KV cache (Traits::kKvCache; flash3.hpp ForwardParams): batch entry b
  // reads cache entry kv_batch_idx[b] (or b), keys [leftpad_k[b],
  // seqused_k[b]) of seqlen_k; K / V's TMA batch extent is cache_batch.
  // Paged (page_table set): tma_k_page / tma_v_page load boxes of
  // kPageBoxRows rows from pages (page_size, head_dim, heads_kv, cache_batch).
  int const* kv_batch_idx;
  int const* leftpad_k;
  int cache_batch;
  int const* page_table;
  int64_t page_table_stride;
  int page_size;
  typename Traits::TmaKVPage tma_k_page;
  typename Traits::TmaKVPage tma_v_page;
  // PackGQA (kKvCache, pack_gqa.h): a tile's rows are its seqlen_q queries
  // times `pack` heads (1: unpacked); m_blocks counts packed blocks and the
  // scheduler heads_q / pack head groups. The consumers gather Q from q
  // (batch, seqlen_q, heads_q, head_dim) themselves: a packed tile's rows
  // are not one TMA box.
  int pack;
  StridedRows<typename Traits::Element const> q;
  // Split-KV (kKvCache): num_splits > 1 writes each split's normalized
  // output and LSE (without the sink) to o_partial (split, batch, heads_q,
  // seqlen_q, head_dim) and lse_partial (split, batch, heads_q, seqlen_q),
  // fp32, for the combine kernel.
  int num_splits;
  float* o_partial;
  float* lse_partial;
  // Append (kKvCache, seqlen_new > 0): batch entry b's rows of k_new / v_new
  // (batch, seqlen_new, heads_kv, head_dim) become keys [cached, cached +
  // seqlen_new) of its cache (cached = seqused_k[b], the keys before this
  // call; rows past seqlen_k are dropped), written by the kernel before it
  // reads them (FwdMainloop::append_kv), and the tile's keys end there. With
  // rotary (rotary.cos set) the new keys' and q's first rotary.dim values
  // rotate: new key i at position cached + i, query row i at cached + i when
  // rotary_q_per_row (causal or windowed, FA's rule), else all at cached.
  // Varlen q: k_new / v_new are packed like q (one entry of total_q rows),
  // sequence b's new keys its query rows, and seqlen_new is seqlen_q.
  int seqlen_new;
  StridedRows<typename Traits::Element const> k_new;
  StridedRows<typename Traits::Element const> v_new;
  StridedRows<typename Traits::Element> k_cache;  // (cache_batch or pages, rows, heads_kv)
  StridedRows<typename Traits::Element> v_cache;
  Rotary<typename Traits::Element> rotary;
  bool rotary_q_per_row;
};

}  // namespace flash3::kernels
