// The public surface through libflash3.so: C ABI structs, status codes,
// last_error semantics, version/build info, and the C++ API's exports.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "flash3/flash3.h"
#include "flash3/flash3.hpp"

namespace {

constexpr uint64_t kSizeV1 = 216;  // sizeof(flash3_fwd_params) in ABI v1
constexpr uint64_t kSizeV2 = 232;  // ... in ABI v2 (window_left, window_right, softcap)
constexpr uint64_t kSizeV3 = 240;  // ... in ABI v3 (sinks)
constexpr uint64_t kSizeV4 = 280;  // ... in ABI v4 (varlen)
constexpr uint64_t kSizeV6 = 376;  // ... in ABI v6 (FP8 scales)
constexpr uint64_t kSizeV7 = 440;  // ... in ABI v7 (KV cache, split-KV)
constexpr uint64_t kSizeV8 = 560;  // ... in ABI v8 (append with rotary)
constexpr uint64_t kSizeV9 = 576;  // ... in ABI v9 (pack_gqa in v8's padding, ALiBi)
constexpr uint64_t kSizeV10 = 584;  // ... in ABI v10 (head_dim_v)
// A (dtype, head dim) this build has, from CMake.
constexpr int kDType = FLASH3_TEST_DTYPE;
constexpr int kHeadDim = FLASH3_TEST_HEAD_DIM;

void set_contiguous(flash3_tensor* t, void* data, int seqlen, int heads, int head_dim) {
  t->data = data;
  t->stride[0] = int64_t{seqlen} * heads * head_dim;
  t->stride[1] = int64_t{heads} * head_dim;
  t->stride[2] = head_dim;
  t->stride[3] = 1;
}

// Valid parameters over real (host) buffers, so that on a Hopper machine the
// call gets as far as the device-pointer check.
struct HostTensors {
  std::vector<uint16_t> q, k, v, out;
  std::vector<float> lse;
  flash3_fwd_params params;

  HostTensors() {
    flash3_fwd_params_init(&params);
    params.dtype = kDType;
    params.batch = 1;
    params.seqlen_q = 17;
    params.seqlen_k = 33;
    params.num_heads_q = 4;
    params.num_heads_kv = 2;
    params.head_dim = kHeadDim;
    q.resize(17 * 4 * kHeadDim + 8);
    out.resize(q.size());
    k.resize(33 * 2 * kHeadDim + 8);
    v.resize(k.size());
    lse.resize(4 * 17);
    set_contiguous(&params.q, align16(q.data()), 17, 4, kHeadDim);
    set_contiguous(&params.k, align16(k.data()), 33, 2, kHeadDim);
    set_contiguous(&params.v, align16(v.data()), 33, 2, kHeadDim);
    set_contiguous(&params.out, align16(out.data()), 17, 4, kHeadDim);
    params.lse = lse.data();
  }
  static void* align16(uint16_t* p) {
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t{15});
  }
};

// Every byte zero except struct_size and the windows (-1: unbounded).
template <class Params>
void expect_init_defaults(const Params& p) {
  EXPECT_EQ(p.struct_size, sizeof(Params));
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  Params expected;
  std::memset(&expected, 0, sizeof(expected));
  expected.struct_size = sizeof(Params);
  expected.window_left = expected.window_right = -1;
  EXPECT_EQ(std::memcmp(&p, &expected, sizeof(p)), 0);
}

TEST(CAbi, ParamsInitSetsDefaults) {
  flash3_fwd_params p;
  std::memset(&p, 0xAB, sizeof(p));
  flash3_fwd_params_init(&p);
  expect_init_defaults(p);
  flash3_fwd_params_init(nullptr);  // tolerated, does nothing
}

TEST(CAbi, StructSizesAreFrozen) {
  EXPECT_EQ(offsetof(flash3_fwd_params, window_left), kSizeV1);
  EXPECT_EQ(offsetof(flash3_fwd_params, sinks), kSizeV2);
  EXPECT_EQ(offsetof(flash3_fwd_params, cu_seqlens_q), kSizeV3);
  EXPECT_EQ(offsetof(flash3_fwd_params, q_scale), kSizeV4);
  EXPECT_EQ(offsetof(flash3_fwd_params, kv_batch_idx), kSizeV6);
  EXPECT_EQ(offsetof(flash3_fwd_params, k_new), kSizeV7);
  EXPECT_EQ(offsetof(flash3_fwd_params, alibi_slopes), kSizeV8);
  EXPECT_EQ(offsetof(flash3_fwd_params, head_dim_v), kSizeV9);
  EXPECT_EQ(sizeof(flash3_fwd_params), kSizeV10);
}

// A caller compiled against the v1 header passes 216 bytes: the library must
// not read past them, and the v2 fields take their defaults (no window).
TEST(CAbi, V1CallerGetsDefaultsForNewerFields) {
  HostTensors t;
  t.params.struct_size = kSizeV1;
  t.params.window_left = -7;  // past the caller's struct: must be ignored
  t.params.window_right = -7;
  t.params.softcap = -1.f;
  t.params.num_heads_kv = 3;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "num_heads_q (4) must be divisible by num_heads_kv (3)");
  t.params.struct_size = kSizeV2;  // now they are read
  t.params.num_heads_kv = 2;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "window_left must be >= -1 (-1: unbounded); got -7");
}

// Likewise for a v9 caller and the v10 field (head_dim_v), which is also
// in flash3_bwd_params.
TEST(CAbi, V9CallerGetsDefaultsForNewerFields) {
  HostTensors t;
  t.params.struct_size = kSizeV9;
  t.params.head_dim_v = 7;  // past the caller's struct: must be ignored
  t.params.num_heads_kv = 3;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "num_heads_q (4) must be divisible by num_heads_kv (3)");
  t.params.struct_size = kSizeV10;  // now it is read
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_UNSUPPORTED);
  EXPECT_EQ(std::string(flash3_last_error()).rfind("head_dim_v: differs from head_dim only as", 0), 0u)
      << flash3_last_error();
}

// Likewise for a v2 caller and the v3 field.
TEST(CAbi, V2CallerGetsDefaultsForNewerFields) {
  HostTensors t;
  t.params.struct_size = kSizeV2;
  t.params.sinks = reinterpret_cast<const float*>(uintptr_t{2});  // past the caller's struct
  flash3_fwd(&t.params, nullptr);  // fails later on (no GPU here, or host buffers), not on sinks
  EXPECT_EQ(std::string(flash3_last_error()).find("sinks"), std::string::npos)
      << flash3_last_error();
  t.params.struct_size = kSizeV3;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "sinks: pointer must be 4-byte aligned; got 0x2");
}

// Likewise for a v3 caller and the v4 (varlen) fields.
TEST(CAbi, V3CallerGetsDefaultsForNewerFields) {
  HostTensors t;
  t.params.struct_size = kSizeV3;
  t.params.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{2});  // past the caller's struct
  flash3_fwd(&t.params, nullptr);
  EXPECT_EQ(std::string(flash3_last_error()).find("cu_seqlens"), std::string::npos)
      << flash3_last_error();
  t.params.struct_size = kSizeV4;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "cu_seqlens_q: pointer must be 4-byte aligned; got 0x2");
}

TEST(CAbi, NullParams) {
  EXPECT_EQ(flash3_fwd(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "params: expected a pointer to flash3_fwd_params; got NULL");
}

TEST(CAbi, StructSizeTooSmall) {
  HostTensors t;
  for (uint64_t size : {uint64_t{0}, kSizeV1 - 8, uint64_t{8}}) {
    t.params.struct_size = size;
    EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(flash3_last_error()),
              "params->struct_size: expected at least 216 (sizeof(flash3_fwd_params) in ABI v1; "
              "call flash3_fwd_params_init); got " + std::to_string(size));
  }
}

// A caller compiled against a newer header: accepted when its extra fields
// are zero (defaults), refused when it asks for something unknown.
struct NewerParams {
  flash3_fwd_params v1;
  int64_t future_field;
};

TEST(CAbi, LargerStructWithZeroTailIsAccepted) {
  NewerParams p{};
  flash3_fwd_params_init(&p.v1);
  p.v1.struct_size = sizeof(NewerParams);
  p.v1.dtype = kDType;
  p.v1.num_heads_q = 12;
  p.v1.num_heads_kv = 5;
  p.v1.head_dim = kHeadDim;
  // Reaches validation: the error is about the parameters, not the size.
  EXPECT_EQ(flash3_fwd(&p.v1, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "num_heads_q (12) must be divisible by num_heads_kv (5)");
}

TEST(CAbi, LargerStructWithUnknownFieldSetIsRefused) {
  NewerParams p{};
  flash3_fwd_params_init(&p.v1);
  p.v1.struct_size = sizeof(NewerParams);
  p.future_field = 1;
  EXPECT_EQ(flash3_fwd(&p.v1, nullptr), FLASH3_ERROR_UNSUPPORTED);
  EXPECT_STREQ(flash3_last_error(),
               "params->struct_size: 592 bytes, with fields set beyond the 584 bytes this library "
               "knows (ABI v10); upgrade flash3 or leave the newer fields zero");
}

TEST(CAbi, ValidationMessagesComeThrough) {
  HostTensors t;
  t.params.dtype = 5;
  EXPECT_EQ(flash3_fwd(&t.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "dtype: expected fp16 (0), bf16 (1) or e4m3 (2); got 5");

  HostTensors pack;  // v9's field, in the place of v8's padding
  pack.params.pack_gqa = 7;
  EXPECT_EQ(flash3_fwd(&pack.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "pack_gqa: expected auto (0), off (1) or on (2); got 7");

  HostTensors u;
  u.params.head_dim = 80;
  EXPECT_EQ(flash3_fwd(&u.params, nullptr), FLASH3_ERROR_UNSUPPORTED);
  EXPECT_STREQ(flash3_last_error(), "head_dim: supported head dims are 64, 96, 128, 192, 256; got 80");

  HostTensors w;
  w.params.q.stride[3] = 2;
  EXPECT_EQ(flash3_fwd(&w.params, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "q: head_dim stride must be 1 (last dimension contiguous); got 2");
}

TEST(CAbi, LastErrorClearedBySuccess) {
  EXPECT_EQ(flash3_fwd(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STRNE(flash3_last_error(), "");
  // batch == 0 is a no-op that succeeds, on any machine.
  flash3_fwd_params p;
  flash3_fwd_params_init(&p);
  p.dtype = kDType;
  p.num_heads_q = p.num_heads_kv = 1;
  p.head_dim = kHeadDim;
  p.seqlen_q = p.seqlen_k = 7;
  EXPECT_EQ(flash3_fwd(&p, nullptr), FLASH3_OK) << flash3_last_error();
  EXPECT_STREQ(flash3_last_error(), "");
}

TEST(CAbi, LastErrorIsPerThread) {
  EXPECT_EQ(flash3_fwd(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  const std::string mine = flash3_last_error();
  std::string theirs_before, theirs_after;
  std::thread other([&] {
    theirs_before = flash3_last_error();
    HostTensors t;
    t.params.softmax_scale = -1.f;
    flash3_fwd(&t.params, nullptr);
    theirs_after = flash3_last_error();
  });
  other.join();
  EXPECT_EQ(theirs_before, "");
  EXPECT_EQ(theirs_after,
            "softmax_scale must be finite and >= 0 (0 selects 1/sqrt(head_dim)); got -1");
  EXPECT_EQ(std::string(flash3_last_error()), mine);
}

TEST(CAbi, VersionAndBuildInfo) {
  EXPECT_STREQ(flash3_version(), "0.1.0");
  EXPECT_EQ(flash3_abi_version(), FLASH3_ABI_VERSION);
  EXPECT_EQ(flash3_abi_version(), 10);
  EXPECT_STREQ(flash3_build_info(), FLASH3_EXPECTED_BUILD_INFO);
  EXPECT_TRUE(std::regex_match(flash3_build_info(),
                               std::regex("dtypes=(bf16|fp16)(,(bf16|fp16|e4m3))* "
                                          "head_dims=(64|96|128|192|256)(,(64|96|128|192|256))* "
                                          "head_dim_pairs=(192x128)? arch=sm_90a")))
      << flash3_build_info();
}

// Without a GPU (CI) a valid call must say so; with one it must get past the
// device check and then refuse the host buffers this test passes.
TEST(CAbi, ValidCallOnThisMachine) {
  HostTensors t;
  const flash3_status status = flash3_fwd(&t.params, nullptr);
  const std::string message = flash3_last_error();
  int device = -1;
  const cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) {
    EXPECT_EQ(status, FLASH3_ERROR_UNSUPPORTED);
    EXPECT_EQ(message, std::string("flash3 needs an NVIDIA Hopper GPU (sm_90); found no CUDA device (") +
                           cudaGetErrorString(error) + ")");
    return;
  }
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  if (prop.major != 9 || prop.minor != 0) {
    EXPECT_EQ(status, FLASH3_ERROR_UNSUPPORTED);
    EXPECT_EQ(message, std::string("flash3 needs an NVIDIA Hopper GPU (sm_90); found ") + prop.name +
                           " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")");
    return;
  }
  EXPECT_EQ(status, FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(message, "q: expected a CUDA device pointer; got host memory");
}

// The C++ API is exported from the .so too (linking this test proves it).
TEST(CppApi, ForwardAndLastError) {
  flash3::ForwardParams p;
  p.dtype = static_cast<flash3::DType>(kDType);
  p.heads_q = 4;
  p.heads_kv = 3;
  p.head_dim = kHeadDim;
  EXPECT_EQ(flash3::forward(p, nullptr), flash3::Status::kInvalidArgument);
  EXPECT_STREQ(flash3::last_error(), "num_heads_q (4) must be divisible by num_heads_kv (3)");
  p.heads_kv = 2;
  EXPECT_EQ(flash3::forward(p, nullptr), flash3::Status::kOk);  // batch == 0: no-op
  EXPECT_STREQ(flash3::last_error(), "");
}

TEST(CAbiBackward, ParamsInitAndFrozenSize) {
  EXPECT_EQ(offsetof(flash3_bwd_params, window_left), 392u);  // the v1 size
  EXPECT_EQ(offsetof(flash3_bwd_params, sinks), 408u);        // the v2 size
  EXPECT_EQ(offsetof(flash3_bwd_params, cu_seqlens_q), 424u);  // the v4 size
  EXPECT_EQ(offsetof(flash3_bwd_params, alibi_slopes), 464u);  // the v5 size
  EXPECT_EQ(offsetof(flash3_bwd_params, head_dim_v), 480u);    // the v9 size
  EXPECT_EQ(sizeof(flash3_bwd_params), 488u);  // v10
  flash3_bwd_params p;
  std::memset(&p, 0xAB, sizeof(p));
  flash3_bwd_params_init(&p);
  expect_init_defaults(p);
}

TEST(CAbiBackward, NullAndShortParams) {
  EXPECT_EQ(flash3_bwd(nullptr, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(flash3_last_error(), "params: expected a pointer to flash3_bwd_params; got NULL");
  flash3_bwd_params p;
  flash3_bwd_params_init(&p);
  p.struct_size = 100;
  EXPECT_EQ(flash3_bwd(&p, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(flash3_last_error()),
            "params->struct_size: expected at least 392 (sizeof(flash3_bwd_params) in ABI v1; "
            "call flash3_bwd_params_init); got 100");
  uint64_t bytes = 1;
  EXPECT_EQ(flash3_bwd_workspace_size(&p, nullptr), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flash3_bwd_workspace_size(&p, &bytes), FLASH3_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 0u);
}

TEST(CAbiBackward, WorkspaceSizeMatchesTheCppApi) {
  flash3_bwd_params p;
  flash3_bwd_params_init(&p);
  p.dtype = kDType;
  p.batch = 2;
  p.seqlen_q = 113;
  p.seqlen_k = 255;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim = kHeadDim;
  uint64_t bytes = 0;
  ASSERT_EQ(flash3_bwd_workspace_size(&p, &bytes), FLASH3_OK);
  flash3::BackwardParams cpp;
  cpp.batch = 2;
  cpp.seqlen_q = 113;
  cpp.heads_q = 8;
  cpp.head_dim = kHeadDim;
  EXPECT_EQ(bytes, flash3::backward_workspace_size(cpp));
  // LSE, D (2 x 2*8*128 floats) and dQ's fp32 accumulator at least.
  EXPECT_GE(bytes, uint64_t{2} * 8 * 128 * (2 + kHeadDim) * 4);
}

TEST(CppApi, BackwardValidatesAndEmptyIsANoOp) {
  flash3::BackwardParams p;
  p.dtype = static_cast<flash3::DType>(kDType);
  p.heads_q = 4;
  p.heads_kv = 3;
  p.head_dim = kHeadDim;
  EXPECT_EQ(flash3::backward(p, nullptr), flash3::Status::kInvalidArgument);
  EXPECT_STREQ(flash3::last_error(), "num_heads_q (4) must be divisible by num_heads_kv (3)");
  p.heads_kv = 2;
  EXPECT_EQ(flash3::backward(p, nullptr), flash3::Status::kOk);  // batch == 0: no-op
  EXPECT_STREQ(flash3::last_error(), "");
}

}  // namespace
