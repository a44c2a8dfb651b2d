#include "device_check.hpp"

#include <atomic>
#include <initializer_list>
#include <mutex>

#include "validate.hpp"

namespace flash3::host {
namespace {

constexpr const char* kNeedsHopper = "flash3 needs an NVIDIA Hopper GPU (sm_90); found ";

// Beyond this many devices the verdict is recomputed per call (still correct).
constexpr int kMaxCachedDevices = 64;

struct DeviceVerdict {
  std::once_flag once;
  CheckResult result;
};
DeviceVerdict g_verdicts[kMaxCachedDevices];

CheckResult query_device(int device) {
  int major = 0, minor = 0;
  cudaError_t error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess)
    error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (error != cudaSuccess) return no_device(error);
  if (major == 9 && minor == 0) return {};
  cudaDeviceProp prop{};  // the name is needed only for the message
  const char* name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "unknown GPU";
  return check_gpu_arch(name, major, minor);
}

const char* describe(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown type";
}

CheckResult check_pointer(const char* name, const void* pointer, int device) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
  if (error != cudaSuccess)
    return CheckResult::fail(Status::kCudaError, cat(name, ": cudaPointerGetAttributes failed: ",
                                                     cudaGetErrorString(error)));
  return check_pointer_attributes(name, attributes, device);
}

}  // namespace

CheckResult check_gpu_arch(const char* name, int major, int minor) {
  if (major == 9 && minor == 0) return {};
  return CheckResult::fail(Status::kUnsupported,
                           cat(kNeedsHopper, name, " (sm_", major, minor, ")"));
}

CheckResult no_device(cudaError_t error) {
  return CheckResult::fail(Status::kUnsupported,
                           cat(kNeedsHopper, "no CUDA device (", cudaGetErrorString(error), ")"));
}

CheckResult check_pointer_attributes(const char* name, const cudaPointerAttributes& attributes,
                                     int device) {
  // Managed memory migrates on demand, so any device may use it.
  if (attributes.type == cudaMemoryTypeManaged) return {};
  if (attributes.type != cudaMemoryTypeDevice)
    return CheckResult::fail(Status::kInvalidArgument,
                             cat(name, ": expected a CUDA device pointer; got ", describe(attributes.type)));
  if (attributes.device != device)
    return CheckResult::fail(Status::kInvalidArgument,
                             cat(name, ": expected memory on the current CUDA device (", device,
                                 "); got memory on device ", attributes.device));
  return {};
}

CheckResult check_current_device(int* device) {
  const cudaError_t error = cudaGetDevice(device);
  if (error != cudaSuccess) return no_device(error);
  if (*device < 0 || *device >= kMaxCachedDevices) return query_device(*device);
  DeviceVerdict& verdict = g_verdicts[*device];
  std::call_once(verdict.once, [&] { verdict.result = query_device(*device); });
  return verdict.result;
}

namespace {

struct UsedPointer {
  const char* name;
  const void* pointer;
  bool used;
};

CheckResult check_used_pointers(std::initializer_list<UsedPointer> pointers, int device) {
  for (const UsedPointer& t : pointers) {
    if (!t.used) continue;
    if (CheckResult r = check_pointer(t.name, t.pointer, device); !r.ok()) return r;
  }
  return {};
}

}  // namespace

CheckResult check_device_pointers(const ForwardParams& p, int device) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const bool has_keys = varlen_kv(p) ? p.total_k > 0 : p.seqlen_k > 0;
  return check_used_pointers({{"q", p.q.data, true},
                              {"k", p.k.data, has_keys},
                              {"v", p.v.data, has_keys},
                              {"out", p.out.data, true},
                              {"lse", p.lse, p.lse != nullptr},
                              {"sinks", p.sinks, p.sinks != nullptr},
                              {"alibi_slopes", p.alibi_slopes, has_keys && p.alibi_slopes != nullptr},
                              {"cu_seqlens_q", p.cu_seqlens_q, varlen && has_keys},
                              {"cu_seqlens_k", p.cu_seqlens_k, varlen_kv(p) && has_keys},
                              {"seqused_q", p.seqused_q, varlen && has_keys && p.seqused_q != nullptr},
                              {"seqused_k", p.seqused_k, has_keys && p.seqused_k != nullptr},
                              {"kv_batch_idx", p.kv_batch_idx, has_keys && p.kv_batch_idx != nullptr},
                              {"leftpad_k", p.leftpad_k, has_keys && p.leftpad_k != nullptr},
                              {"page_table", p.page_table, has_keys && p.page_table != nullptr},
                              {"workspace", p.workspace, has_keys && p.workspace != nullptr},
                              {"q_scale", p.q_scale.data, p.q_scale.data != nullptr},
                              {"k_scale", p.k_scale.data, has_keys && p.k_scale.data != nullptr},
                              {"v_scale", p.v_scale.data, has_keys && p.v_scale.data != nullptr},
                              {"k_new", p.k_new.data, has_keys && p.seqlen_new > 0},
                              {"v_new", p.v_new.data, has_keys && p.seqlen_new > 0},
                              {"rotary_cos", p.rotary_cos, has_keys && p.rotary_dim > 0},
                              {"rotary_sin", p.rotary_sin, has_keys && p.rotary_dim > 0}},
                             device);
}

CheckResult check_device_pointers(const CombineParams& p, int device) {
  return check_used_pointers({{"out_partial", p.out_partial, true},
                              {"lse_partial", p.lse_partial, true},
                              {"out", p.out.data, true},
                              {"lse", p.lse, p.lse != nullptr},
                              {"sinks", p.sinks, p.sinks != nullptr}},
                             device);
}

CheckResult multiprocessor_count(int device, int* count) {
  static std::atomic<int> counts[kMaxCachedDevices] = {};
  const bool cached = device >= 0 && device < kMaxCachedDevices;
  if (cached && (*count = counts[device].load(std::memory_order_relaxed)) > 0) return {};
  const cudaError_t error = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess)
    return CheckResult::fail(Status::kCudaError, cat("cudaDeviceGetAttribute(MultiProcessorCount) failed: ",
                                                     cudaGetErrorString(error)));
  if (cached) counts[device].store(*count, std::memory_order_relaxed);
  return {};
}

CheckResult check_device_pointers(const QuantizeFp8Params& p, int device) {
  const bool v_only = p.dtype == DType::kFloat8E4M3;
  const bool q_used = !v_only && p.seqlen_q > 0;
  const bool k_used = !v_only && p.seqlen_k > 0;
  const bool v_used = p.seqlen_k > 0;
  return check_used_pointers({{"q", p.q.data, q_used},
                              {"k", p.k.data, k_used},
                              {"v", p.v.data, v_used},
                              {"q_out", p.q_out.data, q_used},
                              {"k_out", p.k_out.data, k_used},
                              {"vt_out", p.vt_out.data, v_used},
                              {"q_scale", p.q_scale, q_used},
                              {"k_scale", p.k_scale, k_used},
                              {"v_scale", p.v_scale, k_used},
                              {"hadamard_signs", p.hadamard_signs,
                               !v_only && p.hadamard_signs != nullptr}},
                             device);
}

CheckResult check_device_pointers(const BackwardParams& p, int device) {
  const bool has_queries = backward_has_queries(p);
  const bool has_keys = backward_has_keys(p);
  const bool both = has_queries && has_keys;
  const bool varlen = both && p.cu_seqlens_q != nullptr;
  return check_used_pointers({{"q", p.q.data, both},
                              {"k", p.k.data, both},
                              {"v", p.v.data, both},
                              {"out", p.out.data, both},
                              {"dout", p.dout.data, both},
                              {"lse", p.lse, both},
                              {"workspace", p.workspace, both},
                              {"dq", p.dq.data, has_queries},
                              {"dk", p.dk.data, has_keys},
                              {"dv", p.dv.data, has_keys},
                              {"sinks", p.sinks, both && p.dsinks != nullptr},
                              {"dsinks", p.dsinks, p.dsinks != nullptr},
                              {"alibi_slopes", p.alibi_slopes, both && p.alibi_slopes != nullptr},
                              {"cu_seqlens_q", p.cu_seqlens_q, varlen},
                              {"cu_seqlens_k", p.cu_seqlens_k, varlen},
                              {"seqused_q", p.seqused_q, varlen && p.seqused_q != nullptr},
                              {"seqused_k", p.seqused_k, varlen && p.seqused_k != nullptr}},
                             device);
}

}  // namespace flash3::host
