// The one validation of ForwardParams. Pure host code: no CUDA calls, so every
// rule is unit-tested without a GPU. Device-dependent checks (GPU arch, pointer
// kinds) are in device_check.hpp and run after this.
#pragma once

#include <string>

#include "check_result.hpp"
#include "flash3/flash3.hpp"

namespace flash3::host {

// Head dims the kernels are written for. Which of them are compiled into this
// library is a build option (BuildConfig).
inline constexpr int kSupportedHeadDims[] = {64, 128, 256};
inline constexpr int kNumHeadDims = sizeof(kSupportedHeadDims) / sizeof(int);
// The 16-bit dtypes (forward and backward), in the order lists are printed
// (matches FLASH3_DTYPES' default). e4m3 (FP8 forward) is separate.
inline constexpr DType kKnownDTypes[] = {DType::kBFloat16, DType::kFloat16};
inline constexpr int kNumDTypes = sizeof(kKnownDTypes) / sizeof(DType);

// Varlen k: packed k and v (cu_seqlens_k; validation requires cu_seqlens_q
// too), the varlen kernel's. cu_seqlens_q alone is varlen q over a KV cache.
inline bool varlen_kv(const ForwardParams& p) { return p.cu_seqlens_k != nullptr; }

// "bf16" / "fp16" / "e4m3" / "fp32", or nullptr for a value that is not a DType.
const char* dtype_name(DType dtype);
int dtype_bytes(DType dtype);

// Which (dtype, head dim) kernels exist. Passed to validate_forward so tests
// can validate against a build other than the one they run in.
class BuildConfig {
 public:
  void add(DType dtype, int head_dim);
  bool has(DType dtype, int head_dim) const;
  bool has_dtype(DType dtype) const;   // with any head dim
  bool has_head_dim(int head_dim) const;  // with any dtype
  std::string dtype_list() const;      // "bf16, fp16"
  std::string head_dim_list() const;   // "64, 128, 256"

 private:
  bool built_[kNumDTypes][kNumHeadDims] = {};
  bool fp8_built_[kNumHeadDims] = {};  // e4m3: forward only, so outside kKnownDTypes
};

// This library's kernels (from the FLASH3_HAS_<DTYPE>_HDIM<D> definitions).
const BuildConfig& built_config();

// kOk, or kInvalidArgument / kUnsupported with a message that names the
// argument, what was expected and what was given. Tensors with no elements
// (batch == 0, or seqlen == 0 for that tensor) are never read or written, so
// their pointers and strides are not checked.
CheckResult validate_forward(const ForwardParams& params,
                             const BuildConfig& built = built_config());

// combine()'s rules: sizes, out_dtype, non-negative strides with the head
// dim contiguous, aligned pointers (tensors of no rows are not checked).
CheckResult validate_combine(const CombineParams& params);

// quantize_fp8's rules: sizes, dtypes, tensors (q, k, v and q_out, k_out,
// vt_out as TMA-style strided tensors) and the scale outputs.
CheckResult validate_quantize_fp8(const QuantizeFp8Params& params);

// The forward's rules for q, k, v, out and the sizes, plus: lse (forward's,
// required), dout, dq, dk, dv checked as tensors like out, q, k, v, and a
// workspace of at least backward_workspace_size() bytes.
CheckResult validate_backward(const BackwardParams& params,
                              const BuildConfig& built = built_config());

// Whether the backward has query rows (keys) to compute: batch > 0 and
// seqlen_q (seqlen_k) > 0, with varlen also total_q (total_k) > 0.
bool backward_has_queries(const BackwardParams& params);
bool backward_has_keys(const BackwardParams& params);

// The forward problem whose gradient `params` asks for.
ForwardParams forward_view(const BackwardParams& params);

}  // namespace flash3::host
