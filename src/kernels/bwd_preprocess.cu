// The backward's small memory-bound kernels that need no tile shape: row
// statistics before the main kernel, the sinks' gradient, and zero gradients
// for tensors no score depends on. Generic over head dim (a runtime value here).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/bwd_run.h"
#include "kernels/packed_sequence.cuh"
#include "kernels/tile_config.h"

namespace flash3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

unsigned blocks_for(int64_t items, int per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

// Varlen: the sequence whose padded rows (padded_sequence_start) hold
// workspace row r of a head, by bisection (the starts grow with b); rows
// between sequences go to the one before.
__device__ int sequence_of_row(const int* cu_seqlens_q, const int* seqused_q, int total_q, int max_q,
                               int batch, int block_m, int r) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    PackedSequence const s = packed_sequence(cu_seqlens_q, seqused_q, mid, total_q, max_q);
    if (padded_sequence_start(s, mid, block_m) <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One warp per workspace row (bwd_run.h's layouts): D and lse_log2 (padding
// gets 0 and +inf), and zeros for the row's share of the dQ accumulator
// (and, once per query block, its semaphore), which saves separate memset
// passes. Varlen: lse is (heads, total_q) and cu_seqlens_q is set.
template <class T>
__global__ void bwd_row_stats_kernel(const T* out, const T* dout, Tensor4d out_t, Tensor4d dout_t,
                                     const float* lse, BwdWorkspaceView ws, int batch, int seqlen_q,
                                     int heads, int head_dim, int head_dim_v, int block_m, int64_t rows,
                                     const int* cu_seqlens_q, const int* seqused_q, int total_q) {
  int64_t const row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  int const lane = threadIdx.x % 32;
  if (row >= rows) return;
  int const r = int(row % ws.head_rows);
  int64_t const outer = row / ws.head_rows;  // fixed: batch * heads + head; varlen: head
  int const h = int(outer % heads);
  int b, i;             // the sequence, and the row in it
  int64_t first, lse_row;  // its first row in out / dout (rows), and this row's lse
  if (cu_seqlens_q == nullptr) {
    b = int(outer / heads);
    i = r;
    first = 0;
    lse_row = outer * seqlen_q + i;
  } else {
    b = sequence_of_row(cu_seqlens_q, seqused_q, total_q, seqlen_q, batch, block_m, r);
    PackedSequence const s = packed_sequence(cu_seqlens_q, seqused_q, b, total_q, seqlen_q);
    i = r - padded_sequence_start(s, b, block_m);
    seqlen_q = s.length;
    first = s.offset;
    lse_row = int64_t(h) * total_q + s.offset + i;
    b = 0;  // packed: no batch stride
  }
  float dot = 0.f;
  float lse_log2 = INFINITY;  // padding: P = exp2(s - inf) = 0
  if (i >= 0 && i < seqlen_q) {  // (varlen: rows before the first sequence have i < 0)
    int64_t const t = first + i;
    const T* o = out + b * out_t.stride[0] + t * out_t.stride[1] + h * out_t.stride[2];
    const T* d = dout + b * dout_t.stride[0] + t * dout_t.stride[1] + h * dout_t.stride[2];
    for (int c = lane; c < head_dim_v; c += 32) dot += to_float(o[c]) * to_float(d[c]);
    float const l = lse[lse_row];
    // A row that saw no key has LSE -inf and P = 0 everywhere: +inf gives that.
    lse_log2 = l == -INFINITY ? INFINITY : l * float(M_LOG2E);
  }
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffff, dot, offset);
  if (lane == 0) {
    ws.dpsum[row] = dot;
    ws.lse_log2[row] = lse_log2;
    if (r % block_m == 0) ws.dq_semaphore[row / block_m] = 0;
  }
  float4* accum = reinterpret_cast<float4*>(ws.dq_accum + row * head_dim);
  for (int c = lane; c < head_dim / 4; c += 32) accum[c] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// One CTA per query head: dsinks[h] = -(the main kernel's partials, summed
// over batch and key block, plus P_sink D (1 - P_sink) of every query row:
// bwd_mainloop.cuh says why). Each thread adds its terms in order, then a
// fixed tree: the same bits on every run.
constexpr int kSinkThreads = 256;

// `stat_batches`: batch, or 1 with varlen (its statistics are per head).
__global__ void __launch_bounds__(kSinkThreads)
    bwd_sink_grad_kernel(float* dsinks, const float* sinks, BwdWorkspaceView ws, int batch,
                         int stat_batches, int heads) {
  int const h = blockIdx.x;
  float const sink_log2 = sinks[h] * float(M_LOG2E);
  float sum = 0.f;
  for (int i = threadIdx.x; i < batch * ws.sink_key_blocks; i += kSinkThreads) {
    int const b = i / ws.sink_key_blocks, n = i % ws.sink_key_blocks;
    sum += ws.sink_partials[(int64_t(b) * heads + h) * ws.sink_key_blocks + n];
  }
  for (int64_t i = threadIdx.x; i < int64_t(stat_batches) * ws.head_rows; i += kSinkThreads) {
    int64_t const b = i / ws.head_rows, q = i % ws.head_rows;
    int64_t const row = (b * heads + h) * ws.head_rows + q;
    // Padding has lse +inf (P_sink 0); a row that saw no key, lse = the sink (P_sink 1).
    float const p_sink = exp2f(sink_log2 - ws.lse_log2[row]);
    sum += p_sink * ws.dpsum[row] * (1.f - p_sink);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  __shared__ float warp_sums[kSinkThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kSinkThreads / 32; ++w) total += warp_sums[w];
    dsinks[h] = -total;
  }
}

__global__ void zero_fill_kernel(uint16_t* data, Tensor4d t, int seqlen, int heads, int head_dim,
                                 int64_t elements) {
  int64_t const e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= elements) return;
  int const c = int(e % head_dim);
  int64_t const r = e / head_dim;
  int const h = int(r % heads);
  int const s = int(r / heads % seqlen);
  int const b = int(r / heads / seqlen);
  data[b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + c] = 0;  // +0.0 in fp16 and bf16
}

int stat_batches(const BackwardParams& p) { return p.cu_seqlens_q != nullptr ? 1 : p.batch; }

template <class T>
cudaError_t launch_preprocess(const BackwardParams& p, const BwdWorkspaceView& ws, cudaStream_t stream) {
  int64_t const rows = int64_t(stat_batches(p)) * p.heads_q * ws.head_rows;
  bwd_row_stats_kernel<T><<<blocks_for(rows, kWarpsPerBlock), kThreads, 0, stream>>>(
      static_cast<const T*>(p.out.data), static_cast<const T*>(p.dout.data), p.out, p.dout, p.lse,
      ws, p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.head_dim_v, bwd_tile_config(p.head_dim).block_m, rows,
      p.cu_seqlens_q, p.seqused_q, p.total_q);
  return cudaGetLastError();
}

}  // namespace

cudaError_t run_bwd_preprocess(const BackwardParams& p, const BwdWorkspaceView& ws, cudaStream_t stream) {
  return p.dtype == DType::kBFloat16 ? launch_preprocess<__nv_bfloat16>(p, ws, stream)
                                     : launch_preprocess<__half>(p, ws, stream);
}

cudaError_t run_bwd_sink_grad(const BackwardParams& p, const BwdWorkspaceView& ws, cudaStream_t stream) {
  bwd_sink_grad_kernel<<<p.heads_q, kSinkThreads, 0, stream>>>(p.dsinks, p.sinks, ws, p.batch,
                                                                 stat_batches(p), p.heads_q);
  return cudaGetLastError();
}

cudaError_t run_zero_fill(const Tensor4d& t, int batch, int seqlen, int heads, int head_dim,
                          cudaStream_t stream) {
  int64_t const elements = int64_t(batch) * seqlen * heads * head_dim;
  if (elements == 0) return cudaSuccess;
  zero_fill_kernel<<<blocks_for(elements, kThreads), kThreads, 0, stream>>>(
      static_cast<uint16_t*>(t.data), t, seqlen, heads, head_dim, elements);
  return cudaGetLastError();
}

}  // namespace flash3::kernels
