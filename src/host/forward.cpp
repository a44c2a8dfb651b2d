// flash3::forward: validate -> (no-op?) -> device and pointer checks ->
// default scale, resolved window -> dispatch to the (dtype, head dim)
// instantiation (or, without keys, the kernel that writes zeros).
#include <cmath>
#include <optional>

#include "device_check.hpp"
#include "export.hpp"
#include "flash3_built_kernels.h"
#include "kernels/fwd_combine_run.h"
#include "kernels/fwd_run.h"
#include "kernels/split_kv.h"
#include "last_error.hpp"
#include "split_kv.hpp"
#include "validate.hpp"
#include "window.hpp"

namespace flash3 {
namespace {

using host::CheckResult;

// The kernel families dispatch() can call: the forward (any dtype) and the
// KV-cache forward (16-bit, V's head dim Q's).
struct RunFwd {
  static constexpr bool kHasFp8 = true;
  template <DType kDType, int kHeadDim, int kHeadDimV>
  static std::optional<cudaError_t> run(const ForwardParams& p, cudaStream_t stream) {
    return kernels::run_fwd<kDType, kHeadDim, kHeadDimV>(p, stream);
  }
};

struct RunFwdKvCache {
  static constexpr bool kHasFp8 = false;
  template <DType kDType, int kHeadDim, int kHeadDimV>
  static std::optional<cudaError_t> run(const ForwardParams& p, cudaStream_t stream) {
    if constexpr (kHeadDimV != kHeadDim) {
      return std::nullopt;
    } else {
      return kernels::run_fwd_kvcache<kDType, kHeadDim>(p, stream);
    }
  }
};

// Only instantiations that were built are referenced (the lists of
// flash3_built_kernels.h come from CMake's FLASH3_DTYPES x FLASH3_HEAD_DIMS
// and FLASH3_HEAD_DIM_PAIRS); validation has already rejected the others,
// so reaching the end is a bug. `p` is resolved: head_dim_v is set.
template <class Runner>
std::optional<cudaError_t> dispatch(const ForwardParams& p, cudaStream_t stream) {
#define FLASH3_DISPATCH(DTYPE, HEAD_DIM, HEAD_DIM_V)                                        \
  if (p.dtype == DType::DTYPE && p.head_dim == HEAD_DIM && p.head_dim_v == HEAD_DIM_V) \
    return Runner::template run<DType::DTYPE, HEAD_DIM, HEAD_DIM_V>(p, stream);
  FLASH3_FOR_EACH_BUILT_16BIT(FLASH3_DISPATCH)
  if constexpr (Runner::kHasFp8) {
    FLASH3_FOR_EACH_BUILT_FP8(FLASH3_DISPATCH)
  }
#undef FLASH3_DISPATCH
  return std::nullopt;
}

// The split count for a validated call on `device` (splits need the SM
// count only when chosen with workspace to hold them).
CheckResult splits_for(const ForwardParams& p, int device, int* splits) {
  *splits = 1;
  if (p.num_splits == 1 || (p.num_splits == 0 && p.workspace == nullptr)) return {};
  int sms = 0;
  if (p.num_splits == 0)
    if (CheckResult r = host::multiprocessor_count(device, &sms); !r.ok()) return r;
  *splits = host::resolve_splits(p, sms);
  return {};
}

// Split-KV's second pass: the partial results in the workspace into out and lse.
cudaError_t combine_splits(const ForwardParams& p, int splits, cudaStream_t stream) {
  kernels::SplitWorkspace const w =
      kernels::split_workspace(p.workspace, splits, p.batch, p.heads_q, p.seqlen_q, p.head_dim);
  int64_t const d = p.head_dim, rows = p.seqlen_q, heads = p.heads_q;
  CombineParams c;
  c.out_partial = w.o;  // (split, batch, heads, seqlen, d) as (split, batch, seqlen, heads, d)
  int64_t const o_strides[5] = {p.batch * heads * rows * d, heads * rows * d, d, rows * d, 1};
  c.lse_partial = w.lse;
  int64_t const lse_strides[4] = {p.batch * heads * rows, heads * rows, 1, rows};
  for (int i = 0; i < 5; ++i) c.out_partial_stride[i] = o_strides[i];
  for (int i = 0; i < 4; ++i) c.lse_partial_stride[i] = lse_strides[i];
  c.out = p.out;
  c.out_dtype = p.dtype;
  c.lse = p.lse;
  c.sinks = p.sinks;
  c.num_splits = splits;
  c.batch = p.batch;
  c.seqlen = p.seqlen_q;
  c.heads = p.heads_q;
  c.head_dim = p.head_dim;
  if (p.cu_seqlens_q == nullptr) return kernels::run_combine(c, stream);
  c.out.stride[0] = 0;  // varlen q: rows of one packed entry (CombineVarlenRows)
  return kernels::run_combine(c, stream, {p.cu_seqlens_q, p.seqused_q, p.total_q});
}

Status forward_checked(const ForwardParams& params, cudaStream_t stream) {
  if (CheckResult r = host::validate_forward(params); !r.ok()) return host::record(r);

  // Nothing to compute, so nothing to launch: succeeds without touching the GPU
  // (as torch does for empty tensors).
  const bool varlen = params.cu_seqlens_q != nullptr;
  if (params.batch == 0 || params.seqlen_q == 0 || (varlen && params.total_q == 0)) {
    host::clear_last_error();
    return Status::kOk;
  }

  int device = -1;
  if (CheckResult r = host::check_current_device(&device); !r.ok()) return host::record(r);
  if (CheckResult r = host::check_device_pointers(params, device); !r.ok()) return host::record(r);

  ForwardParams resolved = params;
  resolved.head_dim_v = host::head_dim_v(params);
  if (resolved.softmax_scale == 0.f)
    resolved.softmax_scale = 1.f / std::sqrt(static_cast<float>(resolved.head_dim));
  int splits = 1;
  if (CheckResult r = splits_for(resolved, device, &splits); !r.ok()) return host::record(r);
  resolved.num_splits = splits;
  const bool kv_cache = host::uses_kv_cache_kernel(resolved, splits);
  if (kv_cache) {
    // Each batch entry's band is relative to its own keys (window.hpp).
    const host::Window w = host::resolve_band(resolved.causal, resolved.window_left,
                                              resolved.window_right, resolved.seqlen_q, resolved.seqlen_k);
    resolved.window_left = w.left;
    resolved.window_right = w.right;
    if (resolved.cache_batch == 0) resolved.cache_batch = resolved.batch;
  } else {
    host::resolve_window(resolved);
  }

  std::optional<cudaError_t> launched;
  if (host::varlen_kv(resolved) ? resolved.total_k == 0 : resolved.seqlen_k == 0) {
    if (varlen) {  // the packed rows as one sequence: lse (heads_q, total_q) is that layout
      resolved.batch = 1;
      resolved.seqlen_q = resolved.total_q;
    }
    launched = kernels::run_fwd_empty_keys(resolved, stream);
  } else if (kv_cache) {
    launched = dispatch<RunFwdKvCache>(resolved, stream);
    if (launched && *launched == cudaSuccess && splits > 1) launched = combine_splits(resolved, splits, stream);
  } else {
    launched = dispatch<RunFwd>(resolved, stream);
  }
  if (!launched)
    return host::record(CheckResult::fail(
        Status::kInternal, host::cat("flash3 internal error: no kernel to dispatch for dtype ",
                                     static_cast<int>(resolved.dtype), " head_dim ",
                                     resolved.head_dim, " head_dim_v ", resolved.head_dim_v,
                                     " although validation passed")));
  if (const cudaError_t error = *launched; error != cudaSuccess)
    return host::record(CheckResult::fail(
        Status::kCudaError, host::cat("CUDA error in flash3 forward: ", cudaGetErrorString(error))));
  host::clear_last_error();
  return Status::kOk;
}

size_t workspace_size_checked(const ForwardParams& params) {
  // The workspace is what is being sized: validate the rest without it.
  ForwardParams sized = params;
  sized.workspace = nullptr;
  sized.workspace_bytes = 0;
  sized.num_splits = params.num_splits > 1 ? 1 : params.num_splits;
  if (!host::validate_forward(sized).ok()) return 0;
  if (params.batch == 0 || params.seqlen_q == 0 || params.seqlen_k == 0) return 0;
  int splits = params.num_splits;
  if (splits == 0) {
    int device = -1, sms = 0;
    if (!host::check_current_device(&device).ok() || !host::multiprocessor_count(device, &sms).ok())
      return 0;
    splits = host::resolve_splits(sized, sms, /*limit_to_workspace=*/false);
  }
  return host::split_workspace_bytes(params, splits);
}

}  // namespace

FLASH3_CXX_EXPORT size_t forward_workspace_size(const ForwardParams& params) {
  try {
    return workspace_size_checked(params);
  } catch (...) {
    return 0;
  }
}

FLASH3_CXX_EXPORT Status forward(const ForwardParams& params, cudaStream_t stream) {
  return host::never_throws([&] { return forward_checked(params, stream); });
}

}  // namespace flash3
