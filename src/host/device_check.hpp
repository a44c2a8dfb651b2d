// Checks that need the CUDA runtime: the GPU is Hopper, and the tensors are
// device memory. Each has a pure core (tested with fake values, no GPU).
#pragma once

#include <cuda_runtime_api.h>

#include "check_result.hpp"
#include "flash3/flash3.hpp"

namespace flash3::host {

// Pure. kOk for sm_90, else kUnsupported with
// "flash3 needs an NVIDIA Hopper GPU (sm_90); found <name> (sm_XY)".
CheckResult check_gpu_arch(const char* name, int major, int minor);

// Pure. kUnsupported with
// "flash3 needs an NVIDIA Hopper GPU (sm_90); found no CUDA device (<error>)".
CheckResult no_device(cudaError_t error);

// Pure. Whether the memory `attributes` describes can be used as tensor
// `name` by kernels on `device`: device memory of that device, or managed memory.
CheckResult check_pointer_attributes(const char* name, const cudaPointerAttributes& attributes,
                                     int device);

// The current device is sm_90; sets *device to it. The architecture is
// queried once per device and cached, so the launch path pays only for
// cudaGetDevice.
CheckResult check_current_device(int* device);

// q, k, v, out (and lse when given) are usable on `device`. Call only when
// there is work (batch, seqlen_q >= 1); k and v are checked when seqlen_k >= 1.
CheckResult check_device_pointers(const ForwardParams& params, int device);
// Every tensor backward() reads or writes for these sizes (and the workspace).
CheckResult check_device_pointers(const BackwardParams& params, int device);
CheckResult check_device_pointers(const QuantizeFp8Params& params, int device);
CheckResult check_device_pointers(const CombineParams& params, int device);

// The SM count of `device`, queried once per device.
CheckResult multiprocessor_count(int device, int* count);

}  // namespace flash3::host
