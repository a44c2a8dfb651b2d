// Split-KV combine (flash-decoding's second pass): each split s of a query
// row's keys left a normalized partial output o_s and its log-sum-exp l_s;
// the row's result is sum_s exp(l_s - l) o_s with l = log(sum_s exp(l_s))
// (plus the sink's exp in the sum). Memory-bound and small next to the
// attention pass, so one warp per row with plain coalesced loads suffices.
#include <cuda_runtime_api.h>

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <cmath>
#include <cstdint>

#include "kernels/fwd_combine_run.h"
#include "kernels/packed_sequence.cuh"

namespace flash3::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kLanes = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Registers per lane for split values loaded ahead of their weights.
constexpr int kValueRegisters = 64;

struct CombineKernelParams {
  float const* out_partial;
  int64_t out_partial_stride[5];  // split, batch, row, head, dim
  float const* lse_partial;
  int64_t lse_partial_stride[4];  // split, batch, row, head
  void* out;
  int64_t out_stride[3];          // batch, row, head (dim contiguous)
  float* lse;                     // (batch, heads, seqlen) or null
  float const* sinks;
  int num_splits;
  int seqlen;
  int heads;
  int head_dim;
  int64_t rows;                   // batch * seqlen * heads
  CombineVarlenRows varlen;
};

__device__ float warp_max(float x) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

__device__ float warp_sum(float x) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// One warp per (batch, row, head), heads fastest so that neighbouring warps
// write neighbouring output; lane l holds head-dim elements l, l + 32, ...
// (kPerLane of them). A row's loads are issued together where they can be:
// the values of its first kInFlight splits do not wait for the LSEs, so a
// decode row (<= kInFlight splits) costs one memory latency, not one for
// the LSEs, one per reduction and one per group of values.
template <class Out, int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * kLanes)
    fwd_combine_kernel(CombineKernelParams const p) {
  constexpr int kInFlight = kValueRegisters / kPerLane;
  static_assert(kLanes % kInFlight == 0);
  // Launched programmatically dependent on the attention pass (a no-op
  // otherwise): its partials are complete and visible only after this.
  cudaGridDependencySynchronize();
  int64_t const index = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kLanes;
  if (index >= p.rows) return;
  int const lane = threadIdx.x % kLanes;
  int const head = int(index % p.heads);
  int const row = int(index / p.heads % p.seqlen);
  int const batch = int(index / p.heads / p.seqlen);
  int packed_row = row;  // in out (varlen: packed)
  float* lse_out = p.lse == nullptr ? nullptr : p.lse + (int64_t(batch) * p.heads + head) * p.seqlen + row;
  if (p.varlen.cu_seqlens != nullptr) {
    PackedSequence const s =
        packed_sequence(p.varlen.cu_seqlens, p.varlen.seqused, batch, p.varlen.total, p.seqlen);
    if (row >= s.length) return;
    packed_row = s.offset + row;
    if (lse_out != nullptr) lse_out = p.lse + int64_t(head) * p.varlen.total + packed_row;
  }

  float const* lse_row = p.lse_partial + batch * p.lse_partial_stride[1] +
                         row * p.lse_partial_stride[2] + head * p.lse_partial_stride[3];
  auto split_lse = [&](int s) {
    return s < p.num_splits ? lse_row[s * p.lse_partial_stride[0]] : -INFINITY;
  };
  float const* out_row = p.out_partial + batch * p.out_partial_stride[1] +
                         row * p.out_partial_stride[2] + head * p.out_partial_stride[3];
  float value[kInFlight][kPerLane];
  auto load_values = [&](int first) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      float const* o = out_row + int64_t(first + u) * p.out_partial_stride[0];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        int const d = lane + j * kLanes;
        value[u][j] = first + u < p.num_splits && d < p.head_dim ? o[d] : 0.f;
      }
    }
  };
  float const first_lse = split_lse(lane);  // lane s: split s's, for the first 32
  load_values(0);

  float const sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;
  float row_max = fmaxf(sink, first_lse);
  for (int s = lane + kLanes; s < p.num_splits; s += kLanes) row_max = fmaxf(row_max, split_lse(s));
  row_max = warp_max(row_max);
  Out* out = static_cast<Out*>(p.out) + batch * p.out_stride[0] + packed_row * p.out_stride[1] +
             head * p.out_stride[2];
  if (row_max == -INFINITY) {  // no split saw a key, and no sink
    for (int d = lane; d < p.head_dim; d += kLanes) out[d] = Out(0.f);
    if (lse_out != nullptr && lane == 0) *lse_out = -INFINITY;
    return;
  }
  float sum = expf(first_lse - row_max);
  for (int s = lane + kLanes; s < p.num_splits; s += kLanes) sum += expf(split_lse(s) - row_max);
  sum = warp_sum(sum) + expf(sink - row_max);
  float const lse = row_max + logf(sum);

  float acc[kPerLane] = {};
  for (int first = 0; first < p.num_splits; first += kLanes) {
    float const my_weight = expf((first == 0 ? first_lse : split_lse(first + lane)) - lse);
    for (int group = first; group < min(first + kLanes, p.num_splits); group += kInFlight) {
      if (group > 0) load_values(group);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        float const weight = __shfl_sync(kFullMask, my_weight, group - first + u);
        // A split with no weight (one that saw no key) adds nothing, whatever
        // it holds: no 0 * NaN.
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) acc[j] += weight != 0.f ? weight * value[u][j] : 0.f;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    int const d = lane + j * kLanes;
    if (d < p.head_dim) out[d] = Out(acc[j]);
  }
  if (lse_out != nullptr && lane == 0) *lse_out = lse;
}

template <class Out, int kPerLane>
cudaError_t launch(CombineKernelParams const& kp, cudaStream_t stream) {
  auto const blocks = static_cast<unsigned>((kp.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  // Its launch overlaps the tail of the kernel before it in the stream,
  // where that kernel triggers early (the KV-cache pass does).
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kWarpsPerBlock * kLanes);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, fwd_combine_kernel<Out, kPerLane>, kp);
}

// Fewer elements per lane, more splits in flight.
template <class Out>
cudaError_t launch_by_head_dim(CombineKernelParams const& kp, cudaStream_t stream) {
  static_assert(kCombineMaxHeadDim == 8 * kLanes);
  if (kp.head_dim <= 2 * kLanes) return launch<Out, 2>(kp, stream);
  if (kp.head_dim <= 4 * kLanes) return launch<Out, 4>(kp, stream);
  return launch<Out, 8>(kp, stream);
}

}  // namespace

cudaError_t run_combine(CombineParams const& p, cudaStream_t stream, CombineVarlenRows const& varlen) {
  CombineKernelParams kp{};
  kp.out_partial = p.out_partial;
  for (int i = 0; i < 5; ++i) kp.out_partial_stride[i] = p.out_partial_stride[i];
  kp.lse_partial = p.lse_partial;
  for (int i = 0; i < 4; ++i) kp.lse_partial_stride[i] = p.lse_partial_stride[i];
  kp.out = p.out.data;
  for (int i = 0; i < 3; ++i) kp.out_stride[i] = p.out.stride[i];
  kp.lse = p.lse;
  kp.sinks = p.sinks;
  kp.num_splits = p.num_splits;
  kp.seqlen = p.seqlen;
  kp.heads = p.heads;
  kp.head_dim = p.head_dim;
  kp.rows = int64_t(p.batch) * p.seqlen * p.heads;
  kp.varlen = varlen;
  switch (p.out_dtype) {
    case DType::kBFloat16: return launch_by_head_dim<cutlass::bfloat16_t>(kp, stream);
    case DType::kFloat16: return launch_by_head_dim<cutlass::half_t>(kp, stream);
    case DType::kFloat32: return launch_by_head_dim<float>(kp, stream);
    case DType::kFloat8E4M3: break;
  }
  return cudaErrorInvalidValue;  // validation admits only the three above
}

}  // namespace flash3::kernels
