// Host-side helpers every kernel launch uses.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/half.h>

#include <type_traits>

#include "flash3/flash3.hpp"
#include "kernels/fwd_kernel_params.cuh"

namespace flash3::kernels {

using namespace cute;

template <DType kDType>
using ElementOf = std::conditional_t<
    kDType == DType::kBFloat16, cutlass::bfloat16_t,
    std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::float_e4m3_t>>;

// Raises the dynamic shared-memory limit of `kKernel` once per device (keyed
// by the kernel itself: kernels of one signature must not share the flag).
template <auto kKernel>
cudaError_t allow_shared_memory(int bytes) {
  constexpr int kMaxDevices = 64;
  static bool done[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < kMaxDevices && done[device]) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && device < kMaxDevices) done[device] = true;
  return e;
}

// The current device's SM count, looked up once per device.
inline cudaError_t multiprocessor_count(int* count) {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < kMaxDevices && counts[device] > 0) {
    *count = counts[device];
    return cudaSuccess;
  }
  cudaError_t const e = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess && device < kMaxDevices) counts[device] = *count;
  return e;
}

// (seqlen, kCols, heads, batch): kCols is Q's and K's head dim, or V's.
template <class Traits, int kCols = Traits::kHeadDim>
auto gmem_tensor(Tensor4d const& t, int batch, int seqlen, int heads) {
  using Element = typename Traits::Element;
  return make_tensor(
      make_gmem_ptr(static_cast<Element const*>(t.data)),
      make_layout(make_shape(int32_t(seqlen), Int<kCols>{}, int32_t(heads), int32_t(batch)),
                  make_stride(t.stride[1], _1{}, t.stride[2], t.stride[0])));
}

// A Tensor4d's rows for kernels that address them themselves.
template <class T>
StridedRows<T> strided_rows(Tensor4d const& t) {
  return {static_cast<T*>(t.data), t.stride[0], t.stride[1], t.stride[2]};
}

}  // namespace flash3::kernels
