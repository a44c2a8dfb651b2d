// flash3::forward: validate -> (no-op?) -> device and pointer checks ->
// default scale, resolved window -> dispatch to the (dtype, head dim)
// instantiation (or, without keys, the kernel that writes zeros).
#include <cmath>
#include <exception>
#include <new>
#include <optional>

#include "device_check.hpp"
#include "export.hpp"
#include "kernels/fwd_run.h"
#include "last_error.hpp"
#include "validate.hpp"
#include "window.hpp"

namespace flash3 {
namespace {

using host::CheckResult;

// Only instantiations that were built are referenced (FLASH3_HAS_* come from
// CMake's FLASH3_DTYPES x FLASH3_HEAD_DIMS); validation has already rejected
// the others, so reaching the end is a bug.
std::optional<cudaError_t> dispatch(const ForwardParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kBFloat16:
      switch (p.head_dim) {
#ifdef FLASH3_HAS_BF16_HDIM64
        case 64: return kernels::run_fwd<DType::kBFloat16, 64>(p, stream);
#endif
#ifdef FLASH3_HAS_BF16_HDIM128
        case 128: return kernels::run_fwd<DType::kBFloat16, 128>(p, stream);
#endif
#ifdef FLASH3_HAS_BF16_HDIM256
        case 256: return kernels::run_fwd<DType::kBFloat16, 256>(p, stream);
#endif
        default: break;
      }
      break;
    case DType::kFloat16:
      switch (p.head_dim) {
#ifdef FLASH3_HAS_FP16_HDIM64
        case 64: return kernels::run_fwd<DType::kFloat16, 64>(p, stream);
#endif
#ifdef FLASH3_HAS_FP16_HDIM128
        case 128: return kernels::run_fwd<DType::kFloat16, 128>(p, stream);
#endif
#ifdef FLASH3_HAS_FP16_HDIM256
        case 256: return kernels::run_fwd<DType::kFloat16, 256>(p, stream);
#endif
        default: break;
      }
      break;
    case DType::kFloat8E4M3:
      switch (p.head_dim) {
#ifdef FLASH3_HAS_E4M3_HDIM64
        case 64: return kernels::run_fwd<DType::kFloat8E4M3, 64>(p, stream);
#endif
#ifdef FLASH3_HAS_E4M3_HDIM128
        case 128: return kernels::run_fwd<DType::kFloat8E4M3, 128>(p, stream);
#endif
#ifdef FLASH3_HAS_E4M3_HDIM256
        case 256: return kernels::run_fwd<DType::kFloat8E4M3, 256>(p, stream);
#endif
        default: break;
      }
      break;
  }
  return std::nullopt;
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
  if (resolved.softmax_scale == 0.f)
    resolved.softmax_scale = 1.f / std::sqrt(static_cast<float>(resolved.head_dim));
  host::resolve_window(resolved);

  std::optional<cudaError_t> launched;
  if (varlen ? resolved.total_k == 0 : resolved.seqlen_k == 0) {
    if (varlen) {  // the packed rows as one sequence: lse (heads_q, total_q) is that layout
      resolved.batch = 1;
      resolved.seqlen_q = resolved.total_q;
    }
    launched = kernels::run_fwd_empty_keys(resolved, stream);
  } else {
    launched = dispatch(resolved, stream);
  }
  if (!launched)
    return host::record(CheckResult::fail(
        Status::kInternal, host::cat("flash3 internal error: no kernel to dispatch for dtype ",
                                     static_cast<int>(resolved.dtype), " head_dim ",
                                     resolved.head_dim, " although validation passed")));
  if (const cudaError_t error = *launched; error != cudaSuccess)
    return host::record(CheckResult::fail(
        Status::kCudaError, host::cat("CUDA error in flash3 forward: ", cudaGetErrorString(error))));
  host::clear_last_error();
  return Status::kOk;
}

}  // namespace

FLASH3_CXX_EXPORT Status forward(const ForwardParams& params, cudaStream_t stream) {
  // The C++ API never throws: anything escaping is turned into a status here.
  try {
    return forward_checked(params, stream);
  } catch (const std::bad_alloc&) {
    return host::record(Status::kInternal, "flash3: out of host memory");
  } catch (const std::exception& e) {
    return host::record(Status::kInternal, e.what());
  } catch (...) {
    return host::record(Status::kInternal, "flash3 internal error: unknown exception");
  }
}

}  // namespace flash3
