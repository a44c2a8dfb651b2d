// Every rule of validate_forward, with its exact message. No GPU needed.
#include "host/validate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "host/split_kv.hpp"
#include "host/window.hpp"
#include "kernels/pack_gqa.h"
#include "test_params.hpp"

namespace flash3::host {
namespace {

using flash3::testing::valid_params;

BuildConfig all_built() {
  BuildConfig c;
  for (DType d : kKnownDTypes)
    for (int h : kSupportedHeadDims) c.add(d, h);
  for (int h : kFp8HeadDims) c.add(DType::kFloat8E4M3, h);
  for (DType d : kKnownDTypes)
    for (HeadDimPair pair : kHeadDimPairs) c.add(d, pair.qk, pair.v);
  return c;
}

// valid_params with V's and out's head dim apart (192, 128).
ForwardParams pair_params(DType dtype = DType::kBFloat16) {
  ForwardParams p = valid_params(dtype, 192);
  p.head_dim_v = 128;
  return p;
}

void expect_error(const ForwardParams& p, Status status, const std::string& message,
                  const BuildConfig& built = all_built()) {
  const CheckResult r = validate_forward(p, built);
  EXPECT_EQ(r.status, status) << r.message;
  EXPECT_EQ(r.message, message);
}

void expect_ok(const ForwardParams& p, const BuildConfig& built = all_built()) {
  const CheckResult r = validate_forward(p, built);
  EXPECT_EQ(r.status, Status::kOk) << r.message;
  EXPECT_EQ(r.message, "");
}

TEST(Validate, AcceptsEveryBuiltDtypeAndHeadDim) {
  for (DType d : kKnownDTypes)
    for (int h : kSupportedHeadDims) expect_ok(valid_params(d, h));
}

TEST(Validate, AcceptsMhaMqaAndOptionalLse) {
  ForwardParams p = valid_params();
  p.heads_kv = p.heads_q;
  expect_ok(p);
  p.heads_kv = 1;
  expect_ok(p);
  p.lse = nullptr;
  expect_ok(p);
}

TEST(Validate, AcceptsBroadcastAndPermutedStrides) {
  ForwardParams p = valid_params();
  p.k.stride[0] = 0;  // one K shared by the whole batch
  p.v.stride[0] = 0;
  // (batch, heads, seqlen, head_dim) memory seen as (batch, seqlen, heads, head_dim)
  p.q.stride[1] = p.head_dim;
  p.q.stride[2] = int64_t{p.seqlen_q} * p.head_dim;
  expect_ok(p);
}

TEST(Validate, NullDataPointers) {
  const char* msg = ": expected a non-null data pointer; got NULL";
  ForwardParams p = valid_params();
  p.q.data = nullptr;
  expect_error(p, Status::kInvalidArgument, std::string("q") + msg);
  p = valid_params();
  p.k.data = nullptr;
  expect_error(p, Status::kInvalidArgument, std::string("k") + msg);
  p = valid_params();
  p.v.data = nullptr;
  expect_error(p, Status::kInvalidArgument, std::string("v") + msg);
  p = valid_params();
  p.out.data = nullptr;
  expect_error(p, Status::kInvalidArgument, std::string("out") + msg);
}

TEST(Validate, UnknownDtype) {
  ForwardParams p = valid_params();
  p.dtype = static_cast<DType>(7);
  expect_error(p, Status::kInvalidArgument, "dtype: expected fp16 (0), bf16 (1) or e4m3 (2); got 7");
}

TEST(Validate, DtypeNotBuilt) {
  BuildConfig fp16_only;
  for (int h : kSupportedHeadDims) fp16_only.add(DType::kFloat16, h);
  expect_error(valid_params(DType::kBFloat16), Status::kUnsupported,
               "dtype: bf16 is not built into this library (built: fp16); "
               "rebuild with FLASH3_DTYPES including bf16",
               fp16_only);
  expect_ok(valid_params(DType::kFloat16), fp16_only);
}

TEST(Validate, HeadDimNotSupported) {
  for (int h : {1, 32, 80, 127, 160, 512}) {
    ForwardParams p = valid_params(DType::kBFloat16, h);
    expect_error(p, Status::kUnsupported,
                 "head_dim: supported head dims are 64, 96, 128, 192, 256; got " + std::to_string(h));
  }
}

TEST(Validate, HeadDimNotBuilt) {
  BuildConfig small;
  for (DType d : kKnownDTypes) {
    small.add(d, 64);
    small.add(d, 128);
  }
  expect_error(valid_params(DType::kFloat16, 256), Status::kUnsupported,
               "head_dim: 256 is supported but not built into this library (built: 64, 128); "
               "rebuild with FLASH3_HEAD_DIMS including 256",
               small);
}

TEST(Validate, PairNotBuilt) {
  BuildConfig diagonal;
  diagonal.add(DType::kBFloat16, 64);
  diagonal.add(DType::kFloat16, 128);
  expect_error(valid_params(DType::kBFloat16, 128), Status::kUnsupported,
               "no kernel built for dtype bf16 with head_dim 128", diagonal);
  expect_ok(valid_params(DType::kBFloat16, 64), diagonal);
}

TEST(Validate, NegativeSizes) {
  ForwardParams p = valid_params();
  p.batch = -1;
  expect_error(p, Status::kInvalidArgument, "batch must be >= 0; got -1");
  p = valid_params();
  p.seqlen_q = -5;
  expect_error(p, Status::kInvalidArgument, "seqlen_q must be >= 0; got -5");
  p = valid_params();
  p.seqlen_k = -2;
  expect_error(p, Status::kInvalidArgument, "seqlen_k must be >= 0; got -2");
  p = valid_params();
  p.head_dim = -128;
  expect_error(p, Status::kInvalidArgument, "head_dim must be >= 1; got -128");
}

TEST(Validate, HeadsMustBePositive) {
  ForwardParams p = valid_params();
  p.heads_q = 0;
  expect_error(p, Status::kInvalidArgument, "num_heads_q must be >= 1; got 0");
  p = valid_params();
  p.heads_kv = -3;
  expect_error(p, Status::kInvalidArgument, "num_heads_kv must be >= 1; got -3");
}

TEST(Validate, HeadsQDivisibleByHeadsKv) {
  ForwardParams p = valid_params();
  p.heads_q = 12;
  p.heads_kv = 5;
  expect_error(p, Status::kInvalidArgument, "num_heads_q (12) must be divisible by num_heads_kv (5)");
}

TEST(Validate, HeadDimStrideMustBeOne) {
  for (auto [name, member] : {std::pair{"q", &ForwardParams::q}, std::pair{"k", &ForwardParams::k},
                              std::pair{"v", &ForwardParams::v}, std::pair{"out", &ForwardParams::out}}) {
    ForwardParams p = valid_params();
    (p.*member).stride[3] = 2;
    expect_error(p, Status::kInvalidArgument,
                 std::string(name) + ": head_dim stride must be 1 (last dimension contiguous); got 2");
  }
}

TEST(Validate, DataPointersMustBe16ByteAligned) {
  ForwardParams p = valid_params();
  p.v.data = reinterpret_cast<void*>(uintptr_t{0x300008});  // 8-aligned is not enough for TMA
  expect_error(p, Status::kInvalidArgument,
               "v: data pointer must be 16-byte aligned (needed by TMA); got 0x300008");
}

TEST(Validate, StridesMustBeMultiplesOf16Bytes) {
  ForwardParams p = valid_params();
  p.k.stride[1] = 260;
  expect_error(p, Status::kInvalidArgument,
               "k: seqlen stride must be a multiple of 8 elements (16 bytes, needed by TMA); got 260");
  p = valid_params();
  p.out.stride[2] = 132;
  expect_error(p, Status::kInvalidArgument,
               "out: heads stride must be a multiple of 8 elements (16 bytes, needed by TMA); got 132");
  p = valid_params();
  p.q.stride[0] = 1;
  expect_error(p, Status::kInvalidArgument,
               "q: batch stride must be a multiple of 8 elements (16 bytes, needed by TMA); got 1");
}

TEST(Validate, StridesMustBeNonNegative) {
  ForwardParams p = valid_params();
  p.v.stride[0] = -8;
  expect_error(p, Status::kInvalidArgument, "v: batch stride must be >= 0; got -8");
}

TEST(Validate, StridesMustBeBelowTmaLimit) {
  ForwardParams p = valid_params();
  p.q.stride[0] = int64_t{1} << 39;  // 2^40 bytes at 2 bytes per element
  expect_error(p, Status::kInvalidArgument,
               "q: batch stride must be below 2^40 bytes (TMA limit); got 549755813888 elements");
  p.q.stride[0] = (int64_t{1} << 39) - 8;
  expect_ok(p);
}

TEST(Validate, SoftmaxScale) {
  const std::string prefix = "softmax_scale must be finite and >= 0 (0 selects 1/sqrt(head_dim)); got ";
  ForwardParams p = valid_params();
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(p, Status::kInvalidArgument, prefix + "nan");
  p.softmax_scale = std::numeric_limits<float>::infinity();
  expect_error(p, Status::kInvalidArgument, prefix + "inf");
  p.softmax_scale = -0.5f;
  expect_error(p, Status::kInvalidArgument, prefix + "-0.5");
  p.softmax_scale = 0.f;
  expect_ok(p);
  p.softmax_scale = 0.125f;
  expect_ok(p);
}

TEST(Validate, Window) {
  ForwardParams p = valid_params();
  p.window_left = -2;
  expect_error(p, Status::kInvalidArgument, "window_left must be >= -1 (-1: unbounded); got -2");
  p.window_left = 0;
  p.window_right = -3;
  expect_error(p, Status::kInvalidArgument, "window_right must be >= -1 (-1: unbounded); got -3");
  p.window_right = 0;
  expect_ok(p);
  p.window_left = p.window_right = std::numeric_limits<int>::max();
  expect_ok(p);
  p.causal = true;
  expect_error(p, Status::kInvalidArgument,
               "window_right must be -1 or 0 with causal (a causal row sees no key right of its "
               "diagonal); got 2147483647");
  p.window_right = 0;
  expect_ok(p);
  p.window_right = -1;
  expect_ok(p);
}

TEST(ResolveWindow, FullBandedAndCausal) {
  auto same = [](Window a, Window b) { return a.left == b.left && a.right == b.right; };
  // (causal, left, right, seqlen_q, seqlen_k) -> kernel window
  EXPECT_TRUE(same(resolve_window(false, -1, -1, 100, 300), {-1, -1}));   // full attention
  EXPECT_TRUE(same(resolve_window(true, -1, -1, 100, 300), {300, 0}));    // causal
  EXPECT_TRUE(same(resolve_window(false, -1, 0, 100, 300), {300, 0}));    // causal spelled as a window
  EXPECT_TRUE(same(resolve_window(true, 50, -1, 100, 300), {50, 0}));
  EXPECT_TRUE(same(resolve_window(false, 7, -1, 100, 300), {7, 100}));
  EXPECT_TRUE(same(resolve_window(false, -1, 3, 100, 300), {300, 3}));
  // Bounds past the sequences are clamped (no overflow in the kernels).
  EXPECT_TRUE(same(resolve_window(false, std::numeric_limits<int>::max(),
                                  std::numeric_limits<int>::max(), 100, 300), {300, 100}));
}

TEST(Validate, Softcap) {
  const std::string prefix = "softcap must be finite and >= 0 (0: no softcap); got ";
  ForwardParams p = valid_params();
  p.softcap = -1.f;
  expect_error(p, Status::kInvalidArgument, prefix + "-1");
  p.softcap = std::numeric_limits<float>::infinity();
  expect_error(p, Status::kInvalidArgument, prefix + "inf");
  p.softcap = std::numeric_limits<float>::quiet_NaN();
  expect_error(p, Status::kInvalidArgument, prefix + "nan");
  p.softcap = 30.f;
  expect_ok(p);
}

TEST(Validate, BandedMaskNeedsInt32Headroom) {
  ForwardParams p = valid_params();
  p.batch = p.heads_q = p.heads_kv = 1;
  p.seqlen_q = 2;
  p.seqlen_k = std::numeric_limits<int>::max() - 1;
  expect_ok(p);  // full attention has no key - row arithmetic
  p.window_left = 100;
  expect_error(p, Status::kInvalidArgument,
               "seqlen_q + seqlen_k must be at most 2147483647 with causal or a window; got "
               "2147483648");
  p.window_left = -1;
  p.causal = true;
  expect_error(p, Status::kInvalidArgument,
               "seqlen_q + seqlen_k must be at most 2147483647 with causal or a window; got "
               "2147483648");
  p.seqlen_q = 1;
  expect_ok(p);
}

TEST(Validate, RowCountsMustFitInt32) {
  ForwardParams p = valid_params();
  p.batch = 65536;
  p.seqlen_q = 65536;
  p.heads_q = 1;
  p.heads_kv = 1;
  p.seqlen_k = 1;
  expect_error(p, Status::kInvalidArgument,
               "batch * seqlen_q * num_heads_q must be at most 2147483647 (int32 row index); "
               "got 4294967296");
  p = valid_params();
  p.seqlen_k = std::numeric_limits<int>::max();
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = 1;
  p.batch = 1;
  expect_ok(p);  // exactly INT32_MAX rows is still representable
  p.batch = 2;
  expect_error(p, Status::kInvalidArgument,
               "batch * seqlen_k * num_heads_kv must be at most 2147483647 (int32 row index); "
               "got 4294967294");
}

TEST(Validate, RowCountOverflowingInt64Saturates) {
  ForwardParams p = valid_params();
  p.batch = p.seqlen_q = p.heads_q = p.heads_kv = std::numeric_limits<int>::max();
  const CheckResult r = validate_forward(p, all_built());
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_EQ(r.message, "batch * seqlen_q * num_heads_q must be at most 2147483647 (int32 row index); "
                       "got 9223372036854775807");
}

TEST(Validate, LseMustBeFloatAligned) {
  ForwardParams p = valid_params();
  p.lse = reinterpret_cast<float*>(uintptr_t{0x500002});
  expect_error(p, Status::kInvalidArgument, "lse: pointer must be 4-byte aligned; got 0x500002");
}

TEST(Validate, SinksMustBeFloatAligned) {
  ForwardParams p = valid_params();
  p.sinks = reinterpret_cast<const float*>(uintptr_t{0x500001});
  expect_error(p, Status::kInvalidArgument, "sinks: pointer must be 4-byte aligned; got 0x500001");
  p.sinks = reinterpret_cast<const float*>(uintptr_t{0x500004});
  expect_ok(p);
}

// Zero-sized inputs are defined: tensors with no elements are not accessed,
// so null pointers (as torch gives for empty tensors) are fine there.
TEST(Validate, ZeroBatchNeedsNoPointers) {
  ForwardParams p;
  p.dtype = DType::kFloat16;
  p.heads_q = p.heads_kv = 1;
  p.head_dim = 64;
  p.seqlen_q = p.seqlen_k = 10;
  expect_ok(p);
}

TEST(Validate, ZeroSeqlenQNeedsNoQOrOut) {
  ForwardParams p = valid_params();
  p.seqlen_q = 0;
  p.q.data = p.out.data = nullptr;
  expect_ok(p);
  p.k.data = nullptr;  // k is still an input with elements
  expect_error(p, Status::kInvalidArgument, "k: expected a non-null data pointer; got NULL");
}

TEST(Validate, ZeroSeqlenKNeedsNoKOrV) {
  ForwardParams p = valid_params();
  p.seqlen_k = 0;
  p.k.data = p.v.data = nullptr;
  expect_ok(p);
  p.out.data = nullptr;  // out is still written (zeros)
  expect_error(p, Status::kInvalidArgument, "out: expected a non-null data pointer; got NULL");
}

ForwardParams valid_varlen_params() {
  ForwardParams p = valid_params();
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0x600000});
  p.cu_seqlens_k = reinterpret_cast<const int32_t*>(uintptr_t{0x700000});
  p.total_q = 1000;
  p.total_k = 3000;
  return p;
}

TEST(Validate, VarlenCuSeqlens) {
  ForwardParams p = valid_varlen_params();
  expect_ok(p);
  p.cu_seqlens_q = nullptr;
  expect_error(p, Status::kInvalidArgument,
               "cu_seqlens_k: packed k and v (varlen) need cu_seqlens_q too; got cu_seqlens_q = "
               "NULL, cu_seqlens_k = 0x700000");
  p = valid_params();
  p.seqused_q = reinterpret_cast<const int32_t*>(uintptr_t{0x800000});
  expect_error(p, Status::kInvalidArgument, "seqused_q: only with cu_seqlens_q (varlen); got 0x800000");
  // Without varlen, seqused_k is a KV cache's per-batch key count.
  p = valid_params();
  p.seqused_k = reinterpret_cast<const int32_t*>(uintptr_t{0x800000});
  expect_ok(p);
}

TEST(Validate, KvCacheRules) {
  const auto* array = reinterpret_cast<const int32_t*>(uintptr_t{0x900000});
  ForwardParams p = valid_params();
  p.kv_batch_idx = array;
  p.leftpad_k = array;
  p.cache_batch = 7;
  expect_ok(p);
  p.cache_batch = -1;
  expect_error(p, Status::kInvalidArgument, "cache_batch must be >= 0 (0: batch); got -1");
  p = valid_varlen_params();
  p.leftpad_k = array;
  expect_error(p, Status::kUnsupported,
               "leftpad_k: a KV cache is read from unpacked k and v; not supported with varlen k "
               "(cu_seqlens_k)");
  p = valid_params(DType::kFloat8E4M3, 128);
  p.page_table = array;
  expect_error(p, Status::kUnsupported,
               "page_table: the KV cache kernel takes bf16 or fp16; not supported with dtype e4m3 (FP8)");
  p = valid_params();
  p.kv_batch_idx = reinterpret_cast<const int32_t*>(uintptr_t{0x900002});
  expect_error(p, Status::kInvalidArgument, "kv_batch_idx: pointer must be 4-byte aligned; got 0x900002");
}

TEST(Validate, AppendAndRotaryRules) {
  const auto* seqlens = reinterpret_cast<const int32_t*>(uintptr_t{0x900000});
  const auto* table = reinterpret_cast<const void*>(uintptr_t{0xa00000});
  ForwardParams p = valid_params();
  p.seqused_k = seqlens;
  p.seqlen_new = 3;
  p.k_new = testing::contiguous(reinterpret_cast<void*>(uintptr_t{0xb00000}), 3, p.heads_kv, 128);
  p.v_new = testing::contiguous(reinterpret_cast<void*>(uintptr_t{0xc00000}), 3, p.heads_kv, 128);
  expect_ok(p);
  p.rotary_dim = 64;
  p.rotary_cos = table;
  p.rotary_sin = table;
  p.rotary_seqlen = p.seqlen_k;
  expect_ok(p);

  ForwardParams bad = p;
  bad.rotary_dim = 40;
  expect_error(bad, Status::kUnsupported,
               "rotary_dim: multiples of 16 up to head_dim (128) are supported; got 40");
  bad.rotary_dim = 144;
  expect_error(bad, Status::kUnsupported,
               "rotary_dim: multiples of 16 up to head_dim (128) are supported; got 144");
  bad = p;
  bad.rotary_seqlen = p.seqlen_k - 1;
  expect_error(bad, Status::kInvalidArgument,
               "rotary_seqlen: the cos / sin tables must cover every cache position, "
               "rotary_seqlen >= seqlen_k (255); got 254");
  bad = p;
  bad.rotary_sin = nullptr;
  expect_error(bad, Status::kInvalidArgument,
               "rotary_sin: expected a (rotary_seqlen, rotary_dim / 2) table with rotary_dim 64; got NULL");
  bad = p;
  bad.rotary_cos = reinterpret_cast<const void*>(uintptr_t{0xa00001});
  expect_error(bad, Status::kInvalidArgument, "rotary_cos: pointer must be 2-byte aligned; got 0xa00001");
  bad = p;
  bad.seqused_k = nullptr;
  expect_error(bad, Status::kInvalidArgument,
               "seqused_k: appending (seqlen_new = 3) needs each batch entry's cached key count, "
               "where its new keys go; got NULL");
  // Varlen q: k_new and v_new packed like q, one new key per query.
  ForwardParams varlen_q = p;
  varlen_q.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0x600000});
  varlen_q.total_q = 10;
  varlen_q.num_splits = 1;
  varlen_q.seqlen_new = varlen_q.seqlen_q;
  expect_ok(varlen_q);
  bad = varlen_q;
  bad.seqlen_new = 3;
  expect_error(bad, Status::kInvalidArgument,
               "seqlen_new: with varlen q (cu_seqlens_q) k_new and v_new are packed like q, one "
               "new key per query, so seqlen_new must be seqlen_q (113); got 3");
  bad = varlen_q;
  bad.cu_seqlens_k = reinterpret_cast<const int32_t*>(uintptr_t{0x700000});
  bad.total_k = 10;
  expect_error(bad, Status::kUnsupported,
               "seqlen_new: appending (seqlen_new = 113) writes a KV cache of unpacked k and v; "
               "not supported with varlen k (cu_seqlens_k)");
  bad = p;
  bad.k_new.data = nullptr;
  expect_error(bad, Status::kInvalidArgument, "k_new: expected a non-null data pointer; got NULL");
  bad = p;
  bad.v_new.stride[1] = 100;
  expect_error(bad, Status::kInvalidArgument,
               "v_new: seqlen stride must be a multiple of 8 elements (16 bytes, needed by TMA); got 100");
  bad = p;
  bad.seqlen_new = -1;
  expect_error(bad, Status::kInvalidArgument, "seqlen_new must be >= 0 (0: no append); got -1");
  bad = p;
  bad.seqlen_q = 0;
  expect_error(bad, Status::kInvalidArgument,
               "seqlen_q must be >= 1 when appending: the attention kernel writes the new keys");
  bad = p;
  bad.seqlen_new = 0;
  expect_error(bad, Status::kInvalidArgument,
               "rotary_dim: rotary embedding applies to appended keys and needs seqlen_new >= 1; "
               "got rotary_dim 64 with seqlen_new 0");
  bad = p;
  bad.seqlen_new = std::numeric_limits<int32_t>::max();
  expect_error(bad, Status::kInvalidArgument,
               "seqlen_k + seqlen_new must be at most 2147483647; got 2147483902");
}

TEST(Validate, PagedKvRules) {
  ForwardParams p = valid_params();
  p.page_table = reinterpret_cast<const int32_t*>(uintptr_t{0x900000});
  p.page_size = 16;
  p.cache_batch = 40;
  p.page_table_stride = (p.seqlen_k + 15) / 16;
  expect_ok(p);
  ForwardParams q = p;
  q.page_size = 24;
  expect_error(q, Status::kUnsupported,
               "page_size: multiples of 16 are supported (one TMA box of 16 keys never straddles "
               "pages); got 24");
  q = p;
  q.page_size = 0;
  expect_error(q, Status::kInvalidArgument, "page_size must be >= 1 with a page table; got 0");
  q = p;
  q.page_table_stride -= 1;
  expect_error(q, Status::kInvalidArgument,
               "page_table_stride must be >= ceil(seqlen_k / page_size) = " +
                   std::to_string(p.page_table_stride) + " (pages per batch entry); got " +
                   std::to_string(p.page_table_stride - 1));
  q = p;
  q.cache_batch = 0;
  expect_error(q, Status::kInvalidArgument,
               "cache_batch: the number of pages, must be >= 1 with a page table; got 0");
  q = p;
  q.leftpad_k = p.page_table;
  expect_error(q, Status::kUnsupported,
               "leftpad_k: not supported with a page table (page_table maps each batch entry's keys "
               "to pages)");
}

TEST(Validate, SplitRules) {
  ForwardParams p = valid_params();
  p.num_splits = 129;
  expect_error(p, Status::kInvalidArgument, "num_splits must be in [0, 128] (0: chosen, 1: no split); got 129");
  p.num_splits = 3;
  const size_t needed = flash3::host::split_workspace_bytes(p, 3);
  EXPECT_EQ(needed, size_t{3} * p.batch * p.heads_q * p.seqlen_q * (p.head_dim + 1) * 4);
  expect_error(p, Status::kInvalidArgument,
               "workspace: expected device memory of at least " + std::to_string(needed) +
                   " bytes (forward_workspace_size); got NULL");
  p.workspace = reinterpret_cast<void*>(uintptr_t{0xA00000});
  p.workspace_bytes = needed - 1;
  expect_error(p, Status::kInvalidArgument,
               "workspace_bytes: expected at least " + std::to_string(needed) +
                   " (forward_workspace_size); got " + std::to_string(needed - 1));
  p.workspace_bytes = needed;
  expect_ok(p);
  ForwardParams v = valid_varlen_params();
  v.num_splits = 2;
  expect_error(v, Status::kUnsupported,
               "num_splits: split-KV takes bf16 or fp16 and unpacked k and v; not supported "
               "with varlen k (cu_seqlens_k); got 2");
}

// cu_seqlens_q alone: varlen q over a KV cache (packed q and out, a cache's k and v).
TEST(Validate, VarlenQOverCache) {
  ForwardParams p = valid_params();
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0x600000});
  p.seqused_k = reinterpret_cast<const int32_t*>(uintptr_t{0x800000});
  p.total_q = 10;
  p.num_splits = 1;
  expect_ok(p);
  EXPECT_TRUE(flash3::host::uses_kv_cache_kernel(p, 1));
  ForwardParams bad = p;
  bad.total_q = -1;
  expect_error(bad, Status::kInvalidArgument, "total_q must be >= 0; got -1");
  bad = p;
  bad.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0x600002});
  expect_error(bad, Status::kInvalidArgument, "cu_seqlens_q: pointer must be 4-byte aligned; got 0x600002");
  bad = valid_params(DType::kFloat8E4M3, 128);
  bad.cu_seqlens_q = p.cu_seqlens_q;
  bad.total_q = 10;
  expect_error(bad, Status::kUnsupported, "cu_seqlens_q: varlen is not supported with dtype e4m3 (FP8)");
  // Split-KV and its workspace apply as without varlen q (sized by seqlen_q, the longest).
  p.num_splits = 2;
  expect_error(p, Status::kInvalidArgument,
               "workspace: expected device memory of at least " +
                   std::to_string(flash3::host::split_workspace_bytes(p, 2)) +
                   " bytes (forward_workspace_size); got NULL");
}

TEST(Validate, AlibiRules) {
  ForwardParams p = valid_params();
  p.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0xb00000});
  expect_ok(p);
  p.alibi_slopes_batch_stride = 8;
  expect_ok(p);
  ForwardParams bad = p;
  bad.alibi_slopes_batch_stride = -1;
  expect_error(bad, Status::kInvalidArgument,
               "alibi_slopes_batch_stride must be >= 0 (0: one slope per head); got -1");
  bad = p;
  bad.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0xb00002});
  expect_error(bad, Status::kInvalidArgument, "alibi_slopes: pointer must be 4-byte aligned; got 0xb00002");
  bad = p;
  bad.softcap = 5.f;
  expect_error(bad, Status::kUnsupported, "alibi_slopes: not supported with softcap; got softcap 5");
  bad = valid_params(DType::kFloat8E4M3, 128);
  bad.alibi_slopes = p.alibi_slopes;
  expect_error(bad, Status::kUnsupported, "alibi_slopes: not supported with dtype e4m3 (FP8)");
  bad = valid_params(DType::kBFloat16, 256);
  bad.alibi_slopes = p.alibi_slopes;
  expect_error(bad, Status::kUnsupported, "alibi_slopes: supported up to head_dim 192; got head_dim 256");
}

TEST(Validate, PackGqaValues) {
  ForwardParams p = valid_params();
  for (flash3::PackGqa mode : {flash3::PackGqa::kAuto, flash3::PackGqa::kOff, flash3::PackGqa::kOn}) {
    p.pack_gqa = mode;
    expect_ok(p);
  }
  p.pack_gqa = static_cast<flash3::PackGqa>(3);
  expect_error(p, Status::kInvalidArgument, "pack_gqa: expected auto (0), off (1) or on (2); got 3");
}

TEST(SplitKv, Heuristic) {
  using flash3::host::choose_splits;
  EXPECT_EQ(choose_splits(32, 32, 132), 4);    // batch 1, 32 heads, 4k keys: one full wave
  EXPECT_EQ(choose_splits(64, 32, 132), 2);
  EXPECT_EQ(choose_splits(66, 32, 132), 1);    // already half the SMs
  EXPECT_EQ(choose_splits(8, 32, 132), 16);    // by the keys: 2 blocks per split
  EXPECT_EQ(choose_splits(1, 1000, 132), 128); // at most kMaxSplits
  EXPECT_EQ(choose_splits(8, 3, 132), 1);
  ForwardParams p = valid_params();
  p.batch = 1;
  p.seqlen_q = 1;
  p.heads_q = 32;
  p.heads_kv = 8;
  p.seqlen_k = 4096;
  EXPECT_EQ(flash3::host::resolve_splits(p, 132), 1);  // no workspace: no split
  // PackGQA: 8 CTAs of 4 heads each, 32 key blocks: 16 splits of 2 blocks.
  EXPECT_EQ(flash3::host::resolve_splits(p, 132, false), 16);
  p.workspace = reinterpret_cast<void*>(uintptr_t{0xA00000});
  p.workspace_bytes = flash3::host::split_workspace_bytes(p, 3);
  EXPECT_EQ(flash3::host::resolve_splits(p, 132), 3);  // what the workspace holds
  EXPECT_TRUE(flash3::host::uses_kv_cache_kernel(p, 1));  // packed
  p.heads_kv = 32;  // no GQA: 32 CTAs, 4 splits each
  p.workspace = nullptr;
  EXPECT_EQ(flash3::host::resolve_splits(p, 132, false), 4);
  EXPECT_FALSE(flash3::host::uses_kv_cache_kernel(p, 1));
  EXPECT_TRUE(flash3::host::uses_kv_cache_kernel(p, 2));
}

TEST(PackGqa, Factor) {
  using flash3::kernels::pack_gqa_factor;
  EXPECT_EQ(pack_gqa_factor(1, 4, 128), 4);     // decode: one tile instead of 4
  EXPECT_EQ(pack_gqa_factor(33, 4, 128), 4);    // 2 tiles instead of 4
  EXPECT_EQ(pack_gqa_factor(130, 8, 128), 8);   // 9 instead of 16
  EXPECT_EQ(pack_gqa_factor(128, 4, 128), 1);   // 4 either way
  EXPECT_EQ(pack_gqa_factor(100, 4, 128), 1);   // 4 either way
  EXPECT_EQ(pack_gqa_factor(1, 1, 128), 1);     // no GQA
  EXPECT_EQ(pack_gqa_factor(1, 7, 128), 7);     // any group size
  using flash3::PackGqa;
  EXPECT_EQ(pack_gqa_factor(128, 4, 128, PackGqa::kOn), 4);   // forced
  EXPECT_EQ(pack_gqa_factor(1, 4, 128, PackGqa::kOff), 1);
  EXPECT_EQ(pack_gqa_factor(1, 1, 128, PackGqa::kOn), 1);     // nothing to pack
}

TEST(PackGqa, ChoosesTheKernel) {
  ForwardParams p = valid_params();
  p.seqlen_q = 1;
  p.heads_q = 32;
  p.heads_kv = 8;
  EXPECT_TRUE(flash3::host::uses_kv_cache_kernel(p, 1));  // auto packs decode
  p.pack_gqa = flash3::PackGqa::kOff;
  EXPECT_FALSE(flash3::host::uses_kv_cache_kernel(p, 1));
  p.seqlen_q = 512;
  p.pack_gqa = flash3::PackGqa::kAuto;
  EXPECT_FALSE(flash3::host::uses_kv_cache_kernel(p, 1));
  p.pack_gqa = flash3::PackGqa::kOn;
  EXPECT_TRUE(flash3::host::uses_kv_cache_kernel(p, 1));
}

TEST(ValidateCombine, Rules) {
  flash3::CombineParams c;
  float buffer[4] = {};
  c.out_partial = buffer;
  c.lse_partial = buffer;
  c.out.data = buffer;
  c.num_splits = 3;
  c.batch = 2;
  c.seqlen = 1;
  c.heads = 4;
  c.head_dim = 128;
  EXPECT_TRUE(flash3::host::validate_combine(c).ok());
  flash3::CombineParams d = c;
  d.head_dim = 512;
  EXPECT_EQ(flash3::host::validate_combine(d).message, "head_dim: combine supports up to 256; got 512");
  d = c;
  d.out_dtype = DType::kFloat8E4M3;
  EXPECT_EQ(flash3::host::validate_combine(d).message,
            "out_dtype: expected fp16 (0), bf16 (1) or fp32 (3); got 2");
  d = c;
  d.num_splits = 0;
  EXPECT_EQ(flash3::host::validate_combine(d).message, "num_splits must be >= 1; got 0");
  d = c;
  d.out_partial_stride[4] = 2;
  EXPECT_EQ(flash3::host::validate_combine(d).message,
            "out_partial: head_dim stride must be 1 (last dimension contiguous); got 2");
  d = c;
  d.lse_partial = nullptr;
  EXPECT_EQ(flash3::host::validate_combine(d).message, "lse_partial: expected a non-null data pointer; got NULL");
}

TEST(Validate, Float32IsOnlyForCombine) {
  ForwardParams p = valid_params();
  p.dtype = DType::kFloat32;
  const CheckResult r = validate_forward(p, all_built());
  EXPECT_EQ(r.status, Status::kInvalidArgument);
}

TEST(Validate, VarlenArraysAndTotals) {
  ForwardParams p = valid_varlen_params();
  p.seqused_q = reinterpret_cast<const int32_t*>(uintptr_t{0x800002});
  expect_error(p, Status::kInvalidArgument, "seqused_q: pointer must be 4-byte aligned; got 0x800002");
  p = valid_varlen_params();
  p.total_k = -1;
  expect_error(p, Status::kInvalidArgument, "total_k must be >= 0; got -1");
  p = valid_varlen_params();
  p.total_q = std::numeric_limits<int32_t>::max() / 2;
  expect_error(p, Status::kInvalidArgument,
               "total_q * num_heads_q must be at most 2147483647 (int32 row index); got 8589934584");
  p.heads_q = p.heads_kv = 1;
  p.total_k = std::numeric_limits<int32_t>::max() / 2 + 2;
  expect_error(p, Status::kInvalidArgument,
               "total_q + total_k must be at most 2147483647 with varlen; got 2147483648");
}

// Varlen: q, k, v, out are checked as tensors only if they have rows;
// batch * seqlen is not a row count there (seqlen is the longest sequence).
TEST(Validate, VarlenRowsAreTotals) {
  ForwardParams p = valid_varlen_params();
  p.batch = 1 << 20;
  p.seqlen_q = p.seqlen_k = 1 << 20;
  expect_ok(p);
  p.total_k = 0;
  p.k.data = p.v.data = nullptr;
  expect_ok(p);
  p.total_q = 0;
  p.q.data = p.out.data = nullptr;
  expect_ok(p);
}

TEST(ResolveWindow, VarlenIsAlwaysABandOfTotals) {
  ForwardParams p = valid_varlen_params();
  resolve_window(p);
  EXPECT_EQ(p.window_left, 3000);  // full attention: no sequence reaches either edge
  EXPECT_EQ(p.window_right, 1000);
  p = valid_varlen_params();
  p.causal = true;
  p.window_left = 5;
  resolve_window(p);
  EXPECT_EQ(p.window_left, 5);
  EXPECT_EQ(p.window_right, 0);
}

// FP8: e4m3 q, k and V^T, bf16 out, scales per block.
ForwardParams valid_fp8_params(int head_dim = 128) {
  ForwardParams p = valid_params(DType::kFloat8E4M3, head_dim);
  const float* scales = reinterpret_cast<const float*>(uintptr_t{0xa00000});
  p.q_scale = {scales, {8 * 1, 1, 0}};
  p.k_scale = {scales, {2 * 2, 2, 1}};
  p.v_scale = {scales, {0, 0, 0}};
  p.v.stride[0] = int64_t{p.heads_kv} * p.head_dim * fp8_vt_keys(p.seqlen_k);  // V^T
  p.v.stride[1] = fp8_vt_keys(p.seqlen_k);
  p.v.stride[2] = int64_t{p.head_dim} * fp8_vt_keys(p.seqlen_k);
  return p;
}

TEST(ValidateFp8, AcceptsEveryHeadDim) {
  for (int h : kFp8HeadDims) expect_ok(valid_fp8_params(h));
  ForwardParams p = valid_fp8_params();
  p.causal = true;
  p.window_left = 64;
  expect_ok(p);
}

TEST(ValidateFp8, RefusesHeadDimsNotPowerOfTwo) {
  for (int h : {96, 192})
    expect_error(valid_fp8_params(h), Status::kUnsupported,
                 "head_dim: dtype e4m3 (FP8) supports head dims 64, 128, 256 (a power of two for "
                 "the Hadamard transform); got " + std::to_string(h));
}

TEST(ValidateFp8, NeedsScales) {
  ForwardParams p = valid_fp8_params();
  p.k_scale.data = nullptr;
  expect_error(p, Status::kInvalidArgument,
               "k_scale: dtype e4m3 (FP8) needs dequantization scales; got NULL");
  p = valid_fp8_params();
  p.v_scale.stride[2] = -1;
  expect_error(p, Status::kInvalidArgument, "v_scale: stride[2] must be >= 0; got -1");
  p = valid_fp8_params();
  p.q_scale.data = reinterpret_cast<const float*>(uintptr_t{0xa00002});
  expect_error(p, Status::kInvalidArgument, "q_scale: pointer must be 4-byte aligned; got 0xa00002");
}

TEST(ValidateFp8, RefusesSoftcapAndVarlen) {
  ForwardParams p = valid_fp8_params();
  p.softcap = 5.f;
  expect_error(p, Status::kUnsupported, "softcap: not supported with dtype e4m3 (FP8); got 5");
  p = valid_fp8_params();
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0xb00000});
  p.cu_seqlens_k = p.cu_seqlens_q;
  p.total_q = 100;
  p.total_k = 100;
  expect_error(p, Status::kUnsupported, "cu_seqlens_q: varlen is not supported with dtype e4m3 (FP8)");
}

TEST(ValidateFp8, StridesInBytes) {
  ForwardParams p = valid_fp8_params();
  p.k.stride[1] = 8;  // 8 bytes: not a TMA multiple of 16
  expect_error(p, Status::kInvalidArgument,
               "k: seqlen stride must be a multiple of 16 elements (16 bytes, needed by TMA); got 8");
  p = valid_fp8_params();
  p.out.stride[1] = 8;  // out is bf16: 8 elements are 16 bytes
  expect_ok(p);
}

TEST(ValidateFp8, NotBuilt) {
  BuildConfig none;
  expect_error(valid_fp8_params(), Status::kUnsupported,
               "dtype: e4m3 is not built into this library; rebuild with FLASH3_FP8=ON", none);
  BuildConfig only_64;
  only_64.add(DType::kFloat8E4M3, 64);
  only_64.add(DType::kBFloat16, 128);
  expect_error(valid_fp8_params(128), Status::kUnsupported,
               "no kernel built for dtype e4m3 with head_dim 128", only_64);
}

QuantizeFp8Params valid_quantize_params() {
  const ForwardParams f = valid_params();
  QuantizeFp8Params p;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.dtype = DType::kBFloat16;
  p.batch = f.batch;
  p.seqlen_q = f.seqlen_q;
  p.seqlen_k = f.seqlen_k;
  p.heads_q = f.heads_q;
  p.heads_kv = f.heads_kv;
  p.head_dim = f.head_dim;
  const ForwardParams g = valid_fp8_params();
  p.q_out = g.q;
  p.k_out = g.k;
  p.vt_out = g.v;
  p.q_scale = reinterpret_cast<float*>(uintptr_t{0xc00000});
  p.k_scale = reinterpret_cast<float*>(uintptr_t{0xc10000});
  p.v_scale = reinterpret_cast<float*>(uintptr_t{0xc20000});
  return p;
}

TEST(ValidateQuantizeFp8, Rules) {
  EXPECT_TRUE(validate_quantize_fp8(valid_quantize_params()).ok());
  QuantizeFp8Params p = valid_quantize_params();
  p.scaling = static_cast<Fp8Scaling>(3);
  CheckResult r = validate_quantize_fp8(p);
  EXPECT_EQ(r.message, "scaling: expected per-block (0) or per-tensor (1); got 3");
  p = valid_quantize_params();
  p.k_scale = nullptr;
  r = validate_quantize_fp8(p);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_EQ(r.message, "k_scale: expected fp32 device memory for the scales; got NULL");
  p = valid_quantize_params();
  p.head_dim = 96;
  r = validate_quantize_fp8(p);
  EXPECT_EQ(r.status, Status::kUnsupported);
  EXPECT_EQ(r.message,
            "head_dim: dtype e4m3 (FP8) supports head dims 64, 128, 256 (a power of two for the "
            "Hadamard transform); got 96");
  p.head_dim = 80;
  r = validate_quantize_fp8(p);
  EXPECT_EQ(r.message, "head_dim: supported head dims are 64, 96, 128, 192, 256; got 80");
  p = valid_quantize_params();
  p.vt_out.data = nullptr;
  r = validate_quantize_fp8(p);
  EXPECT_EQ(r.message, "vt_out: expected a non-null data pointer; got NULL");
  // e4m3 input: v only, so q, k and the scales may be absent.
  p = valid_quantize_params();
  p.dtype = DType::kFloat8E4M3;
  p.q = p.k = p.q_out = p.k_out = Tensor4d{};
  p.q_scale = p.k_scale = p.v_scale = nullptr;
  p.v = valid_fp8_params().k;
  EXPECT_TRUE(validate_quantize_fp8(p).ok()) << validate_quantize_fp8(p).message;
}

TEST(FP8Layout, KeyPositionIsAPermutationOfEach16) {
  // 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15 along the positions.
  const int order[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};
  for (int p = 0; p < 16; ++p) EXPECT_EQ(fp8_vt_key_position(order[p]), p);
  EXPECT_EQ(fp8_vt_key_position(16 + 8), 16 + 2);
  EXPECT_EQ(fp8_vt_keys(1), 128);
  EXPECT_EQ(fp8_vt_keys(128), 128);
  EXPECT_EQ(fp8_vt_keys(129), 256);
}

TEST(Validate, HeadDimV) {
  expect_ok(pair_params());
  expect_ok(pair_params(DType::kFloat16));
  ForwardParams same = valid_params(DType::kBFloat16, 192);
  same.head_dim_v = 192;  // spelled out: the same kernel as 0
  expect_ok(same);
  EXPECT_EQ(head_dim_v(same), 192);
  same.head_dim_v = 0;
  EXPECT_EQ(head_dim_v(same), 192);
  ForwardParams p = pair_params();
  p.head_dim_v = -1;
  expect_error(p, Status::kInvalidArgument, "head_dim_v must be >= 0 (0: head_dim); got -1");
  p = valid_params(DType::kBFloat16, 128);
  p.head_dim_v = 64;
  expect_error(p, Status::kUnsupported,
               "head_dim_v: differs from head_dim only as (head_dim, head_dim_v) = (192, 128); got "
               "(128, 64)");
  p = pair_params();
  p.dtype = DType::kFloat8E4M3;  // FP8 has no head dim 192
  expect_error(p, Status::kUnsupported,
               "head_dim: dtype e4m3 (FP8) supports head dims 64, 128, 256 (a power of two for the "
               "Hadamard transform); got 192");
  // What only the KV-cache kernel does, by name.
  const int32_t* lengths = reinterpret_cast<const int32_t*>(uintptr_t{0x2000000});
  p = pair_params();
  p.seqused_k = lengths;
  expect_error(p, Status::kUnsupported,
               "seqused_k: the KV-cache kernel takes head_dim_v = head_dim; got (192, 128)");
  p = pair_params();
  p.page_table = lengths;
  expect_error(p, Status::kUnsupported,
               "page_table: the KV-cache kernel takes head_dim_v = head_dim; got (192, 128)");
  p = pair_params();
  p.num_splits = 2;
  expect_error(p, Status::kUnsupported,
               "num_splits: the KV-cache kernel takes head_dim_v = head_dim; got (192, 128)");
  p = pair_params();
  p.cu_seqlens_q = lengths;
  p.total_q = 100;
  expect_error(p, Status::kUnsupported,
               "cu_seqlens_q without cu_seqlens_k: the KV-cache kernel takes head_dim_v = head_dim; "
               "got (192, 128)");
  // Varlen (both cu_seqlens) is the varlen kernel's: accepted.
  p.cu_seqlens_k = lengths;
  p.total_k = 200;
  expect_ok(p);
  // Neither PackGQA nor a split is chosen for it (the KV-cache kernel's).
  p = pair_params();
  p.seqlen_q = 1;
  p.heads_q = 32;
  p.heads_kv = 8;
  p.pack_gqa = PackGqa::kOn;
  EXPECT_FALSE(uses_kv_cache_kernel(p, 1));
  EXPECT_EQ(resolve_splits(p, 132), 1);
}

TEST(Validate, HeadDimPairNotBuilt) {
  BuildConfig equal_only;
  for (DType d : kKnownDTypes)
    for (int h : kSupportedHeadDims) equal_only.add(d, h);
  expect_error(pair_params(), Status::kUnsupported,
               "head_dim_v: (192, 128) is not built for dtype bf16; rebuild with "
               "FLASH3_HEAD_DIM_PAIRS including 192x128",
               equal_only);
  // The pair alone: its kernel, without 192's.
  BuildConfig pair_only;
  pair_only.add(DType::kBFloat16, 192, 128);
  pair_only.add(DType::kBFloat16, 64);
  expect_ok(pair_params(), pair_only);
  EXPECT_TRUE(pair_only.has(DType::kBFloat16, 192, 128));
  EXPECT_FALSE(pair_only.has(DType::kFloat16, 192, 128));
  EXPECT_FALSE(pair_only.has(DType::kBFloat16, 192));
  pair_only.add(DType::kBFloat16, 128, 64);  // not a pair the kernels know: ignored
  EXPECT_FALSE(pair_only.has(DType::kBFloat16, 128, 64));
}

TEST(BuildConfig, Lists) {
  BuildConfig c;
  EXPECT_EQ(c.dtype_list(), "none");
  EXPECT_EQ(c.head_dim_list(), "none");
  c.add(DType::kFloat16, 256);
  c.add(DType::kBFloat16, 64);
  c.add(DType::kBFloat16, 80);  // not a supported head dim: ignored
  EXPECT_EQ(c.dtype_list(), "bf16, fp16");
  EXPECT_EQ(c.head_dim_list(), "64, 256");
  EXPECT_TRUE(c.has(DType::kFloat16, 256));
  EXPECT_FALSE(c.has(DType::kFloat16, 64));
  EXPECT_FALSE(c.has_head_dim(80));
}

}  // namespace
}  // namespace flash3::host
