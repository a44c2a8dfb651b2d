// flash3 C++ API. Plain structs, a status return, messages via last_error().
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flash3 {

enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,
  kUnsupported = 2,
  kCudaError = 3,
  kInternal = 4,
};

// kFloat8E4M3: forward only (FP8 attention, see ForwardParams and quantize_fp8).
// kFloat32: only as combine()'s output.
enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat8E4M3 = 2, kFloat32 = 3 };

// ForwardParams::pack_gqa.
enum class PackGqa : int { kAuto = 0, kOff = 1, kOn = 2 };

// (batch, seqlen, heads, headdim) view of device memory; strides in elements.
struct Tensor4d {
  void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 1};
};

// ---- FP8 ------------------------------------------------------------------
// Rows (queries or keys) per FP8 block scale.
inline constexpr int kFp8ScaleBlock = 128;
// Blocks of kFp8ScaleBlock rows that cover `rows` (the last may be partial).
constexpr int fp8_scale_blocks(int rows) { return (rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock; }
// The key extent of FP8's V^T: whole scale blocks (the padding holds zeros).
constexpr int64_t fp8_vt_keys(int seqlen_k) { return int64_t{fp8_scale_blocks(seqlen_k)} * kFp8ScaleBlock; }
// Where key j sits along V^T's key axis. FP8 WGMMA takes P from the S
// accumulator's registers as they are, which orders each run of 16 keys as
// 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15; V^T is stored in that order.
constexpr int64_t fp8_vt_key_position(int64_t key) {
  int64_t const k = key % 16;
  return key - k + 4 * ((k % 8) / 2) + k % 2 + 2 * (k / 8);
}

// FP8 dequantization scales of one tensor: fp32 device memory indexed
// (batch, head, block of kFp8ScaleBlock rows) with these strides in
// elements. A per-tensor descale has all strides 0, a per-(batch, head) one
// block stride 0. The true values are the e4m3 values times the scale.
struct Fp8Scale {
  const float* data = nullptr;
  int64_t stride[3] = {0, 0, 0};  // batch, head, block
};

struct ForwardParams {
  Tensor4d q;    // (batch, seqlen_q, heads_q, head_dim)
  Tensor4d k;    // (batch, seqlen_k, heads_kv, head_dim)
  Tensor4d v;    // (batch, seqlen_k, heads_kv, head_dim_v)
  Tensor4d out;  // (batch, seqlen_q, heads_q, head_dim_v)
  float* lse = nullptr;  // optional: (batch, heads_q, seqlen_q) fp32 contiguous
  DType dtype = DType::kBFloat16;
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  // V's and out's head dim, 0 for head_dim. It may differ only as (192,
  // 128) (DeepSeek's), for 16-bit dtypes and without a KV cache.
  int head_dim_v = 0;
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim)
  bool causal = false;        // bottom-right aligned when seqlen_q != seqlen_k
  // Sliding window: query i sees keys j with i + d - window_left <= j <= i + d
  // + window_right, d = seqlen_k - seqlen_q (bottom-right aligned, like causal);
  // -1 = unbounded on that side. With causal, window_right must be -1 or 0.
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.f;  // > 0: scores s = softmax_scale * q.k become softcap * tanh(s / softcap)
  // Optional learnable sinks (gpt-oss): (heads_q) fp32 device memory, one
  // logit per query head that joins every row's softmax denominator as a
  // score with a zero value vector: out = sum_j exp(s_j) v_j / (sum_j
  // exp(s_j) + exp(sink)). lse includes the sink.
  const float* sinks = nullptr;
  // Optional variable-length batch (varlen): q, k, v and out hold `batch`
  // sequences packed along the seqlen dimension, (1, total_q or total_k,
  // heads, head_dim) (stride[0] is ignored). cu_seqlens_q / cu_seqlens_k:
  // (batch + 1) int32 device arrays, sequence b is rows [cu_seqlens[b],
  // cu_seqlens[b + 1]); seqused_q / seqused_k (optional, (batch) int32): the
  // sequence is instead seqused[b] rows from cu_seqlens[b]. seqlen_q and
  // seqlen_k are the longest sequence's lengths: seqlen_q sizes the grid
  // (rows of a longer sequence past it are not computed). Masks align to each
  // sequence's own bottom-right corner; lse is (heads_q, total_q). Rows in no
  // sequence are not written. Both cu_seqlens or neither. A sequence longer
  // than seqlen_q (seqlen_k) is cut to its first seqlen_q (seqlen_k) rows.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_q = nullptr;
  const int32_t* seqused_k = nullptr;
  int total_q = 0;  // varlen only: rows of the packed q and out
  int total_k = 0;  // varlen only: rows of the packed k and v
  // FP8 (dtype kFloat8E4M3; quantize_fp8 writes these from bf16 / fp16): q
  // and k are e4m3 in the usual layout; v is e4m3 V^T, key j of (batch b,
  // head h, head-dim row d) at v.data + b * v.stride[0] + d * v.stride[1] +
  // h * v.stride[2] + fp8_vt_key_position(j), keys up to fp8_vt_keys(seqlen_k)
  // readable and zero past seqlen_k; out is bf16. Scales are required: q's
  // indexed by query head, k's and v's by KV head. No softcap, no varlen.
  Fp8Scale q_scale;
  Fp8Scale k_scale;
  Fp8Scale v_scale;
  // KV cache (inference; 16-bit dtypes). k and v are a cache
  // of cache_batch entries (cache_batch, seqlen_k, heads_kv, head_dim);
  // seqlen_k is its capacity. Batch entry b reads entry kv_batch_idx[b]
  // (default b), keys [leftpad_k[b], seqused_k[b]) (defaults 0 and
  // seqlen_k; seqused_k is the cache_seqlens of FA's API); causal masks and
  // windows align to the end of that range. All three are optional (batch)
  // int32 device arrays; 0 for cache_batch means batch. Cache rows past
  // seqused_k in the last key block read are loaded (and masked out of the
  // softmax), so they must hold finite values.
  // Varlen q over a cache: cu_seqlens_q (and optionally seqused_q) without
  // cu_seqlens_k: q and out packed as for varlen, (1, total_q, heads_q,
  // head_dim), seqlen_q the longest sequence, lse (heads_q, total_q);
  // sequence b attends to cache entry b's keys as above (append: below).
  // Paged (page_table set): k and v are cache_batch pages (cache_batch,
  // page_size, heads_kv, head_dim); key j of batch entry b is row j %
  // page_size of page page_table[b * page_table_stride + j / page_size]
  // ((batch, >= ceil(seqlen_k / page_size)) int32). page_size must be a
  // multiple of 16; no kv_batch_idx or leftpad_k with a page table. Entries
  // outside [0, cache_batch) read zeros.
  const int32_t* kv_batch_idx = nullptr;
  const int32_t* leftpad_k = nullptr;
  int cache_batch = 0;
  const int32_t* page_table = nullptr;
  int64_t page_table_stride = 0;
  int page_size = 0;
  // Split-KV (flash-decoding): the keys of each query block are split into
  // num_splits ranges run by different CTAs, whose partial results are
  // merged by combine(); this fills the GPU when batch x heads x query
  // blocks is small. 0 chooses the count (forward_workspace_size() tells the
  // workspace it needs; with less workspace fewer splits are chosen, with
  // none no split); 1 is no split. 16-bit dtypes; with varlen only over a
  // cache (varlen q).
  int num_splits = 0;
  void* workspace = nullptr;  // device memory of at least forward_workspace_size() bytes
  size_t workspace_bytes = 0;
  // Append (KV cache, needs seqused_k): k_new and v_new (batch, seqlen_new,
  // heads_kv, head_dim), q's dtype, become keys [seqused_k[b], seqused_k[b] +
  // seqlen_new) of batch entry b's cache (through the page table when paged),
  // written by the attention kernel itself, which then attends to keys
  // [leftpad_k[b], seqused_k[b] + seqlen_new). seqused_k stays the count
  // before the call (the caller advances it). New keys past seqlen_k (the
  // capacity) are dropped, and entries or pages outside the cache are not
  // written. With varlen q, k_new and v_new are packed like q, (1, total_q,
  // heads_kv, head_dim): sequence b appends one key per query, its rows of
  // them, and seqlen_new must be seqlen_q.
  Tensor4d k_new;
  Tensor4d v_new;
  int seqlen_new = 0;
  // Rotary embedding (with append only): rotary_cos and rotary_sin, contiguous
  // (rotary_seqlen >= seqlen_k, rotary_dim / 2) of q's dtype, rotate the first
  // rotary_dim (a multiple of 16, <= head_dim) values of each new key and of
  // q: new key i by the angles of row seqused_k[b] + i; query row i by those
  // of row seqused_k[b] + i with rotary_q_per_row (FA sets it when causal or
  // windowed), else of row seqused_k[b]. Pairs are (2j, 2j + 1) when
  // rotary_interleaved, else (j, j + rotary_dim / 2) (GPT-NeoX). q itself is
  // not modified.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int rotary_dim = 0;
  int rotary_seqlen = 0;
  bool rotary_interleaved = false;
  bool rotary_q_per_row = false;
  // PackGQA (kernels/pack_gqa.h): the query heads of one KV head as the rows
  // of one tile, which the KV-cache kernel runs. kAuto packs where it needs
  // fewer tiles; kOn packs whenever heads_q > heads_kv (16-bit, not with
  // varlen k); kOff never packs.
  PackGqa pack_gqa = PackGqa::kAuto;
  // Optional ALiBi (FA2's alibi_slopes): fp32 device memory, the slope of
  // (batch b, query head h) at alibi_slopes[b * alibi_slopes_batch_stride +
  // h] (stride 0: one slope per head). Query i's logit for key j gains
  // -slope * |i + seqlen_k - seqlen_q - j| (per sequence or cache entry),
  // so lse includes it. 16-bit dtypes, head_dim <= 192, not with softcap.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0;
};

// Validates, then launches on `stream`. Never throws. On failure the message
// is in last_error(). batch == 0 or seqlen_q == 0 is a no-op; seqlen_k == 0
// writes out = 0 and lse = -inf (the sink's logit with sinks: rows that see no
// key); with varlen, total_k == 0 does so for all total_q rows.
Status forward(const ForwardParams& params, cudaStream_t stream);

// Bytes of device workspace forward() needs for the split count it would
// choose with unlimited workspace (num_splits 0) or was given; 0 when no
// split is made or the params are invalid.
size_t forward_workspace_size(const ForwardParams& params);

// Merges split-KV partial results (flash-decoding) as forward() does inside:
// out = sum_s exp(lse_s - lse) out_s with lse = log(sum_s exp(lse_s) (+
// exp(sink))). Rows whose splits all saw no key (lse_s = -inf) give out = 0
// and lse = -inf (the sink's logit with sinks).
struct CombineParams {
  const float* out_partial = nullptr;   // (num_splits, batch, seqlen, heads, head_dim) fp32
  int64_t out_partial_stride[5] = {0, 0, 0, 0, 1};
  const float* lse_partial = nullptr;   // (num_splits, batch, seqlen, heads) fp32, natural log
  int64_t lse_partial_stride[4] = {0, 0, 0, 0};
  Tensor4d out;                         // (batch, seqlen, heads, head_dim), dtype out_dtype
  DType out_dtype = DType::kBFloat16;   // fp16, bf16 or fp32
  float* lse = nullptr;                 // optional: (batch, heads, seqlen) fp32 contiguous
  const float* sinks = nullptr;         // optional (heads) logits joining each row's denominator
  int num_splits = 0;
  int batch = 0;
  int seqlen = 0;
  int heads = 0;
  int head_dim = 0;
};

// Asynchronous, no host synchronization, no allocation; same rules as forward().
Status combine(const CombineParams& params, cudaStream_t stream);

struct BackwardParams {
  Tensor4d q;     // (batch, seqlen_q, heads_q, head_dim), as given to forward
  Tensor4d k;     // (batch, seqlen_k, heads_kv, head_dim)
  Tensor4d v;     // (batch, seqlen_k, heads_kv, head_dim_v)
  Tensor4d out;   // forward's output
  Tensor4d dout;  // gradient of the loss with respect to out
  const float* lse = nullptr;  // forward's LSE: (batch, heads_q, seqlen_q) fp32 contiguous
  Tensor4d dq;    // outputs, shaped like q, k and v
  Tensor4d dk;
  Tensor4d dv;
  DType dtype = DType::kBFloat16;
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  int head_dim_v = 0;          // as in ForwardParams (0: head_dim)
  float softmax_scale = 0.f;   // 0 selects 1/sqrt(head_dim); must match the forward's
  bool causal = false;
  int window_left = -1;   // as in ForwardParams; must match the forward's
  int window_right = -1;
  float softcap = 0.f;
  const float* sinks = nullptr;  // the forward's sinks, if it had them
  // Optional (heads_q) fp32: d loss / d sinks, written (not accumulated);
  // needs sinks. Always bitwise reproducible.
  float* dsinks = nullptr;
  bool deterministic = false;  // bitwise-reproducible dq (key blocks add in a fixed order)
  void* workspace = nullptr;   // device memory of at least backward_workspace_size() bytes
  size_t workspace_bytes = 0;
  // Varlen, as in ForwardParams and matching the forward's: dout, dq packed
  // like q, dk, dv like k; lse (heads_q, total_q). Gradient rows in no
  // sequence are not written.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_q = nullptr;
  const int32_t* seqused_k = nullptr;
  int total_q = 0;
  int total_k = 0;
  // The forward's ALiBi slopes, as in ForwardParams (no gradient for them).
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0;
};

// Bytes of device workspace backward() needs for these sizes (batch,
// seqlen_q, heads_q, head_dim); 0 when nothing is needed or the sizes are invalid.
size_t backward_workspace_size(const BackwardParams& params);

// Gradients dq, dk, dv (and dsinks) of attention on `stream`; same rules as forward().
// Asynchronous, no host synchronization, no allocation (the caller passes the
// workspace), so it can be captured in a CUDA graph. With GQA, dk and dv are
// summed over the query heads that share a KV head.
Status backward(const BackwardParams& params, cudaStream_t stream);

enum class Fp8Scaling : int {
  kPerBlock = 0,   // one scale per kFp8ScaleBlock rows of one head
  kPerTensor = 1,  // one scale per tensor (written into every block entry)
};

// FP8 quantization for forward(): q, k, v (bf16 / fp16, `dtype`) -> e4m3 q_out,
// k_out (shaped like q, k) and vt_out (V^T as ForwardParams describes, with
// fp8_vt_keys(seqlen_k) keys), and their scales, each scale = amax / 448 of
// its block or tensor. With hadamard_signs, q and k are first multiplied by
// diag(signs) H / sqrt(head_dim) (H the Walsh-Hadamard matrix), which leaves
// q k^T unchanged and spreads outliers over all dims (incoherent processing).
// dtype kFloat8E4M3: v is already e4m3 and only transposed into vt_out,
// unscaled (q, k, their outputs and all scales are ignored).
struct QuantizeFp8Params {
  Tensor4d q;
  Tensor4d k;
  Tensor4d v;
  DType dtype = DType::kBFloat16;
  Tensor4d q_out;
  Tensor4d k_out;
  Tensor4d vt_out;
  float* q_scale = nullptr;  // written: (batch, heads_q, fp8_scale_blocks(seqlen_q)) contiguous
  float* k_scale = nullptr;  // (batch, heads_kv, fp8_scale_blocks(seqlen_k)) contiguous
  float* v_scale = nullptr;  // like k_scale
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  Fp8Scaling scaling = Fp8Scaling::kPerBlock;
  const float* hadamard_signs = nullptr;  // optional (head_dim) fp32 of +1 / -1
};

// Asynchronous, no host synchronization, no allocation; same rules as forward().
Status quantize_fp8(const QuantizeFp8Params& params, cudaStream_t stream);

// Message of the last failing call on this thread ("" after a success).
const char* last_error();

}  // namespace flash3
