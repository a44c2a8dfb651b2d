/* flash3 C ABI: stable, versioned, never throws.
 *
 * Every entry point returns a flash3_status; on failure flash3_last_error()
 * gives a message (thread-local, valid until the next flash3 call on the
 * same thread) that names the argument, what was expected and what was given.
 *
 * Tensors are (batch, seqlen, heads, headdim) with strides in elements; the
 * headdim stride must be 1. K and V may have fewer heads than Q (GQA/MQA).
 */
#ifndef FLASH3_FLASH3_H_
#define FLASH3_FLASH3_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLASH3_API __declspec(dllexport)
#else
#define FLASH3_API __attribute__((visibility("default")))
#endif

/* Bumped when a struct gains fields; old callers keep working because every
 * struct starts with its size and new fields are appended: fields past a
 * caller's struct_size take their _init defaults.
 * v2: window_left, window_right, softcap in both params structs.
 * v3: sinks in flash3_fwd_params.
 * v4: sinks and dsinks in flash3_bwd_params; varlen (cu_seqlens_q/k, seqused_q/k,
 *     total_q/k) in flash3_fwd_params.
 * v5: varlen in flash3_bwd_params.
 * v6: FP8: FLASH3_DTYPE_FLOAT8_E4M3, q/k/v_scale in flash3_fwd_params,
 *     flash3_quantize_fp8.
 * v7: KV cache (kv_batch_idx, leftpad_k, page_table, ...) and split-KV
 *     (num_splits, workspace) in flash3_fwd_params, flash3_fwd_workspace_size,
 *     flash3_combine, FLASH3_DTYPE_FLOAT32 (combine's output only).
 * v8: append to the KV cache with rotary embedding (k_new, v_new, seqlen_new,
 *     rotary_*) in flash3_fwd_params.
 * v9: pack_gqa in flash3_fwd_params (was v8_padding: a zeroed v8 struct asks
 *     for the automatic choice); varlen q over a KV cache (cu_seqlens_q
 *     without cu_seqlens_k); ALiBi (alibi_slopes) in both params structs.
 * v10: head_dim_v in both params structs (V's and out's head dim); append
 *     with varlen q (k_new / v_new packed like q, seqlen_new = seqlen_q). */
#define FLASH3_ABI_VERSION 10

typedef enum flash3_status {
  FLASH3_OK = 0,
  FLASH3_ERROR_INVALID_ARGUMENT = 1, /* the caller passed something wrong */
  FLASH3_ERROR_UNSUPPORTED = 2,      /* valid, but not built or not supported (dtype, head dim, GPU) */
  FLASH3_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  FLASH3_ERROR_INTERNAL = 4          /* a bug in flash3 */
} flash3_status;

typedef enum flash3_dtype {
  FLASH3_DTYPE_FLOAT16 = 0,
  FLASH3_DTYPE_BFLOAT16 = 1,
  FLASH3_DTYPE_FLOAT8_E4M3 = 2, /* forward only: see flash3_fwd_params v6 */
  FLASH3_DTYPE_FLOAT32 = 3       /* flash3_combine's output only */
} flash3_dtype;

/* flash3_fwd_params.pack_gqa */
#define FLASH3_PACK_GQA_AUTO 0
#define FLASH3_PACK_GQA_OFF 1
#define FLASH3_PACK_GQA_ON 2

/* Rows (queries or keys) per FP8 block scale. */
#define FLASH3_FP8_SCALE_BLOCK 128

/* FP8 dequantization scales of one tensor: fp32 device memory indexed
 * (batch, head, block of FLASH3_FP8_SCALE_BLOCK rows) with strides in
 * elements (a per-tensor descale has all strides 0). */
typedef struct flash3_fp8_scale {
  const float* data;
  int64_t stride[3]; /* batch, head, block */
} flash3_fp8_scale;

/* A 4-d tensor (batch, seqlen, heads, headdim); strides in elements. */
typedef struct flash3_tensor {
  void* data;
  int64_t stride[4];
} flash3_tensor;

typedef struct flash3_fwd_params {
  uint64_t struct_size; /* sizeof(flash3_fwd_params) as the caller compiled it */
  flash3_tensor q;      /* (batch, seqlen_q, num_heads_q, head_dim) */
  flash3_tensor k;      /* (batch, seqlen_k, num_heads_kv, head_dim) */
  flash3_tensor v;      /* (batch, seqlen_k, num_heads_kv, head_dim_v) */
  flash3_tensor out;    /* (batch, seqlen_q, num_heads_q, head_dim_v), same dtype as q */
  float* lse;           /* optional (NULL): (batch, num_heads_q, seqlen_q) fp32, contiguous, natural log */
  int32_t dtype;        /* flash3_dtype of q, k, v and out */
  int32_t batch;
  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t head_dim;
  float softmax_scale;  /* 0 selects 1/sqrt(head_dim) */
  int32_t causal;       /* nonzero: causal mask aligned to the bottom-right corner */
  int32_t v1_padding;   /* ignored: the v1 struct's tail padding, so that v2 starts at 216 */
  /* v2. Sliding window, bottom-right aligned like causal: query i sees key j
   * iff i + d - window_left <= j <= i + d + window_right, d = seqlen_k -
   * seqlen_q; -1 (the _init default) is unbounded. With causal, window_right
   * must be -1 or 0. */
  int32_t window_left;
  int32_t window_right;
  float softcap;        /* > 0: scores s = softmax_scale * q.k become softcap * tanh(s / softcap) */
  /* v3. Optional (NULL) learnable sinks: (num_heads_q) fp32, one logit per
   * query head joining every row's softmax denominator with a zero value
   * vector (gpt-oss); lse includes it. */
  const float* sinks;
  /* v4. Optional (NULL) variable-length batch: q, k, v and out hold `batch`
   * sequences packed along seqlen, (1, total_q or total_k, heads, head_dim)
   * (stride[0] ignored). cu_seqlens_q/k: (batch + 1) int32 device arrays,
   * sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]); optional
   * seqused_q/k, (batch) int32: instead seqused[b] rows from cu_seqlens[b].
   * seqlen_q / seqlen_k are the longest lengths (seqlen_q sizes the grid).
   * Masks align to each sequence's bottom-right corner; lse is (num_heads_q,
   * total_q). Both cu_seqlens, or (v9) cu_seqlens_q alone over a KV cache
   * (v7: k and v are not packed). A sequence longer than seqlen_q
   * (seqlen_k) is cut to its first seqlen_q (seqlen_k) rows. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_q;
  const int32_t* seqused_k;
  int32_t total_q;
  int32_t total_k;
  /* v6. FP8 (dtype FLASH3_DTYPE_FLOAT8_E4M3, as flash3_quantize_fp8 writes
   * them): q and k e4m3 in the usual layout; v e4m3 V^T, key j of (batch b,
   * head h, head-dim row d) at v.data + b * v.stride[0] + d * v.stride[1] +
   * h * v.stride[2] + P(j), with P permuting each run of 16 keys as
   * 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15 (flash3::fp8_vt_key_position) and
   * keys padded with zeros to whole scale blocks; out bf16. Scales required:
   * q's by query head, k's and v's by KV head. No softcap, no varlen. */
  flash3_fp8_scale q_scale;
  flash3_fp8_scale k_scale;
  flash3_fp8_scale v_scale;
  /* v7. KV cache (16-bit dtypes; flash3::ForwardParams in
   * flash3.hpp says it in full): k and v hold cache_batch entries (0:
   * batch) of seqlen_k keys; batch entry b reads entry kv_batch_idx[b] (or
   * b), keys [leftpad_k[b], seqused_k[b]) (or [0, seqlen_k)), all optional
   * (batch) int32 device arrays; masks align to the end of that range.
   * Paged (page_table, (batch, page_table_stride) int32): k and v are
   * cache_batch pages of page_size rows (a multiple of 16); key j of batch
   * entry b is row j % page_size of page page_table[b * page_table_stride +
   * j / page_size]. Split-KV: num_splits key ranges per query block merged
   * by flash3_combine's kernel (0: chosen, limited to what workspace_bytes
   * holds; 1: none), workspace of flash3_fwd_workspace_size() bytes. */
  const int32_t* kv_batch_idx;
  const int32_t* leftpad_k;
  const int32_t* page_table;
  int64_t page_table_stride;
  int32_t page_size;
  int32_t cache_batch;
  int32_t num_splits;
  int32_t v7_padding;   /* ignored: keeps workspace 8-byte aligned */
  void* workspace;
  uint64_t workspace_bytes;
  /* v8. Append (KV cache, needs seqused_k; flash3::ForwardParams says it in
   * full): k_new and v_new (batch, seqlen_new, num_heads_kv, head_dim) become
   * keys [seqused_k[b], seqused_k[b] + seqlen_new) of batch entry b's cache,
   * written by the attention kernel, which attends to them too (varlen q,
   * v10: k_new and v_new packed like q, (1, total_q, num_heads_kv,
   * head_dim), one new key per query, seqlen_new = seqlen_q). Rotary (with
   * append): rotary_cos / rotary_sin, contiguous (rotary_seqlen >= seqlen_k,
   * rotary_dim / 2) of q's dtype, rotate the first rotary_dim (a multiple of
   * 16) values of the new keys (key i at position seqused_k[b] + i) and of q
   * (row i at seqused_k[b] + i when rotary_q_per_row, else all at
   * seqused_k[b]); pairs (2j, 2j + 1) when rotary_interleaved, else (j, j +
   * rotary_dim / 2). */
  flash3_tensor k_new;
  flash3_tensor v_new;
  const void* rotary_cos;
  const void* rotary_sin;
  int32_t seqlen_new;
  int32_t rotary_dim;
  int32_t rotary_seqlen;
  int32_t rotary_interleaved;
  int32_t rotary_q_per_row;
  /* v9. PackGQA (the query heads of a KV head as the rows of one tile):
   * FLASH3_PACK_GQA_AUTO (0, where it needs fewer tiles), _OFF or _ON. */
  int32_t pack_gqa;
  /* v9. Optional (NULL) ALiBi, FA2's alibi_slopes: fp32, the slope of (batch
   * b, query head h) at alibi_slopes[b * alibi_slopes_batch_stride + h]
   * (stride 0: per head); query i's logit for key j gains -slope * |i +
   * seqlen_k - seqlen_q - j| (per sequence). 16-bit, head_dim <= 192, no softcap. */
  const float* alibi_slopes;
  int64_t alibi_slopes_batch_stride;
  /* v10. V's and out's head dim, 0 for head_dim; it may differ only as
   * (head_dim 192, head_dim_v 128), 16-bit and without a KV cache. */
  int32_t head_dim_v;
  int32_t v10_padding;  /* ignored */
} flash3_fwd_params;

/* Fills *params with defaults: struct_size set, windows -1, everything else zero. */
FLASH3_API void flash3_fwd_params_init(flash3_fwd_params* params);

/* Attention forward on `stream` (a cudaStream_t; NULL is the legacy default
 * stream). Asynchronous: no host synchronization, no allocation. */
FLASH3_API flash3_status flash3_fwd(const flash3_fwd_params* params, void* stream);

/* v7. Bytes of device workspace flash3_fwd needs for its split count (the
 * chosen one for num_splits 0); 0 when it makes no split. */
FLASH3_API flash3_status flash3_fwd_workspace_size(const flash3_fwd_params* params, uint64_t* bytes);

/* v7. Merges split-KV partial results: out = sum_s exp(lse_s - lse) out_s,
 * lse = log(sum_s exp(lse_s) (+ exp(sink))); rows whose splits saw no key
 * give 0 and -inf (the sink with sinks). out_partial (num_splits, batch,
 * seqlen, num_heads, head_dim) and lse_partial (num_splits, batch, seqlen,
 * num_heads) fp32 with strides in elements (head_dim's 1); out (batch,
 * seqlen, num_heads, head_dim) of out_dtype (fp16, bf16 or fp32); lse
 * optional, (batch, num_heads, seqlen) fp32 contiguous; head_dim <= 256. */
typedef struct flash3_combine_params {
  uint64_t struct_size;
  const float* out_partial;
  int64_t out_partial_stride[5];
  const float* lse_partial;
  int64_t lse_partial_stride[4];
  flash3_tensor out;
  int32_t out_dtype;
  int32_t num_splits;
  float* lse;
  const float* sinks;   /* optional (num_heads) fp32 */
  int32_t batch;
  int32_t seqlen;
  int32_t num_heads;
  int32_t head_dim;
} flash3_combine_params;

FLASH3_API void flash3_combine_params_init(flash3_combine_params* params);
FLASH3_API flash3_status flash3_combine(const flash3_combine_params* params, void* stream);

typedef struct flash3_bwd_params {
  uint64_t struct_size;     /* sizeof(flash3_bwd_params) as the caller compiled it */
  flash3_tensor q;          /* the forward's inputs and output */
  flash3_tensor k;
  flash3_tensor v;
  flash3_tensor out;
  flash3_tensor dout;       /* gradient with respect to out, shaped like out */
  const float* lse;         /* the forward's LSE: (batch, num_heads_q, seqlen_q) fp32, contiguous */
  flash3_tensor dq;         /* outputs, shaped like q, k, v */
  flash3_tensor dk;
  flash3_tensor dv;
  int32_t dtype;
  int32_t batch;
  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t head_dim;
  float softmax_scale;      /* 0 selects 1/sqrt(head_dim); must match the forward's */
  int32_t causal;
  int32_t deterministic;    /* nonzero: bitwise-reproducible dq */
  void* workspace;          /* device memory of flash3_bwd_workspace_size() bytes */
  uint64_t workspace_bytes;
  /* v2: as in flash3_fwd_params; must match the forward's. */
  int32_t window_left;
  int32_t window_right;
  float softcap;
  /* v4: the forward's sinks (or NULL), and optionally (NULL: not computed)
   * dsinks, (num_heads_q) fp32, written; needs sinks. */
  const float* sinks;
  float* dsinks;
  /* v5: varlen as in flash3_fwd_params, matching the forward's: dout and dq
   * packed like q, dk and dv like k, lse (num_heads_q, total_q). Gradient
   * rows in no sequence are not written. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_q;
  const int32_t* seqused_k;
  int32_t total_q;
  int32_t total_k;
  /* v9: the forward's ALiBi slopes, as in flash3_fwd_params. */
  const float* alibi_slopes;
  int64_t alibi_slopes_batch_stride;
  /* v10: as in flash3_fwd_params; dv and dout are shaped like v and out. */
  int32_t head_dim_v;
  int32_t v10_padding;  /* ignored */
} flash3_bwd_params;

FLASH3_API void flash3_bwd_params_init(flash3_bwd_params* params);

/* Bytes of device workspace flash3_bwd needs for these sizes (0 when none). */
FLASH3_API flash3_status flash3_bwd_workspace_size(const flash3_bwd_params* params, uint64_t* bytes);

/* Gradients dq, dk, dv (and dsinks) on `stream`. Asynchronous: no host synchronization,
 * no allocation (the caller passes the workspace). With GQA, dk and dv are
 * summed over the query heads of each KV head. */
FLASH3_API flash3_status flash3_bwd(const flash3_bwd_params* params, void* stream);

/* v6. FP8 quantization for flash3_fwd (flash3::quantize_fp8 in flash3.hpp
 * says it in full): bf16 / fp16 q, k, v -> e4m3 q_out, k_out, V^T vt_out
 * and fp32 scales (batch, heads, blocks) contiguous, one per block
 * (scaling 0) or per tensor (1); hadamard_signs (head_dim of +-1, or NULL)
 * rotates q and k by diag(signs) H / sqrt(head_dim) first. dtype e4m3: v
 * only, transposed unscaled. */
typedef struct flash3_quantize_fp8_params {
  uint64_t struct_size;
  flash3_tensor q;
  flash3_tensor k;
  flash3_tensor v;
  int32_t dtype;
  int32_t scaling;
  flash3_tensor q_out;
  flash3_tensor k_out;
  flash3_tensor vt_out;
  float* q_scale;
  float* k_scale;
  float* v_scale;
  int32_t batch;
  int32_t seqlen_q;
  int32_t seqlen_k;
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t head_dim;
  const float* hadamard_signs;
} flash3_quantize_fp8_params;

FLASH3_API void flash3_quantize_fp8_params_init(flash3_quantize_fp8_params* params);
FLASH3_API flash3_status flash3_quantize_fp8(const flash3_quantize_fp8_params* params, void* stream);

FLASH3_API const char* flash3_last_error(void);
FLASH3_API int flash3_abi_version(void);
FLASH3_API const char* flash3_version(void);
/* Compiled configurations, e.g. "dtypes=bf16,fp16 head_dims=64,128,256 arch=sm_90a". */
FLASH3_API const char* flash3_build_info(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASH3_FLASH3_H_ */
