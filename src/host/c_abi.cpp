// The extern "C" surface of flash3.h: checks what only the C side can get
// wrong (NULL params, struct_size), converts, and calls the C++ API.
#include <cstddef>
#include <cstring>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"
#include "last_error.hpp"

namespace {

using flash3::host::cat;
using flash3::host::CheckResult;

// Sizes of the params structs in each ABI version. Frozen: later versions
// append fields, and callers compiled against an older header keep passing
// its size.
constexpr uint64_t kFwdParamsSizeV1 = 216;
constexpr uint64_t kFwdParamsSizeV2 = 232;
constexpr uint64_t kFwdParamsSizeV3 = 240;
constexpr uint64_t kFwdParamsSizeV4 = 280;  // unchanged in v5
constexpr uint64_t kFwdParamsSizeV6 = 376;
constexpr uint64_t kFwdParamsSizeV7 = 440;
constexpr uint64_t kFwdParamsSizeV8 = 560;  // unchanged in v9 (pack_gqa was a pad)
static_assert(offsetof(flash3_fwd_params, window_left) == kFwdParamsSizeV1);
static_assert(offsetof(flash3_fwd_params, sinks) == kFwdParamsSizeV2);
static_assert(offsetof(flash3_fwd_params, cu_seqlens_q) == kFwdParamsSizeV3);
static_assert(offsetof(flash3_fwd_params, q_scale) == kFwdParamsSizeV4);
static_assert(offsetof(flash3_fwd_params, kv_batch_idx) == kFwdParamsSizeV6);
static_assert(offsetof(flash3_fwd_params, k_new) == kFwdParamsSizeV7);
constexpr uint64_t kFwdParamsSizeV9 = 576;
static_assert(offsetof(flash3_fwd_params, alibi_slopes) == kFwdParamsSizeV8);
static_assert(offsetof(flash3_fwd_params, head_dim_v) == kFwdParamsSizeV9);
constexpr uint64_t kFwdParamsSizeV10 = 584;
static_assert(sizeof(flash3_fwd_params) == kFwdParamsSizeV10,
              "flash3_fwd_params changed: bump FLASH3_ABI_VERSION and keep older callers working");

constexpr uint64_t kQuantizeParamsSizeV6 = sizeof(flash3_quantize_fp8_params);
constexpr uint64_t kCombineParamsSizeV7 = sizeof(flash3_combine_params);

constexpr uint64_t kBwdParamsSizeV1 = 392;
constexpr uint64_t kBwdParamsSizeV2 = 408;  // unchanged in v3
constexpr uint64_t kBwdParamsSizeV4 = 424;
constexpr uint64_t kBwdParamsSizeV5 = 464;
static_assert(offsetof(flash3_bwd_params, window_left) == kBwdParamsSizeV1);
static_assert(offsetof(flash3_bwd_params, sinks) == kBwdParamsSizeV2);
static_assert(offsetof(flash3_bwd_params, cu_seqlens_q) == kBwdParamsSizeV4);
constexpr uint64_t kBwdParamsSizeV9 = 480;
static_assert(offsetof(flash3_bwd_params, alibi_slopes) == kBwdParamsSizeV5);
static_assert(offsetof(flash3_bwd_params, head_dim_v) == kBwdParamsSizeV9);
constexpr uint64_t kBwdParamsSizeV10 = 488;
static_assert(sizeof(flash3_bwd_params) == kBwdParamsSizeV10,
              "flash3_bwd_params changed: bump FLASH3_ABI_VERSION and keep older callers working");

// The C and C++ enums are the same numbers, so conversions are casts.
static_assert(FLASH3_OK == static_cast<int>(flash3::Status::kOk));
static_assert(FLASH3_ERROR_INVALID_ARGUMENT == static_cast<int>(flash3::Status::kInvalidArgument));
static_assert(FLASH3_ERROR_UNSUPPORTED == static_cast<int>(flash3::Status::kUnsupported));
static_assert(FLASH3_ERROR_CUDA == static_cast<int>(flash3::Status::kCudaError));
static_assert(FLASH3_ERROR_INTERNAL == static_cast<int>(flash3::Status::kInternal));
static_assert(FLASH3_DTYPE_FLOAT16 == static_cast<int>(flash3::DType::kFloat16));
static_assert(FLASH3_DTYPE_BFLOAT16 == static_cast<int>(flash3::DType::kBFloat16));
static_assert(FLASH3_DTYPE_FLOAT8_E4M3 == static_cast<int>(flash3::DType::kFloat8E4M3));
static_assert(FLASH3_DTYPE_FLOAT32 == static_cast<int>(flash3::DType::kFloat32));
static_assert(FLASH3_FP8_SCALE_BLOCK == flash3::kFp8ScaleBlock);

flash3_status fail(flash3::Status status, const std::string& message) {
  return static_cast<flash3_status>(flash3::host::record(CheckResult::fail(status, message)));
}

flash3::Tensor4d to_cpp(const flash3_tensor& t) {
  flash3::Tensor4d out;
  out.data = t.data;
  for (int i = 0; i < 4; ++i) out.stride[i] = t.stride[i];
  return out;
}

flash3::Fp8Scale to_cpp(const flash3_fp8_scale& s) {
  flash3::Fp8Scale out;
  out.data = s.data;
  for (int i = 0; i < 3; ++i) out.stride[i] = s.stride[i];
  return out;
}

flash3::ForwardParams to_cpp(const flash3_fwd_params& p) {
  flash3::ForwardParams out;
  out.q = to_cpp(p.q);
  out.k = to_cpp(p.k);
  out.v = to_cpp(p.v);
  out.out = to_cpp(p.out);
  out.lse = p.lse;
  out.dtype = static_cast<flash3::DType>(p.dtype);  // unknown values are rejected by validation
  out.batch = p.batch;
  out.seqlen_q = p.seqlen_q;
  out.seqlen_k = p.seqlen_k;
  out.heads_q = p.num_heads_q;
  out.heads_kv = p.num_heads_kv;
  out.head_dim = p.head_dim;
  out.head_dim_v = p.head_dim_v;
  out.softmax_scale = p.softmax_scale;
  out.causal = p.causal != 0;
  out.window_left = p.window_left;
  out.window_right = p.window_right;
  out.softcap = p.softcap;
  out.sinks = p.sinks;
  out.cu_seqlens_q = p.cu_seqlens_q;
  out.cu_seqlens_k = p.cu_seqlens_k;
  out.seqused_q = p.seqused_q;
  out.seqused_k = p.seqused_k;
  out.total_q = p.total_q;
  out.total_k = p.total_k;
  out.q_scale = to_cpp(p.q_scale);
  out.k_scale = to_cpp(p.k_scale);
  out.v_scale = to_cpp(p.v_scale);
  out.kv_batch_idx = p.kv_batch_idx;
  out.leftpad_k = p.leftpad_k;
  out.page_table = p.page_table;
  out.page_table_stride = p.page_table_stride;
  out.page_size = p.page_size;
  out.cache_batch = p.cache_batch;
  out.num_splits = p.num_splits;
  out.workspace = p.workspace;
  out.workspace_bytes = static_cast<size_t>(p.workspace_bytes);
  out.k_new = to_cpp(p.k_new);
  out.v_new = to_cpp(p.v_new);
  out.seqlen_new = p.seqlen_new;
  out.rotary_cos = p.rotary_cos;
  out.rotary_sin = p.rotary_sin;
  out.rotary_dim = p.rotary_dim;
  out.rotary_seqlen = p.rotary_seqlen;
  out.rotary_interleaved = p.rotary_interleaved != 0;
  out.rotary_q_per_row = p.rotary_q_per_row != 0;
  out.pack_gqa = static_cast<flash3::PackGqa>(p.pack_gqa);  // unknown values are rejected by validation
  out.alibi_slopes = p.alibi_slopes;
  out.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  return out;
}

flash3::CombineParams to_cpp(const flash3_combine_params& p) {
  flash3::CombineParams out;
  out.out_partial = p.out_partial;
  for (int i = 0; i < 5; ++i) out.out_partial_stride[i] = p.out_partial_stride[i];
  out.lse_partial = p.lse_partial;
  for (int i = 0; i < 4; ++i) out.lse_partial_stride[i] = p.lse_partial_stride[i];
  out.out = to_cpp(p.out);
  out.out_dtype = static_cast<flash3::DType>(p.out_dtype);
  out.lse = p.lse;
  out.sinks = p.sinks;
  out.num_splits = p.num_splits;
  out.batch = p.batch;
  out.seqlen = p.seqlen;
  out.heads = p.num_heads;
  out.head_dim = p.head_dim;
  return out;
}

flash3::QuantizeFp8Params to_cpp(const flash3_quantize_fp8_params& p) {
  flash3::QuantizeFp8Params out;
  out.q = to_cpp(p.q);
  out.k = to_cpp(p.k);
  out.v = to_cpp(p.v);
  out.dtype = static_cast<flash3::DType>(p.dtype);
  out.scaling = static_cast<flash3::Fp8Scaling>(p.scaling);
  out.q_out = to_cpp(p.q_out);
  out.k_out = to_cpp(p.k_out);
  out.vt_out = to_cpp(p.vt_out);
  out.q_scale = p.q_scale;
  out.k_scale = p.k_scale;
  out.v_scale = p.v_scale;
  out.batch = p.batch;
  out.seqlen_q = p.seqlen_q;
  out.seqlen_k = p.seqlen_k;
  out.heads_q = p.num_heads_q;
  out.heads_kv = p.num_heads_kv;
  out.head_dim = p.head_dim;
  out.hadamard_signs = p.hadamard_signs;
  return out;
}

flash3::BackwardParams to_cpp(const flash3_bwd_params& p) {
  flash3::BackwardParams out;
  out.q = to_cpp(p.q);
  out.k = to_cpp(p.k);
  out.v = to_cpp(p.v);
  out.out = to_cpp(p.out);
  out.dout = to_cpp(p.dout);
  out.lse = p.lse;
  out.dq = to_cpp(p.dq);
  out.dk = to_cpp(p.dk);
  out.dv = to_cpp(p.dv);
  out.dtype = static_cast<flash3::DType>(p.dtype);
  out.batch = p.batch;
  out.seqlen_q = p.seqlen_q;
  out.seqlen_k = p.seqlen_k;
  out.heads_q = p.num_heads_q;
  out.heads_kv = p.num_heads_kv;
  out.head_dim = p.head_dim;
  out.head_dim_v = p.head_dim_v;
  out.softmax_scale = p.softmax_scale;
  out.causal = p.causal != 0;
  out.deterministic = p.deterministic != 0;
  out.workspace = p.workspace;
  out.workspace_bytes = static_cast<size_t>(p.workspace_bytes);
  out.window_left = p.window_left;
  out.window_right = p.window_right;
  out.softcap = p.softcap;
  out.sinks = p.sinks;
  out.dsinks = p.dsinks;
  out.cu_seqlens_q = p.cu_seqlens_q;
  out.cu_seqlens_k = p.cu_seqlens_k;
  out.seqused_q = p.seqused_q;
  out.seqused_k = p.seqused_k;
  out.total_q = p.total_q;
  out.alibi_slopes = p.alibi_slopes;
  out.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  out.total_k = p.total_k;
  return out;
}

void init(flash3_fwd_params* p) {
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->window_left = p->window_right = -1;
}

void init(flash3_bwd_params* p) {
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->window_left = p->window_right = -1;
}

void init(flash3_quantize_fp8_params* p) {
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
}

void init(flash3_combine_params* p) {
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->out_partial_stride[4] = 1;
  p->out.stride[3] = 1;
}

// Copies the fields this library knows out of a caller's params struct of
// type Struct (`name`), after checking its struct_size: at least the v1 size,
// and any bytes beyond what this library knows must be zero (they would be
// features it cannot honour; ignoring them could give a silently wrong
// result). Fields the caller's (older) struct lacks keep their defaults; only
// the caller's struct_size bytes are read.
template <class Struct>
flash3_status read_params(const Struct* params, const char* name, uint64_t v1_size, Struct* known,
                          int first_version = 1) {
  if (params == nullptr)
    return fail(flash3::Status::kInvalidArgument,
                cat("params: expected a pointer to ", name, "; got NULL"));
  const uint64_t size = params->struct_size;
  if (size < v1_size)
    return fail(flash3::Status::kInvalidArgument,
                cat("params->struct_size: expected at least ", v1_size, " (sizeof(", name,
                    ") in ABI v", first_version, "; call ", name, "_init); got ", size));
  const auto* bytes = reinterpret_cast<const unsigned char*>(params);
  for (uint64_t i = sizeof(Struct); i < size; ++i)
    if (bytes[i] != 0)
      return fail(flash3::Status::kUnsupported,
                  cat("params->struct_size: ", size, " bytes, with fields set beyond the ",
                      sizeof(Struct), " bytes this library knows (ABI v", FLASH3_ABI_VERSION,
                      "); upgrade flash3 or leave the newer fields zero"));
  init(known);
  std::memcpy(known, params, size < sizeof(Struct) ? size : sizeof(Struct));
  return FLASH3_OK;
}

flash3_status fwd(const flash3_fwd_params* params, void* stream) {
  flash3_fwd_params known{};
  if (flash3_status s = read_params(params, "flash3_fwd_params", kFwdParamsSizeV1, &known); s != FLASH3_OK)
    return s;
  return static_cast<flash3_status>(flash3::forward(to_cpp(known), static_cast<cudaStream_t>(stream)));
}

flash3_status bwd(const flash3_bwd_params* params, void* stream) {
  flash3_bwd_params known{};
  if (flash3_status s = read_params(params, "flash3_bwd_params", kBwdParamsSizeV1, &known); s != FLASH3_OK)
    return s;
  return static_cast<flash3_status>(flash3::backward(to_cpp(known), static_cast<cudaStream_t>(stream)));
}

flash3_status quantize_fp8(const flash3_quantize_fp8_params* params, void* stream) {
  flash3_quantize_fp8_params known{};
  if (flash3_status s = read_params(params, "flash3_quantize_fp8_params", kQuantizeParamsSizeV6, &known, 6);
      s != FLASH3_OK)
    return s;
  return static_cast<flash3_status>(flash3::quantize_fp8(to_cpp(known), static_cast<cudaStream_t>(stream)));
}

flash3_status combine(const flash3_combine_params* params, void* stream) {
  flash3_combine_params known{};
  if (flash3_status s = read_params(params, "flash3_combine_params", kCombineParamsSizeV7, &known, 7);
      s != FLASH3_OK)
    return s;
  return static_cast<flash3_status>(flash3::combine(to_cpp(known), static_cast<cudaStream_t>(stream)));
}

flash3_status fwd_workspace_size(const flash3_fwd_params* params, uint64_t* bytes) {
  if (bytes == nullptr)
    return fail(flash3::Status::kInvalidArgument, "bytes: expected a pointer to a uint64_t; got NULL");
  *bytes = 0;
  flash3_fwd_params known{};
  if (flash3_status s = read_params(params, "flash3_fwd_params", kFwdParamsSizeV1, &known); s != FLASH3_OK)
    return s;
  *bytes = flash3::forward_workspace_size(to_cpp(known));
  flash3::host::clear_last_error();
  return FLASH3_OK;
}

flash3_status bwd_workspace_size(const flash3_bwd_params* params, uint64_t* bytes) {
  if (bytes == nullptr)
    return fail(flash3::Status::kInvalidArgument, "bytes: expected a pointer to a uint64_t; got NULL");
  *bytes = 0;
  flash3_bwd_params known{};
  if (flash3_status s = read_params(params, "flash3_bwd_params", kBwdParamsSizeV1, &known); s != FLASH3_OK)
    return s;
  *bytes = flash3::backward_workspace_size(to_cpp(known));
  flash3::host::clear_last_error();
  return FLASH3_OK;
}

// Exceptions cannot cross the C boundary; only message formatting can throw
// here (bad_alloc).
template <class Call>
flash3_status guarded(Call call) {
  try {
    return call();
  } catch (...) {
    return static_cast<flash3_status>(
        flash3::host::record(flash3::Status::kInternal, "flash3: out of host memory"));
  }
}

}  // namespace

extern "C" {

FLASH3_API void flash3_fwd_params_init(flash3_fwd_params* params) {
  if (params != nullptr) init(params);
}

FLASH3_API flash3_status flash3_fwd(const flash3_fwd_params* params, void* stream) {
  return guarded([&] { return fwd(params, stream); });
}

FLASH3_API flash3_status flash3_fwd_workspace_size(const flash3_fwd_params* params, uint64_t* bytes) {
  return guarded([&] { return fwd_workspace_size(params, bytes); });
}

FLASH3_API void flash3_combine_params_init(flash3_combine_params* params) {
  if (params != nullptr) init(params);
}

FLASH3_API flash3_status flash3_combine(const flash3_combine_params* params, void* stream) {
  return guarded([&] { return combine(params, stream); });
}

FLASH3_API void flash3_bwd_params_init(flash3_bwd_params* params) {
  if (params != nullptr) init(params);
}

FLASH3_API flash3_status flash3_bwd_workspace_size(const flash3_bwd_params* params, uint64_t* bytes) {
  return guarded([&] { return bwd_workspace_size(params, bytes); });
}

FLASH3_API flash3_status flash3_bwd(const flash3_bwd_params* params, void* stream) {
  return guarded([&] { return bwd(params, stream); });
}

FLASH3_API void flash3_quantize_fp8_params_init(flash3_quantize_fp8_params* params) {
  if (params != nullptr) init(params);
}

FLASH3_API flash3_status flash3_quantize_fp8(const flash3_quantize_fp8_params* params, void* stream) {
  return guarded([&] { return quantize_fp8(params, stream); });
}

FLASH3_API const char* flash3_last_error(void) { return flash3::last_error(); }
FLASH3_API int flash3_abi_version(void) { return FLASH3_ABI_VERSION; }
FLASH3_API const char* flash3_version(void) { return FLASH3_VERSION_STRING; }
FLASH3_API const char* flash3_build_info(void) { return FLASH3_BUILD_INFO; }

}  // extern "C"
