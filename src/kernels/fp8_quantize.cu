// FP8 quantization for the FP8 forward: bf16 / fp16 q, k, v -> e4m3 with one
// scale per block of kFp8ScaleBlock rows of one head (or one per tensor),
// optionally rotating q and k by diag(signs) H / sqrt(d) first (incoherent
// processing, FA3 paper section 3.3: H is orthogonal up to that factor, so q
// k^T is unchanged while outliers spread over all dims). V is written as the
// FP8 forward reads it: V^T with keys contiguous, in the permuted order of
// fp8_vt_key_position. Memory-bound: each CTA reads one block once.
#include <cuda_runtime_api.h>

#include <cutlass/array.h>
#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/half.h>
#include <cutlass/numeric_conversion.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/fp8_quantize_run.h"

namespace flash3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlockRows = kFp8ScaleBlock;
// Warp w holds rows 16w .. 16w + 15: for V that is one group of the key
// permutation, so each thread assembles whole permuted 16-byte runs.
constexpr int kRowsPerWarp = kBlockRows / kWarps;
static_assert(kRowsPerWarp == 16);
constexpr float kE4m3Max = 448.f;

// kOwn: each block's scale from its own amax (per-block scaling). Per-tensor
// scaling runs kAmaxOnly, then fp8_tensor_scale_kernel turns the block
// scales into the tensor's, then kGiven quantizes with them.
enum class ScalePass { kOwn, kAmaxOnly, kGiven };

struct QuantizeJob {
  const void* in;
  int64_t in_stride[3];  // batch, row, head (elements)
  void* out;
  // q, k: batch, row, head; v (transpose): batch, head, head_dim row (bytes)
  int64_t out_stride[3];
  float* scale;  // (batch, heads, blocks) contiguous; null: scale 1 (no output)
  int heads;
  int rows;
  int blocks;
  bool rotate;     // multiply rows by diag(signs) H / sqrt(head_dim)
  bool transpose;  // write V^T in the FP8 forward's key order
};

constexpr int kJobs = 3;
struct QuantizeKernelParams {
  QuantizeJob job[kJobs];
  int job_ctas[kJobs];  // batch * heads * blocks, 0 for a job not run
  const float* signs;   // (head_dim) +-1
};

template <int kN>
using FloatArray = cutlass::Array<float, kN>;

// One vector store of kN elements (the destination is aligned to its size).
template <class T, int kN>
__device__ void store_vector(T* dst, cutlass::Array<T, kN> const& v) {
  cutlass::AlignedArray<T, kN> aligned;
  static_cast<cutlass::Array<T, kN>&>(aligned) = v;
  *reinterpret_cast<cutlass::AlignedArray<T, kN>*>(dst) = aligned;
}

// In-place Walsh-Hadamard transform of one row spread over the warp: lane l
// holds elements l * kPerLane .. + kPerLane - 1. Strides below kPerLane pair
// elements of one thread; larger ones pair lanes.
template <int kPerLane>
__device__ void walsh_hadamard(float (&x)[kPerLane], int lane) {
  CUTLASS_PRAGMA_UNROLL
  for (int s = 1; s < kPerLane; s *= 2) {
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kPerLane; ++e) {
      if (e & s) continue;
      float const a = x[e], b = x[e + s];
      x[e] = a + b;
      x[e + s] = a - b;
    }
  }
  CUTLASS_PRAGMA_UNROLL
  for (int lane_stride = 1; lane_stride < 32; lane_stride *= 2) {
    bool const upper = lane & lane_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kPerLane; ++e) {
      float const other = __shfl_xor_sync(0xffffffff, x[e], lane_stride);
      x[e] = upper ? other - x[e] : x[e] + other;
    }
  }
}

template <class In, int kHeadDim, ScalePass kPass>
__global__ void __launch_bounds__(kThreads)
    fp8_quantize_kernel(__grid_constant__ QuantizeKernelParams const p) {
  constexpr int kPerLane = kHeadDim / 32;
  // V^T staging: a row per head dim, 16 bytes of padding against bank conflicts.
  constexpr int kTileRowBytes = kBlockRows + 16;
  __shared__ float warp_amax[kWarps];
  __shared__ alignas(16) uint8_t vt_tile[kHeadDim][kTileRowBytes];

  int cta = blockIdx.x;
  int j = 0;
  while (j < kJobs - 1 && cta >= p.job_ctas[j]) cta -= p.job_ctas[j++];
  QuantizeJob const& job = p.job[j];
  int const block = cta % job.blocks;
  int const head = cta / job.blocks % job.heads;
  int const batch = cta / job.blocks / job.heads;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const row0 = block * kBlockRows + warp * kRowsPerWarp;

  float x[kRowsPerWarp][kPerLane];
  In const* in = static_cast<In const*>(job.in) + batch * job.in_stride[0] +
                 head * job.in_stride[2] + lane * kPerLane;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRowsPerWarp; ++r) {
    cutlass::AlignedArray<In, kPerLane> v;
    v.clear();
    if (row0 + r < job.rows)
      v = *reinterpret_cast<cutlass::AlignedArray<In, kPerLane> const*>(in + (row0 + r) * job.in_stride[1]);
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kPerLane; ++e) x[r][e] = float(v[e]);
  }

  if (job.rotate) {
    float sign[kPerLane];
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kPerLane; ++e) sign[e] = p.signs[lane * kPerLane + e] * rsqrtf(float(kHeadDim));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kPerLane; ++e) x[r][e] *= sign[e];
      walsh_hadamard(x[r], lane);
    }
  }

  int64_t const scale_index = (int64_t(batch) * job.heads + head) * job.blocks + block;
  float scale = 1.f;
  if constexpr (kPass == ScalePass::kGiven) {
    if (job.scale != nullptr) scale = job.scale[scale_index];
  } else {
    float amax = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kPerLane; ++e) amax = fmaxf(amax, fabsf(x[r][e]));
    }
    CUTLASS_PRAGMA_UNROLL
    for (int s = 16; s > 0; s /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, s));
    if (lane == 0) warp_amax[warp] = amax;
    __syncthreads();
    amax = warp_amax[0];
    CUTLASS_PRAGMA_UNROLL
    for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
    if constexpr (kPass == ScalePass::kAmaxOnly) {
      if (threadIdx.x == 0) job.scale[scale_index] = amax / kE4m3Max;
      return;
    }
    scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    if (threadIdx.x == 0) job.scale[scale_index] = scale;
  }
  float const inv_scale = 1.f / scale;

  using Fp8 = cutlass::float_e4m3_t;
  if (!job.transpose) {
    cutlass::NumericArrayConverter<Fp8, float, kPerLane> convert;
    Fp8* out = static_cast<Fp8*>(job.out) + batch * job.out_stride[0] + head * job.out_stride[2] +
               lane * kPerLane;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (row0 + r >= job.rows) break;
      FloatArray<kPerLane> scaled;
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kPerLane; ++e) scaled[e] = x[r][e] * inv_scale;
      store_vector(out + (row0 + r) * job.out_stride[1], convert(scaled));
    }
    return;
  }

  // V^T: byte p of each 16-key run holds key 2 (p / 4) + (p & 1) + 8 ((p / 2) & 1)
  // (fp8_vt_key_position's inverse): word w takes keys 2w, 2w + 1, 2w + 8, 2w + 9.
  cutlass::NumericArrayConverter<Fp8, float, 4> convert4;
  CUTLASS_PRAGMA_UNROLL
  for (int e = 0; e < kPerLane; ++e) {
    cutlass::AlignedArray<Fp8, 16> run;
    auto* words = reinterpret_cast<cutlass::Array<Fp8, 4>*>(&run);
    CUTLASS_PRAGMA_UNROLL
    for (int w = 0; w < 4; ++w) {
      FloatArray<4> keys;
      keys[0] = x[2 * w][e] * inv_scale;
      keys[1] = x[2 * w + 1][e] * inv_scale;
      keys[2] = x[2 * w + 8][e] * inv_scale;
      keys[3] = x[2 * w + 9][e] * inv_scale;
      words[w] = convert4(keys);
    }
    *reinterpret_cast<cutlass::AlignedArray<Fp8, 16>*>(&vt_tile[lane * kPerLane + e][warp * kRowsPerWarp]) = run;
  }
  __syncthreads();
  // Each head-dim row of the block: 128 bytes = 8 threads x 16 bytes.
  uint8_t* out = static_cast<uint8_t*>(job.out) + batch * job.out_stride[0] +
                 head * job.out_stride[1] + block * kBlockRows;
  constexpr int kThreadsPerRow = kBlockRows / 16;
  for (int i = threadIdx.x; i < kHeadDim * kThreadsPerRow; i += kThreads) {
    int const dim = i / kThreadsPerRow, chunk = i % kThreadsPerRow;
    *reinterpret_cast<uint4*>(out + dim * job.out_stride[2] + chunk * 16) =
        *reinterpret_cast<uint4 const*>(&vt_tile[dim][chunk * 16]);
  }
}

// Per-tensor scaling: every block entry of a tensor becomes the largest
// (1 for a tensor of zeros). One CTA per tensor.
__global__ void __launch_bounds__(1024) fp8_tensor_scale_kernel(__grid_constant__ QuantizeKernelParams const p) {
  QuantizeJob const& job = p.job[blockIdx.x];
  if (p.job_ctas[blockIdx.x] == 0 || job.scale == nullptr) return;
  int64_t const n = p.job_ctas[blockIdx.x];
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, job.scale[i]);
  for (int s = 16; s > 0; s /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, s));
  __shared__ float warp_max[32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0.f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, warp_max[w]);
  float const scale = m > 0.f ? m : 1.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) job.scale[i] = scale;
}

template <class In, int kHeadDim>
cudaError_t launch(QuantizeKernelParams const& kp, Fp8Scaling scaling, cudaStream_t stream) {
  int64_t const ctas = int64_t{kp.job_ctas[0]} + kp.job_ctas[1] + kp.job_ctas[2];
  if (ctas == 0) return cudaSuccess;
  if (ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  if (std::is_same_v<In, cutlass::float_e4m3_t>) {  // V only, unscaled
    fp8_quantize_kernel<In, kHeadDim, ScalePass::kGiven><<<int(ctas), kThreads, 0, stream>>>(kp);
  } else if (scaling == Fp8Scaling::kPerBlock) {
    fp8_quantize_kernel<In, kHeadDim, ScalePass::kOwn><<<int(ctas), kThreads, 0, stream>>>(kp);
  } else {
    fp8_quantize_kernel<In, kHeadDim, ScalePass::kAmaxOnly><<<int(ctas), kThreads, 0, stream>>>(kp);
    fp8_tensor_scale_kernel<<<kJobs, 1024, 0, stream>>>(kp);
    fp8_quantize_kernel<In, kHeadDim, ScalePass::kGiven><<<int(ctas), kThreads, 0, stream>>>(kp);
  }
  return cudaGetLastError();
}

template <class In>
cudaError_t launch_for_head_dim(QuantizeKernelParams const& kp, int head_dim, Fp8Scaling scaling,
                                cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch<In, 64>(kp, scaling, stream);
    case 128: return launch<In, 128>(kp, scaling, stream);
    case 256: return launch<In, 256>(kp, scaling, stream);
    default: return cudaErrorInvalidValue;
  }
}

int blocks_of(int rows) { return (rows + kBlockRows - 1) / kBlockRows; }

}  // namespace

cudaError_t run_quantize_fp8(QuantizeFp8Params const& p, cudaStream_t stream) {
  bool const v_only = p.dtype == DType::kFloat8E4M3;
  auto const rows_job = [&](Tensor4d const& in, Tensor4d const& out, float* scale, int heads,
                            int rows) {
    QuantizeJob job{};
    job.in = in.data;
    job.out = out.data;
    for (int i = 0; i < 3; ++i) {
      job.in_stride[i] = in.stride[i];
      job.out_stride[i] = out.stride[i];
    }
    job.scale = scale;
    job.heads = heads;
    job.rows = rows;
    job.blocks = blocks_of(rows);
    job.rotate = p.hadamard_signs != nullptr;
    return job;
  };
  QuantizeKernelParams kp{};
  kp.signs = p.hadamard_signs;
  if (!v_only && p.seqlen_q > 0) {
    kp.job[0] = rows_job(p.q, p.q_out, p.q_scale, p.heads_q, p.seqlen_q);
    kp.job_ctas[0] = p.batch * p.heads_q * kp.job[0].blocks;
  }
  if (!v_only && p.seqlen_k > 0) {
    kp.job[1] = rows_job(p.k, p.k_out, p.k_scale, p.heads_kv, p.seqlen_k);
    kp.job_ctas[1] = p.batch * p.heads_kv * kp.job[1].blocks;
  }
  if (p.seqlen_k > 0) {
    // vt_out's stride[1] is its head-dim row stride, stride[2] its head
    // stride (flash3.hpp); the job stores them as (batch, head, row).
    QuantizeJob job = rows_job(p.v, p.vt_out, v_only ? nullptr : p.v_scale, p.heads_kv, p.seqlen_k);
    job.out_stride[1] = p.vt_out.stride[2];
    job.out_stride[2] = p.vt_out.stride[1];
    job.rotate = false;
    job.transpose = true;
    kp.job[2] = job;
    kp.job_ctas[2] = p.batch * p.heads_kv * job.blocks;
  }
  switch (p.dtype) {
    case DType::kBFloat16:
      return launch_for_head_dim<cutlass::bfloat16_t>(kp, p.head_dim, p.scaling, stream);
    case DType::kFloat16:
      return launch_for_head_dim<cutlass::half_t>(kp, p.head_dim, p.scaling, stream);
    case DType::kFloat8E4M3:
      return launch_for_head_dim<cutlass::float_e4m3_t>(kp, p.head_dim, p.scaling, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace flash3::kernels
