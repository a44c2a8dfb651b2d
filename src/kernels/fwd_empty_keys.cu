// seqlen_k == 0: every query row sees no key, so out = 0 and lse = -inf (the
// sink's logit with sinks: all the row's weight is on the sink).
// TMA cannot describe an empty tensor, hence this plain kernel.
#include <cmath>
#include <cstdint>

#include "kernels/fwd_run.h"

namespace flash3::kernels {
namespace {

// One thread per (batch, row, head) writes its head_dim elements of 16 bits.
__global__ void fwd_empty_keys_kernel(uint16_t* out, int64_t stride_b, int64_t stride_s,
                                      int64_t stride_h, float* lse, const float* sinks,
                                      int batch, int seqlen_q, int heads, int head_dim) {
  int64_t const i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(batch) * seqlen_q * heads) return;
  int const h = int(i % heads);
  int const s = int(i / heads % seqlen_q);
  int const b = int(i / heads / seqlen_q);
  uint16_t* row = out + b * stride_b + s * stride_s + h * stride_h;
  for (int d = 0; d < head_dim; ++d) row[d] = 0;  // +0.0 in fp16 and bf16
  if (lse != nullptr)
    lse[(int64_t(b) * heads + h) * seqlen_q + s] = sinks != nullptr ? sinks[h] : -INFINITY;
}

}  // namespace

cudaError_t run_fwd_empty_keys(ForwardParams const& p, cudaStream_t stream) {
  int64_t const rows = int64_t(p.batch) * p.seqlen_q * p.heads_q;
  constexpr int kThreads = 256;
  auto const blocks = static_cast<unsigned>((rows + kThreads - 1) / kThreads);
  fwd_empty_keys_kernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<uint16_t*>(p.out.data), p.out.stride[0], p.out.stride[1], p.out.stride[2],
      p.lse, p.sinks, p.batch, p.seqlen_q, p.heads_q, p.head_dim_v);
  return cudaGetLastError();
}

}  // namespace flash3::kernels
