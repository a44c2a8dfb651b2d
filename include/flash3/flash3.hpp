// flash3 C++ API. Plain structs, a status return, messages via last_error().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flash3 {

enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,
  kUnsupported = 2,
  kCudaError = 3,
  kInternal = 4,
};

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// (batch, seqlen, heads, headdim) view of device memory; strides in elements.
struct Tensor4d {
  void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 1};
};

struct ForwardParams {
  Tensor4d q;    // (batch, seqlen_q, heads_q, head_dim)
  Tensor4d k;    // (batch, seqlen_k, heads_kv, head_dim)
  Tensor4d v;    // (batch, seqlen_k, heads_kv, head_dim)
  Tensor4d out;  // (batch, seqlen_q, heads_q, head_dim)
  float* lse = nullptr;  // optional: (batch, heads_q, seqlen_q) fp32 contiguous
  DType dtype = DType::kBFloat16;
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim)
  bool causal = false;        // bottom-right aligned when seqlen_q != seqlen_k
};

// Validates, then launches on `stream`. Never throws. On failure the message
// is in last_error(). batch == 0 or seqlen_q == 0 is a no-op; seqlen_k == 0
// writes out = 0 and lse = -inf (rows that see no key).
Status forward(const ForwardParams& params, cudaStream_t stream);

// Message of the last failing call on this thread ("" after a success).
const char* last_error();

}  // namespace flash3
