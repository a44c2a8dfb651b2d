// flash3::combine: validate -> (no-op?) -> device and pointer checks -> the
// combine kernel (the same one forward() runs after split-KV).

#include "device_check.hpp"
#include "export.hpp"
#include "kernels/fwd_combine_run.h"
#include "last_error.hpp"
#include "validate.hpp"

namespace flash3 {
namespace {

Status combine_checked(const CombineParams& params, cudaStream_t stream) {
  if (host::CheckResult r = host::validate_combine(params); !r.ok()) return host::record(r);
  if (params.batch == 0 || params.seqlen == 0) {
    host::clear_last_error();
    return Status::kOk;
  }
  int device = -1;
  if (host::CheckResult r = host::check_current_device(&device); !r.ok()) return host::record(r);
  if (host::CheckResult r = host::check_device_pointers(params, device); !r.ok())
    return host::record(r);
  if (const cudaError_t error = kernels::run_combine(params, stream); error != cudaSuccess)
    return host::record(host::CheckResult::fail(
        Status::kCudaError, host::cat("CUDA error in flash3 combine: ", cudaGetErrorString(error))));
  host::clear_last_error();
  return Status::kOk;
}

}  // namespace

FLASH3_CXX_EXPORT Status combine(const CombineParams& params, cudaStream_t stream) {
  return host::never_throws([&] { return combine_checked(params, stream); });
}

}  // namespace flash3
