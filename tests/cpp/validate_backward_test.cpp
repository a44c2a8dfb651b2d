// validate_backward and the workspace layout, with exact messages. No GPU needed.
#include <gtest/gtest.h>

#include "host/bwd_workspace.hpp"
#include "host/validate.hpp"
#include "test_params.hpp"

namespace flash3::host {
namespace {

using flash3::testing::valid_backward_params;

BuildConfig all_built() {
  BuildConfig c;
  for (DType d : kKnownDTypes)
    for (int h : kSupportedHeadDims) c.add(d, h);
  c.add(DType::kBFloat16, 192, 128);
  return c;
}

void expect_error(const BackwardParams& p, Status status, const std::string& message) {
  const CheckResult r = validate_backward(p, all_built());
  EXPECT_EQ(r.status, status) << r.message;
  EXPECT_EQ(r.message, message);
}

TEST(ValidateBackward, AcceptsEveryDtypeAndHeadDim) {
  for (DType d : kKnownDTypes)
    for (int h : kSupportedHeadDims) {
      const CheckResult r = validate_backward(valid_backward_params(d, h), all_built());
      EXPECT_TRUE(r.ok()) << r.message;
    }
}

TEST(ValidateBackward, HeadDimV) {
  // forward_view carries head_dim_v: the forward's rules apply to it.
  BackwardParams p = valid_backward_params(DType::kBFloat16, 192);
  p.head_dim_v = 128;
  EXPECT_TRUE(validate_backward(p, all_built()).ok()) << validate_backward(p, all_built()).message;
  EXPECT_EQ(forward_view(p).head_dim_v, 128);
  p.dtype = DType::kFloat16;
  expect_error(p, Status::kUnsupported,
               "head_dim_v: (192, 128) is not built for dtype fp16; rebuild with "
               "FLASH3_HEAD_DIM_PAIRS including 192x128");
  p.dtype = DType::kBFloat16;
  p.head_dim_v = 96;
  expect_error(p, Status::kUnsupported,
               "head_dim_v: differs from head_dim only as (head_dim, head_dim_v) = (192, 128); got "
               "(192, 96)");
}

TEST(ValidateBackward, RefusesFp8) {
  expect_error(valid_backward_params(DType::kFloat8E4M3), Status::kUnsupported,
               "dtype: e4m3 (FP8) has a forward only; the backward takes bf16 or fp16");
}

TEST(ValidateBackward, RefusesKvCacheKeyCounts) {
  // The forward reads seqused_k without varlen as a KV cache's key counts;
  // the backward has no such path and must not ignore it.
  BackwardParams p = valid_backward_params();
  p.seqused_k = reinterpret_cast<const int32_t*>(uintptr_t{0x800000});
  expect_error(p, Status::kUnsupported,
               "seqused_k: only with varlen (cu_seqlens_q) in the backward (a KV cache's key "
               "counts are forward only)");
}

TEST(ValidateBackward, RefusesVarlenQAlone) {
  // The forward reads cu_seqlens_q alone as varlen q over a KV cache; the
  // backward takes packed q, k and v only.
  BackwardParams p = valid_backward_params();
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(uintptr_t{0x600000});
  p.total_q = 10;
  expect_error(p, Status::kInvalidArgument,
               "cu_seqlens_q and cu_seqlens_k: give both (varlen) or neither in the backward; got "
               "cu_seqlens_q = 0x600000, cu_seqlens_k = NULL");
}

TEST(ValidateBackward, AlibiAsInTheForward) {
  BackwardParams p = valid_backward_params();
  p.alibi_slopes = reinterpret_cast<const float*>(uintptr_t{0xb00000});
  EXPECT_TRUE(flash3::host::validate_backward(p, all_built()).ok());
  p.softcap = 2.f;
  expect_error(p, Status::kUnsupported, "alibi_slopes: not supported with softcap; got softcap 2");
}

TEST(ValidateBackward, AppliesTheForwardRules) {
  BackwardParams p = valid_backward_params();
  p.heads_kv = 3;
  expect_error(p, Status::kInvalidArgument, "num_heads_q (8) must be divisible by num_heads_kv (3)");
  p = valid_backward_params();
  p.out.stride[3] = 2;
  expect_error(p, Status::kInvalidArgument,
               "out: head_dim stride must be 1 (last dimension contiguous); got 2");
}

TEST(ValidateBackward, ChecksGradientTensors) {
  BackwardParams p = valid_backward_params();
  p.dout.data = nullptr;
  expect_error(p, Status::kInvalidArgument, "dout: expected a non-null data pointer; got NULL");
  p = valid_backward_params();
  p.dq.stride[1] = 12;
  expect_error(p, Status::kInvalidArgument,
               "dq: seqlen stride must be a multiple of 8 elements (16 bytes, needed by TMA); got 12");
  p = valid_backward_params();
  p.dv.stride[3] = 0;
  expect_error(p, Status::kInvalidArgument,
               "dv: head_dim stride must be 1 (last dimension contiguous); got 0");
}

TEST(ValidateBackward, Sinks) {
  BackwardParams p = valid_backward_params();
  p.sinks = reinterpret_cast<const float*>(uintptr_t{0x700002});
  expect_error(p, Status::kInvalidArgument, "sinks: pointer must be 4-byte aligned; got 0x700002");
  p.sinks = reinterpret_cast<const float*>(uintptr_t{0x700000});
  EXPECT_TRUE(validate_backward(p, all_built()).ok());  // sinks without their gradient
  p.dsinks = reinterpret_cast<float*>(uintptr_t{0x800003});
  expect_error(p, Status::kInvalidArgument, "dsinks: pointer must be 4-byte aligned; got 0x800003");
  p.dsinks = reinterpret_cast<float*>(uintptr_t{0x800000});
  const size_t without_partials = p.workspace_bytes;
  p.workspace_bytes = bwd_workspace_layout(p).bytes;  // the sink partials need room too
  EXPECT_GT(p.workspace_bytes, without_partials);
  EXPECT_TRUE(validate_backward(p, all_built()).ok());
  p.sinks = nullptr;
  expect_error(p, Status::kInvalidArgument,
               "dsinks: the gradient of the sinks needs the forward's sinks; got sinks = NULL");
}

TEST(ValidateBackward, NeedsLseAndWorkspace) {
  BackwardParams p = valid_backward_params();
  p.lse = nullptr;
  expect_error(p, Status::kInvalidArgument,
               "lse: expected the forward's LSE, (batch, num_heads_q, seqlen_q) fp32; got NULL");
  p = valid_backward_params();
  const size_t needed = p.workspace_bytes;
  p.workspace = nullptr;
  expect_error(p, Status::kInvalidArgument,
               "workspace: expected device memory of at least " + std::to_string(needed) +
                   " bytes (backward_workspace_size); got NULL");
  p = valid_backward_params();
  p.workspace_bytes -= 1;
  expect_error(p, Status::kInvalidArgument,
               "workspace_bytes: expected at least " + std::to_string(needed) +
                   " (backward_workspace_size); got " + std::to_string(needed - 1));
}

TEST(ValidateBackward, EmptyProblemsNeedNoLseOrWorkspace) {
  BackwardParams p = valid_backward_params();
  p.seqlen_k = 0;
  p.lse = nullptr;
  p.workspace = nullptr;
  p.k.data = p.v.data = p.dk.data = p.dv.data = nullptr;
  EXPECT_TRUE(validate_backward(p, all_built()).ok());
  p = valid_backward_params();
  p.seqlen_q = 0;
  p.lse = nullptr;
  p.workspace = nullptr;
  p.q.data = p.dq.data = p.out.data = p.dout.data = nullptr;
  EXPECT_TRUE(validate_backward(p, all_built()).ok());
}

TEST(BwdWorkspace, PadsRowsToQueryBlocksAndAlignsRegions) {
  // 113 rows -> 2 blocks of 64 = 128 padded rows per (batch, head).
  const BwdWorkspaceLayout l = bwd_workspace_layout(2, 8, 113, 128);
  EXPECT_EQ(l.head_rows, 128);
  const size_t rows = 2 * 8 * 128;
  EXPECT_EQ(l.lse_offset, 0u);
  EXPECT_EQ(l.dpsum_offset, rows * 4);
  EXPECT_EQ(l.dq_accum_offset, 2 * rows * 4);
  EXPECT_EQ(l.dq_accum_bytes, rows * 128 * 4);
  EXPECT_EQ(l.semaphore_offset, l.dq_accum_offset + l.dq_accum_bytes);
  EXPECT_EQ(l.semaphore_bytes, 2u * 8 * 2 * 4);
  EXPECT_EQ(l.bytes, l.semaphore_offset + 256);
  for (size_t offset : {l.dpsum_offset, l.dq_accum_offset, l.semaphore_offset, l.bytes})
    EXPECT_EQ(offset % kWorkspaceAlign, 0u);
}

TEST(BwdWorkspace, VarlenRowsLeaveABlockPerSequenceForPaddingAndShareOneBatch) {
  // 300 packed rows in 3 sequences: each sequence starts on a block boundary
  // at most one block past its packed offset, so 300 + 3 * 64 rows rounded
  // up to 512 per head; no batch dimension.
  const BwdWorkspaceLayout l = bwd_workspace_layout(3, 8, 200, 128, 0, 300);
  EXPECT_EQ(l.head_rows, 512);
  const size_t rows = 8 * 512;
  EXPECT_EQ(l.dpsum_offset, rows * 4);
  EXPECT_EQ(l.dq_accum_bytes, rows * 128 * 4);
  EXPECT_EQ(l.semaphore_bytes, 8u * 8 * 4);
}

TEST(BwdWorkspace, SinkPartialsOnlyWithDsinks) {
  BackwardParams p = valid_backward_params(DType::kBFloat16, 128);
  const BwdWorkspaceLayout without = bwd_workspace_layout(p);
  EXPECT_EQ(without.sink_partials_bytes, 0u);
  EXPECT_EQ(without.bytes, bwd_workspace_layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim).bytes);
  p.sinks = reinterpret_cast<const float*>(uintptr_t{0x700000});
  p.dsinks = reinterpret_cast<float*>(uintptr_t{0x800000});
  const BwdWorkspaceLayout with = bwd_workspace_layout(p);
  const int key_blocks = (p.seqlen_k + 127) / 128;  // d = 128: 128 keys per CTA
  EXPECT_EQ(with.sink_key_blocks, key_blocks);
  EXPECT_EQ(with.sink_partials_offset, without.bytes);
  EXPECT_EQ(with.sink_partials_bytes, size_t(p.batch) * p.heads_q * key_blocks * sizeof(float));
  EXPECT_EQ(with.bytes % kWorkspaceAlign, 0u);
  EXPECT_GT(with.bytes, without.bytes);
}

TEST(BwdWorkspace, EmptyForNoWork) {
  EXPECT_EQ(bwd_workspace_layout(0, 8, 113, 128).bytes, 0u);
  EXPECT_EQ(bwd_workspace_layout(2, 8, 0, 128).bytes, 0u);
  EXPECT_EQ(bwd_workspace_layout(-1, 8, 10, 128).bytes, 0u);
}

}  // namespace
}  // namespace flash3::host
