// What the backward kernels receive (by value, __grid_constant__).
#pragma once

#include <cstdint>

#include "kernels/bwd_run.h"

namespace flash3::kernels {

template <class Traits>
struct BwdKernelParams {
  using Element = typename Traits::Element;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaDO tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  Element* dk;
  Element* dv;
  int64_t dkv_batch_stride[2];  // dk, dv
  int64_t dkv_row_stride[2];
  int64_t dkv_head_stride[2];
  BwdWorkspaceView ws;
  int batch;
  int seqlen_q;
  int seqlen_k;
  int heads_q;
  int heads_per_kv_head;
  int key_lo;                  // banded kernels: the band (attention_mask.cuh)
  int key_hi;
  float softmax_scale;         // dK and dQ are softmax_scale * (dS^T Q, dS K)
  float softcap_input_scale;   // as in FwdKernelParams (0: no softcap)
  float scale_log2;            // logit scale (softmax_scale, or softcap) * log2(e)
  bool deterministic;
  // CTA x works on key block |n_block_flip - x|: 0, or the last key block to
  // launch in reverse (deterministic banded, DQAccumulator::turn).
  int n_block_flip;
  // With the sinks' gradient: (heads_q) sink logits, and the kernel writes
  // each (batch, head, key block)'s share of sum_j P_sink,j sum_i P_ij
  // (dP_ij - D_j) to ws.sink_partials (bwd_mainloop.cuh). Null otherwise.
  float const* sinks;
  // ALiBi (flash3.hpp), or null: the slope of (b, h) is alibi_slopes[b *
  // alibi_batch_stride + h].
  float const* alibi_slopes;
  int64_t alibi_batch_stride;
  // Varlen (Traits::kVarlen; null otherwise), as in FwdKernelParams: batch
  // sequences, seqlen_q / seqlen_k the longest; TMA sees the packed tensors
  // as one batch entry; the band is relative to each sequence.
  int const* cu_seqlens_q;
  int const* cu_seqlens_k;
  int const* seqused_q;
  int const* seqused_k;
  int total_q;
  int total_k;
};

}  // namespace flash3::kernels
