// What a forward kernel receives (by value, __grid_constant__).
#pragma once

#include <cstdint>

namespace flash3::kernels {

template <class Traits>
struct FwdKernelParams {
  using Element = typename Traits::Element;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  Element* out;
  int64_t out_batch_stride;
  int64_t out_row_stride;
  int64_t out_head_stride;
  float* lse;  // (batch, heads_q, seqlen_q) or null
  int batch;
  int seqlen_q;
  int seqlen_k;
  int heads_q;
  int heads_per_kv_head;  // heads_q / heads_kv (GQA group size)
  int key_lo;             // banded kernels: the band (attention_mask.cuh)
  int key_hi;
  // The scores the softmax sees are raw q.k, or with softcap tanh(q.k *
  // softcap_input_scale) (softcap_input_scale = softmax_scale / softcap; 0 =
  // no softcap); times logit_scale (softmax_scale, or softcap) they are logits.
  float softcap_input_scale;
  float logit_scale;
  float scale_log2;       // logit_scale * log2(e)
  float const* sinks;     // (heads_q) logits joining each row's denominator, or null
};

}  // namespace flash3::kernels
