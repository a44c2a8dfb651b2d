// flash3::backward: validate -> (nothing to compute? zero the gradients) ->
// device and pointer checks -> default scale, resolved window -> row statistics (which also
// zero dQ's accumulator) -> dsinks -> main kernel and dQ conversion.
#include <cmath>
#include <optional>
#include <utility>

#include "bwd_workspace.hpp"
#include "device_check.hpp"
#include "export.hpp"
#include "flash3_built_kernels.h"
#include "kernels/bwd_run.h"
#include "last_error.hpp"
#include "validate.hpp"
#include "window.hpp"

namespace flash3 {
namespace {

using host::CheckResult;

// Only built instantiations are referenced (see forward.cpp); e4m3 is
// forward only and fp32 a combine output: validation refuses both.
std::optional<cudaError_t> dispatch(const BackwardParams& p, const kernels::BwdWorkspaceView& ws,
                                    cudaStream_t stream) {
#define FLASH3_DISPATCH(DTYPE, HEAD_DIM, HEAD_DIM_V)                                        \
  if (p.dtype == DType::DTYPE && p.head_dim == HEAD_DIM && p.head_dim_v == HEAD_DIM_V) \
    return kernels::run_bwd<DType::DTYPE, HEAD_DIM, HEAD_DIM_V>(p, ws, stream);
  FLASH3_FOR_EACH_BUILT_16BIT(FLASH3_DISPATCH)
#undef FLASH3_DISPATCH
  return std::nullopt;
}

CheckResult cuda_failure(cudaError_t error) {
  return CheckResult::fail(Status::kCudaError,
                           host::cat("CUDA error in flash3 backward: ", cudaGetErrorString(error)));
}

// Launches everything; the first failure stops the sequence.
CheckResult launch(const BackwardParams& p, cudaStream_t stream) {
  const bool has_queries = host::backward_has_queries(p);
  const bool has_keys = host::backward_has_keys(p);
  // Without keys dq is 0; without queries (or with only keys nobody sees) dk, dv are 0;
  // either way out is 0, so is D = rowsum(dO * O) and with it dsinks. Varlen
  // zeroes the packed rows as one sequence.
  if (!has_queries || !has_keys) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int batch = varlen ? 1 : p.batch;
    if (p.dsinks != nullptr)
      if (cudaError_t e = cudaMemsetAsync(p.dsinks, 0, sizeof(float) * p.heads_q, stream); e != cudaSuccess)
        return cuda_failure(e);
    if (has_queries)
      if (cudaError_t e = kernels::run_zero_fill(p.dq, batch, varlen ? p.total_q : p.seqlen_q, p.heads_q,
                                                 p.head_dim, stream);
          e != cudaSuccess)
        return cuda_failure(e);
    const int rows_k = varlen ? p.total_k : p.seqlen_k;
    for (auto [t, dim] : {std::pair{&p.dk, p.head_dim}, std::pair{&p.dv, p.head_dim_v}})
      if (cudaError_t e = kernels::run_zero_fill(*t, batch, rows_k, p.heads_kv, dim, stream); e != cudaSuccess)
        return cuda_failure(e);
    return {};
  }
  const kernels::BwdWorkspaceView ws = host::carve_workspace(host::bwd_workspace_layout(p), p.workspace);
  if (cudaError_t e = kernels::run_bwd_preprocess(p, ws, stream); e != cudaSuccess) return cuda_failure(e);
  const std::optional<cudaError_t> launched = dispatch(p, ws, stream);
  if (!launched)
    return CheckResult::fail(
        Status::kInternal, host::cat("flash3 internal error: no backward kernel for dtype ",
                                     static_cast<int>(p.dtype), " head_dim ", p.head_dim,
                                     " head_dim_v ", p.head_dim_v, " although validation passed"));
  if (*launched != cudaSuccess) return cuda_failure(*launched);
  if (p.dsinks != nullptr)
    if (cudaError_t e = kernels::run_bwd_sink_grad(p, ws, stream); e != cudaSuccess) return cuda_failure(e);
  return {};
}

Status backward_checked(const BackwardParams& params, cudaStream_t stream) {
  if (CheckResult r = host::validate_backward(params); !r.ok()) return host::record(r);
  // Nothing to launch, unless dsinks must be zeroed.
  if (!host::backward_has_queries(params) && !host::backward_has_keys(params) &&
      params.dsinks == nullptr) {
    host::clear_last_error();
    return Status::kOk;
  }
  int device = -1;
  if (CheckResult r = host::check_current_device(&device); !r.ok()) return host::record(r);
  if (CheckResult r = host::check_device_pointers(params, device); !r.ok()) return host::record(r);

  BackwardParams resolved = params;
  resolved.head_dim_v = host::head_dim_v(params);
  if (resolved.softmax_scale == 0.f)
    resolved.softmax_scale = 1.f / std::sqrt(static_cast<float>(resolved.head_dim));
  host::resolve_window(resolved);
  if (CheckResult r = launch(resolved, stream); !r.ok()) return host::record(r);
  host::clear_last_error();
  return Status::kOk;
}

}  // namespace

FLASH3_CXX_EXPORT size_t backward_workspace_size(const BackwardParams& params) {
  return host::bwd_workspace_layout(params).bytes;
}

FLASH3_CXX_EXPORT Status backward(const BackwardParams& params, cudaStream_t stream) {
  return host::never_throws([&] { return backward_checked(params, stream); });
}

}  // namespace flash3
