// flash3::quantize_fp8: validate -> (no-op?) -> device and pointer checks ->
// the quantize kernels (fp8_quantize.cu).

#include "device_check.hpp"
#include "export.hpp"
#include "kernels/fp8_quantize_run.h"
#include "last_error.hpp"
#include "validate.hpp"

namespace flash3 {
namespace {

using host::CheckResult;

Status quantize_fp8_checked(const QuantizeFp8Params& params, cudaStream_t stream) {
  if (CheckResult r = host::validate_quantize_fp8(params); !r.ok()) return host::record(r);
  if (params.batch == 0 || (params.seqlen_q == 0 && params.seqlen_k == 0)) {
    host::clear_last_error();
    return Status::kOk;
  }
  int device = -1;
  if (CheckResult r = host::check_current_device(&device); !r.ok()) return host::record(r);
  if (CheckResult r = host::check_device_pointers(params, device); !r.ok()) return host::record(r);
  if (const cudaError_t error = kernels::run_quantize_fp8(params, stream); error != cudaSuccess)
    return host::record(CheckResult::fail(
        Status::kCudaError, host::cat("CUDA error in flash3 quantize_fp8: ", cudaGetErrorString(error))));
  host::clear_last_error();
  return Status::kOk;
}

}  // namespace

FLASH3_CXX_EXPORT Status quantize_fp8(const QuantizeFp8Params& params, cudaStream_t stream) {
  return host::never_throws([&] { return quantize_fp8_checked(params, stream); });
}

}  // namespace flash3
