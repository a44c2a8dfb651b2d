// Host time per call of flash3's forward on a tiny problem (b = 1, h = 1,
// s = 128, d = 64), against a bare kernel launch on the same stream: what the
// library adds on the host (validation, device and pointer checks, TMA
// descriptors, launch). Issue 3's bar is under 10 us per call in C++.
//
//   build/flash3_host_overhead        (needs a Hopper GPU; built with the tests)
//
// Each loop's wall time is read before synchronizing, so it is the host's
// cost of issuing the calls (the GPU runs a few us behind and the launch
// queue does not fill in kCalls calls). Best of kRounds.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"

namespace {

constexpr int kCalls = 500;
constexpr int kRounds = 20;
constexpr int kSeqlen = 128;
constexpr int kHeadDim = FLASH3_BENCH_HEAD_DIM;

__global__ void empty_kernel() {}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "flash3_host_overhead: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(2);
}

// Microseconds per call of `call`, best round.
double host_us_per_call(const std::function<bool()>& call) {
  double best = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    check(cudaDeviceSynchronize(), "synchronize");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      if (!call()) {
        std::fprintf(stderr, "flash3_host_overhead: call failed: %s\n", flash3::last_error());
        std::exit(1);
      }
    }
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / kCalls);
  }
  check(cudaDeviceSynchronize(), "synchronize");
  return best;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "flash3_host_overhead needs an NVIDIA Hopper GPU; no CUDA device found\n");
    return 2;
  }
  const size_t elements = size_t{kSeqlen} * kHeadDim;
  void *q, *k, *v, *out;
  float* lse;
  for (void** p : {&q, &k, &v, &out}) check(cudaMalloc(p, elements * 2), "cudaMalloc");
  check(cudaMalloc(&lse, kSeqlen * sizeof(float)), "cudaMalloc");
  check(cudaMemset(q, 0, elements * 2), "cudaMemset");
  check(cudaMemset(k, 0, elements * 2), "cudaMemset");
  check(cudaMemset(v, 0, elements * 2), "cudaMemset");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // (1, 128, 1, d) contiguous; the C++ and C tensor structs have the same fields.
  const auto set = [](auto& t, void* data) {
    t.data = data;
    t.stride[0] = int64_t{kSeqlen} * kHeadDim;
    t.stride[1] = t.stride[2] = kHeadDim;
    t.stride[3] = 1;
  };
  flash3::ForwardParams p;
  set(p.q, q), set(p.k, k), set(p.v, v), set(p.out, out);
  p.dtype = FLASH3_BENCH_DTYPE;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = kSeqlen;
  p.heads_q = p.heads_kv = 1;
  p.head_dim = kHeadDim;

  flash3_fwd_params c;
  flash3_fwd_params_init(&c);
  set(c.q, q), set(c.k, k), set(c.v, v), set(c.out, out);
  c.dtype = p.dtype == flash3::DType::kBFloat16 ? FLASH3_DTYPE_BFLOAT16 : FLASH3_DTYPE_FLOAT16;
  c.batch = 1;
  c.seqlen_q = c.seqlen_k = kSeqlen;
  c.num_heads_q = c.num_heads_kv = 1;
  c.head_dim = kHeadDim;
  c.lse = lse;

  const double launch = host_us_per_call([&] {
    empty_kernel<<<1, 32, 0, stream>>>();
    return cudaPeekAtLastError() == cudaSuccess;
  });
  const double fwd_no_lse = host_us_per_call([&] {
    p.lse = nullptr;
    return flash3::forward(p, stream) == flash3::Status::kOk;
  });
  const double fwd = host_us_per_call([&] {
    p.lse = lse;
    return flash3::forward(p, stream) == flash3::Status::kOk;
  });
  const double c_fwd = host_us_per_call([&] { return flash3_fwd(&c, stream) == FLASH3_OK; });

  std::printf("host us per call, b=1 h=1 s=128 d=%d, best of %d rounds of %d calls\n", kHeadDim,
              kRounds, kCalls);
  std::printf("  empty kernel launch        %6.2f\n", launch);
  std::printf("  flash3::forward            %6.2f\n", fwd);
  std::printf("  flash3::forward, no lse    %6.2f\n", fwd_no_lse);
  std::printf("  flash3_fwd (C ABI)         %6.2f\n", c_fwd);
  std::printf("  library's own share        %6.2f\n", fwd - launch);
  return 0;
}
