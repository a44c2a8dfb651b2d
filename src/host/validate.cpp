#include "validate.hpp"

#include "bwd_workspace.hpp"
#include "flash3_built_kernels.h"
#include "kernels/fwd_combine_run.h"
#include "kernels/tile_config.h"
#include "split_kv.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace flash3::host {
namespace {

// TMA (cp.async.bulk.tensor) needs 16-byte aligned base addresses and
// strides, and strides below 2^40 bytes (cuTensorMapEncodeTiled's limits).
constexpr int64_t kTmaAlignBytes = 16;
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;
// Row counts (batch * seqlen * heads) index tiles and LSE entries in int32.
constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();

constexpr const char* kDimNames[4] = {"batch", "seqlen", "heads", "head_dim"};

int dtype_index(DType dtype) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kKnownDTypes[i] == dtype) return i;
  return -1;
}

int head_dim_index(int head_dim) {
  for (int i = 0; i < kNumHeadDims; ++i)
    if (kSupportedHeadDims[i] == head_dim) return i;
  return -1;
}

int head_dim_pair_index(int head_dim, int head_dim_v) {
  for (int i = 0; i < kNumHeadDimPairs; ++i)
    if (kHeadDimPairs[i].qk == head_dim && kHeadDimPairs[i].v == head_dim_v) return i;
  return -1;
}

std::string head_dim_pairs() {
  std::string out;
  for (HeadDimPair p : kHeadDimPairs) out += cat(out.empty() ? "" : ", ", "(", p.qk, ", ", p.v, ")");
  return out;
}

CheckResult invalid(std::string message) {
  return CheckResult::fail(Status::kInvalidArgument, std::move(message));
}
CheckResult unsupported(std::string message) {
  return CheckResult::fail(Status::kUnsupported, std::move(message));
}

CheckResult check_size(const char* name, int value, int min) {
  if (value >= min) return {};
  return invalid(cat(name, " must be >= ", min, "; got ", value));
}

// product of three non-negative ints; saturates instead of overflowing int64.
int64_t rows(int a, int b, int c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(int64_t{a}, int64_t{b}, &ab) ||
      __builtin_mul_overflow(ab, int64_t{c}, &abc))
    return std::numeric_limits<int64_t>::max();
  return abc;
}

CheckResult check_rows(const char* what, int64_t value) {
  if (value <= kMaxRows) return {};
  return invalid(cat(what, " must be at most ", kMaxRows, " (int32 row index); got ", value));
}

CheckResult check_tensor(const char* name, const Tensor4d& t, int elem_bytes) {
  if (t.data == nullptr) return invalid(cat(name, ": expected a non-null data pointer; got NULL"));
  if (reinterpret_cast<uintptr_t>(t.data) % kTmaAlignBytes != 0)
    return invalid(cat(name, ": data pointer must be ", kTmaAlignBytes,
                       "-byte aligned (needed by TMA); got ", t.data));
  if (t.stride[3] != 1)
    return invalid(cat(name, ": head_dim stride must be 1 (last dimension contiguous); got ",
                       t.stride[3]));
  const int64_t align_elems = kTmaAlignBytes / elem_bytes;
  for (int d = 0; d < 3; ++d) {
    const int64_t s = t.stride[d];
    if (s < 0) return invalid(cat(name, ": ", kDimNames[d], " stride must be >= 0; got ", s));
    if (s % align_elems != 0)
      return invalid(cat(name, ": ", kDimNames[d], " stride must be a multiple of ", align_elems,
                         " elements (", kTmaAlignBytes, " bytes, needed by TMA); got ", s));
    if (s >= kTmaMaxStrideBytes / elem_bytes)
      return invalid(cat(name, ": ", kDimNames[d],
                         " stride must be below 2^40 bytes (TMA limit); got ", s, " elements"));
  }
  return {};
}

// Window bounds, softcap, and the int32 headroom the banded mask's
// arithmetic needs (key - row differences up to seqlen_q + seqlen_k).
CheckResult check_mask(const ForwardParams& p) {
  if (p.window_left < -1)
    return invalid(cat("window_left must be >= -1 (-1: unbounded); got ", p.window_left));
  if (p.window_right < -1)
    return invalid(cat("window_right must be >= -1 (-1: unbounded); got ", p.window_right));
  if (p.causal && p.window_right > 0)
    return invalid(cat("window_right must be -1 or 0 with causal (a causal row sees no key right "
                       "of its diagonal); got ", p.window_right));
  if (!std::isfinite(p.softcap) || p.softcap < 0.f)
    return invalid(cat("softcap must be finite and >= 0 (0: no softcap); got ", p.softcap));
  const bool banded = p.causal || p.window_left >= 0 || p.window_right >= 0;
  if (banded && int64_t{p.seqlen_q} + p.seqlen_k > kMaxRows)
    return invalid(cat("seqlen_q + seqlen_k must be at most ", kMaxRows,
                       " with causal or a window; got ", int64_t{p.seqlen_q} + p.seqlen_k));
  return {};
}

// An optional array of T: NULL, or aligned for T loads.
template <class T>
CheckResult check_aligned_pointer(const char* name, const T* pointer) {
  if (reinterpret_cast<uintptr_t>(pointer) % alignof(T) == 0) return {};
  return invalid(cat(name, ": pointer must be ", alignof(T), "-byte aligned; got ",
                     static_cast<const void*>(pointer)));
}

std::string pointer_text(const void* pointer) {
  return pointer == nullptr ? std::string("NULL") : cat(pointer);
}

// Varlen's arrays and totals (their contents are on the device: see
// packed_sequence.cuh for what inconsistent ones do). cu_seqlens_q alone is
// varlen q over a KV cache; cu_seqlens_k needs it.
CheckResult check_varlen(const ForwardParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (varlen_kv(p) && !varlen)
    return invalid(cat("cu_seqlens_k: packed k and v (varlen) need cu_seqlens_q too; got "
                       "cu_seqlens_q = NULL, cu_seqlens_k = ", pointer_text(p.cu_seqlens_k)));
  // (Without varlen k, seqused_k is a KV cache's per-batch key count: check_kv_cache.)
  if (!varlen && p.seqused_q != nullptr)
    return invalid(cat("seqused_q: only with cu_seqlens_q (varlen); got ", pointer_text(p.seqused_q)));
  if (!varlen) return check_aligned_pointer("seqused_k", p.seqused_k);
  for (CheckResult r : {check_size("total_q", p.total_q, 0),
                        check_aligned_pointer("cu_seqlens_q", p.cu_seqlens_q),
                        check_aligned_pointer("seqused_q", p.seqused_q),
                        check_aligned_pointer("seqused_k", p.seqused_k),
                        check_rows("total_q * num_heads_q", rows(1, p.total_q, p.heads_q))})
    if (!r.ok()) return r;
  if (!varlen_kv(p)) return {};
  for (CheckResult r : {check_size("total_k", p.total_k, 0),
                        check_aligned_pointer("cu_seqlens_k", p.cu_seqlens_k),
                        check_rows("total_k * num_heads_kv", rows(1, p.total_k, p.heads_kv))})
    if (!r.ok()) return r;
  // The per-sequence band (window.hpp) spans key - row differences up to total_q + total_k.
  if (int64_t{p.total_q} + p.total_k > kMaxRows)
    return invalid(cat("total_q + total_k must be at most ", kMaxRows, " with varlen; got ",
                       int64_t{p.total_q} + p.total_k));
  return {};
}

// The first KV-cache array given, or nullptr (flash3.hpp: KV cache).
const char* kv_cache_array(const ForwardParams& p) {
  if (p.kv_batch_idx != nullptr) return "kv_batch_idx";
  if (p.leftpad_k != nullptr) return "leftpad_k";
  if (p.page_table != nullptr) return "page_table";
  if (p.seqused_k != nullptr && !varlen_kv(p)) return "seqused_k";
  return nullptr;
}

CheckResult check_workspace(const void* workspace, size_t bytes, size_t needed, const char* size_fn) {
  if (workspace == nullptr)
    return invalid(cat("workspace: expected device memory of at least ", needed, " bytes (", size_fn,
                       "); got NULL"));
  if (reinterpret_cast<uintptr_t>(workspace) % kTmaAlignBytes != 0)
    return invalid(cat("workspace: pointer must be ", kTmaAlignBytes, "-byte aligned; got ", workspace));
  if (bytes < needed)
    return invalid(cat("workspace_bytes: expected at least ", needed, " (", size_fn, "); got ", bytes));
  return {};
}

// KV cache and split-KV: 16-bit, k and v not packed (varlen q may be); a
// page table excludes kv_batch_idx and leftpad_k; explicit splits need
// their workspace.
CheckResult check_kv_cache(const ForwardParams& p) {
  if (p.num_splits < 0 || p.num_splits > kMaxSplits)
    return invalid(cat("num_splits must be in [0, ", kMaxSplits, "] (0: chosen, 1: no split); got ",
                       p.num_splits));
  if (p.pack_gqa != PackGqa::kAuto && p.pack_gqa != PackGqa::kOff && p.pack_gqa != PackGqa::kOn)
    return invalid(cat("pack_gqa: expected auto (0), off (1) or on (2); got ", static_cast<int>(p.pack_gqa)));
  const bool packed_kv = varlen_kv(p);
  const bool fp8 = p.dtype == DType::kFloat8E4M3;
  const char* array = kv_cache_array(p);
  if (array != nullptr && packed_kv)
    return unsupported(cat(array, ": a KV cache is read from unpacked k and v; not supported "
                                  "with varlen k (cu_seqlens_k)"));
  if (array != nullptr && fp8)
    return unsupported(cat(array, ": the KV cache kernel takes bf16 or fp16; not supported with "
                                  "dtype e4m3 (FP8)"));
  if (p.num_splits > 1 && (packed_kv || fp8))
    return unsupported(cat("num_splits: split-KV takes bf16 or fp16 and unpacked k and v; "
                           "not supported with ", packed_kv ? "varlen k (cu_seqlens_k)" : "dtype e4m3 (FP8)",
                           "; got ", p.num_splits));
  if (p.cache_batch < 0) return invalid(cat("cache_batch must be >= 0 (0: batch); got ", p.cache_batch));
  for (CheckResult r : {check_aligned_pointer("kv_batch_idx", p.kv_batch_idx),
                        check_aligned_pointer("leftpad_k", p.leftpad_k),
                        check_aligned_pointer("page_table", p.page_table)})
    if (!r.ok()) return r;
  if (p.page_table != nullptr) {
    if (p.kv_batch_idx != nullptr || p.leftpad_k != nullptr)
      return unsupported(cat(p.kv_batch_idx != nullptr ? "kv_batch_idx" : "leftpad_k",
                             ": not supported with a page table (page_table maps each batch "
                             "entry's keys to pages)"));
    if (p.page_size < 1)
      return invalid(cat("page_size must be >= 1 with a page table; got ", p.page_size));
    if (p.page_size % 16 != 0)
      return unsupported(cat("page_size: multiples of 16 are supported (one TMA box of 16 keys "
                             "never straddles pages); got ", p.page_size));
    if (p.cache_batch < 1)
      return invalid(cat("cache_batch: the number of pages, must be >= 1 with a page table; got ",
                         p.cache_batch));
    const int64_t pages = (int64_t{p.seqlen_k} + p.page_size - 1) / p.page_size;
    if (p.page_table_stride < pages)
      return invalid(cat("page_table_stride must be >= ceil(seqlen_k / page_size) = ", pages,
                         " (pages per batch entry); got ", p.page_table_stride));
  }
  if (p.num_splits > 1)
    return check_workspace(p.workspace, p.workspace_bytes, split_workspace_bytes(p, p.num_splits),
                           "forward_workspace_size");
  if (reinterpret_cast<uintptr_t>(p.workspace) % kTmaAlignBytes != 0)
    return invalid(cat("workspace: pointer must be ", kTmaAlignBytes, "-byte aligned; got ", p.workspace));
  return {};
}

// Append and rotary (flash3.hpp): the KV-cache kernel writes k_new / v_new
// with 16-byte stores, which TMA's rules on the tensors also cover.
CheckResult check_append(const ForwardParams& p) {
  if (p.seqlen_new < 0) return invalid(cat("seqlen_new must be >= 0 (0: no append); got ", p.seqlen_new));
  if (p.rotary_dim < 0) return invalid(cat("rotary_dim must be >= 0 (0: no rotary); got ", p.rotary_dim));
  if (p.seqlen_new == 0) {
    if (p.rotary_dim > 0)
      return invalid(cat("rotary_dim: rotary embedding applies to appended keys and needs "
                         "seqlen_new >= 1; got rotary_dim ", p.rotary_dim, " with seqlen_new 0"));
    return {};
  }
  if (p.seqlen_q == 0)
    return invalid("seqlen_q must be >= 1 when appending: the attention kernel writes the new keys");
  if (varlen_kv(p))
    return unsupported(cat("seqlen_new: appending (seqlen_new = ", p.seqlen_new, ") writes a KV "
                           "cache of unpacked k and v; not supported with varlen k (cu_seqlens_k)"));
  if (p.cu_seqlens_q != nullptr && p.seqlen_new != p.seqlen_q)
    return invalid(cat("seqlen_new: with varlen q (cu_seqlens_q) k_new and v_new are packed like "
                       "q, one new key per query, so seqlen_new must be seqlen_q (", p.seqlen_q,
                       "); got ", p.seqlen_new));
  if (p.seqused_k == nullptr)
    return invalid(cat("seqused_k: appending (seqlen_new = ", p.seqlen_new, ") needs each batch "
                       "entry's cached key count, where its new keys go; got NULL"));
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return unsupported(cat("seqlen_new: appending to the cache takes bf16 or fp16; got dtype ",
                           dtype_name(p.dtype)));
  if (int64_t{p.seqlen_k} + p.seqlen_new > kMaxRows)
    return invalid(cat("seqlen_k + seqlen_new must be at most ", kMaxRows, "; got ",
                       int64_t{p.seqlen_k} + p.seqlen_new));
  if (p.batch > 0) {
    for (CheckResult r : {check_tensor("k_new", p.k_new, dtype_bytes(p.dtype)),
                          check_tensor("v_new", p.v_new, dtype_bytes(p.dtype))})
      if (!r.ok()) return r;
  }
  if (p.rotary_dim == 0) return {};
  if (p.rotary_dim % 16 != 0 || p.rotary_dim > p.head_dim)
    return unsupported(cat("rotary_dim: multiples of 16 up to head_dim (", p.head_dim,
                           ") are supported; got ", p.rotary_dim));
  if (p.rotary_cos == nullptr || p.rotary_sin == nullptr)
    return invalid(cat(p.rotary_cos == nullptr ? "rotary_cos" : "rotary_sin",
                       ": expected a (rotary_seqlen, rotary_dim / 2) table with rotary_dim ",
                       p.rotary_dim, "; got NULL"));
  for (CheckResult r : {check_aligned_pointer("rotary_cos", static_cast<const uint16_t*>(p.rotary_cos)),
                        check_aligned_pointer("rotary_sin", static_cast<const uint16_t*>(p.rotary_sin))})
    if (!r.ok()) return r;
  if (p.rotary_seqlen < p.seqlen_k)
    return invalid(cat("rotary_seqlen: the cos / sin tables must cover every cache position, "
                       "rotary_seqlen >= seqlen_k (", p.seqlen_k, "); got ", p.rotary_seqlen));
  return {};
}

// head_dim_v (0: head_dim), else one of kHeadDimPairs (none is an FP8 head
// dim: 16-bit only), built, and not with what only the KV-cache kernel does.
CheckResult check_head_dim_v(const ForwardParams& p, const BuildConfig& built) {
  if (p.head_dim_v < 0) return invalid(cat("head_dim_v must be >= 0 (0: head_dim); got ", p.head_dim_v));
  const int dv = head_dim_v(p);
  if (dv == p.head_dim) return {};
  if (head_dim_pair_index(p.head_dim, dv) < 0)
    return unsupported(cat("head_dim_v: differs from head_dim only as (head_dim, head_dim_v) = ",
                           head_dim_pairs(), "; got (", p.head_dim, ", ", dv, ")"));
  const char* cache = kv_cache_array(p);
  if (cache == nullptr && p.seqlen_new > 0) cache = "seqlen_new";
  if (cache == nullptr && p.num_splits > 1) cache = "num_splits";
  if (cache == nullptr && p.cu_seqlens_q != nullptr && !varlen_kv(p)) cache = "cu_seqlens_q without cu_seqlens_k";
  if (cache != nullptr)
    return unsupported(cat(cache, ": the KV-cache kernel takes head_dim_v = head_dim; got (",
                           p.head_dim, ", ", dv, ")"));
  if (!built.has(p.dtype, p.head_dim, dv))
    return unsupported(cat("head_dim_v: (", p.head_dim, ", ", dv, ") is not built for dtype ",
                           dtype_name(p.dtype), "; rebuild with FLASH3_HEAD_DIM_PAIRS including ",
                           p.head_dim, "x", dv));
  return {};
}

// What FP8 adds to the forward's rules: no softcap, ALiBi or varlen, and scales.
CheckResult check_fp8(const ForwardParams& p) {
  if (p.softcap != 0.f)
    return unsupported(cat("softcap: not supported with dtype e4m3 (FP8); got ", p.softcap));
  if (p.alibi_slopes != nullptr) return unsupported("alibi_slopes: not supported with dtype e4m3 (FP8)");
  if (p.cu_seqlens_q != nullptr)
    return unsupported("cu_seqlens_q: varlen is not supported with dtype e4m3 (FP8)");
  const struct {
    const char* name;
    const Fp8Scale& scale;
  } scales[] = {{"q_scale", p.q_scale}, {"k_scale", p.k_scale}, {"v_scale", p.v_scale}};
  for (const auto& s : scales) {
    if (s.scale.data == nullptr)
      return invalid(cat(s.name, ": dtype e4m3 (FP8) needs dequantization scales; got NULL"));
    if (CheckResult r = check_aligned_pointer(s.name, s.scale.data); !r.ok()) return r;
    for (int d = 0; d < 3; ++d)
      if (s.scale.stride[d] < 0)
        return invalid(cat(s.name, ": stride[", d, "] must be >= 0; got ", s.scale.stride[d]));
  }
  return {};
}

template <int kCount>
std::string head_dims(const int (&dims)[kCount]) {
  std::string out;
  for (int h : dims) out += (out.empty() ? "" : ", ") + std::to_string(h);
  return out;
}
std::string supported_head_dims() { return head_dims(kSupportedHeadDims); }

// kOk, or the e4m3 head-dim refusal (kFp8HeadDims).
CheckResult check_fp8_head_dim(int head_dim) {
  for (int h : kFp8HeadDims)
    if (h == head_dim) return {};
  return unsupported(cat("head_dim: dtype e4m3 (FP8) supports head dims ", head_dims(kFp8HeadDims),
                         " (a power of two for the Hadamard transform); got ", head_dim));
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat8E4M3: return "e4m3";
    case DType::kFloat32: return "fp32";
  }
  return nullptr;
}

int dtype_bytes(DType dtype) {
  return dtype == DType::kFloat8E4M3 ? 1 : dtype == DType::kFloat32 ? 4 : 2;
}

void BuildConfig::add(DType dtype, int head_dim, int head_dim_v) {
  const int d = dtype_index(dtype);
  if (head_dim_v != head_dim) {
    const int pair = head_dim_pair_index(head_dim, head_dim_v);
    if (pair >= 0 && d >= 0) pairs_built_[d][pair] = true;
    return;
  }
  const int h = head_dim_index(head_dim);
  if (h < 0) return;
  if (dtype == DType::kFloat8E4M3) {
    fp8_built_[h] = true;
    return;
  }
  if (d >= 0) built_[d][h] = true;
}

bool BuildConfig::has(DType dtype, int head_dim, int head_dim_v) const {
  const int d = dtype_index(dtype);
  if (head_dim_v != head_dim) {
    const int pair = head_dim_pair_index(head_dim, head_dim_v);
    return pair >= 0 && d >= 0 && pairs_built_[d][pair];
  }
  const int h = head_dim_index(head_dim);
  if (h < 0) return false;
  if (dtype == DType::kFloat8E4M3) return fp8_built_[h];
  return d >= 0 && built_[d][h];
}

bool BuildConfig::has_dtype(DType dtype) const {
  for (int h : kSupportedHeadDims)
    if (has(dtype, h)) return true;
  return false;
}

bool BuildConfig::has_head_dim(int head_dim) const {
  for (DType d : kKnownDTypes)
    if (has(d, head_dim)) return true;
  return false;
}

std::string BuildConfig::dtype_list() const {
  std::string out;
  for (DType d : kKnownDTypes)
    if (has_dtype(d)) out += (out.empty() ? "" : ", ") + std::string(dtype_name(d));
  return out.empty() ? "none" : out;
}

std::string BuildConfig::head_dim_list() const {
  std::string out;
  for (int h : kSupportedHeadDims)
    if (has_head_dim(h)) out += (out.empty() ? "" : ", ") + std::to_string(h);
  return out.empty() ? "none" : out;
}

const BuildConfig& built_config() {
  static const BuildConfig config = [] {
    BuildConfig c;
#define FLASH3_ADD(DTYPE, HEAD_DIM, HEAD_DIM_V) c.add(DType::DTYPE, HEAD_DIM, HEAD_DIM_V);
    FLASH3_FOR_EACH_BUILT_16BIT(FLASH3_ADD)
    FLASH3_FOR_EACH_BUILT_FP8(FLASH3_ADD)
#undef FLASH3_ADD
    return c;
  }();
  return config;
}

CheckResult validate_forward(const ForwardParams& p, const BuildConfig& built) {
  const char* dtype = p.dtype == DType::kFloat32 ? nullptr : dtype_name(p.dtype);
  if (dtype == nullptr)
    return invalid(cat("dtype: expected fp16 (", static_cast<int>(DType::kFloat16), "), bf16 (",
                       static_cast<int>(DType::kBFloat16), ") or e4m3 (",
                       static_cast<int>(DType::kFloat8E4M3), "); got ", static_cast<int>(p.dtype)));

  for (CheckResult r : {check_size("batch", p.batch, 0), check_size("seqlen_q", p.seqlen_q, 0),
                        check_size("seqlen_k", p.seqlen_k, 0),
                        check_size("num_heads_q", p.heads_q, 1),
                        check_size("num_heads_kv", p.heads_kv, 1),
                        check_size("head_dim", p.head_dim, 1)})
    if (!r.ok()) return r;

  const bool fp8 = p.dtype == DType::kFloat8E4M3;
  if (fp8 && !built.has_dtype(p.dtype))
    return unsupported("dtype: e4m3 is not built into this library; rebuild with FLASH3_FP8=ON");
  if (!built.has_dtype(p.dtype))
    return unsupported(cat("dtype: ", dtype, " is not built into this library (built: ",
                           built.dtype_list(), "); rebuild with FLASH3_DTYPES including ", dtype));
  if (head_dim_index(p.head_dim) < 0)
    return unsupported(
        cat("head_dim: supported head dims are ", supported_head_dims(), "; got ", p.head_dim));
  if (fp8)
    if (CheckResult r = check_fp8_head_dim(p.head_dim); !r.ok()) return r;
  // (A pair of head dims is its own kernel: check_head_dim_v.)
  if (CheckResult r = check_head_dim_v(p, built); !r.ok()) return r;
  if (head_dim_v(p) == p.head_dim) {
    if (!built.has_head_dim(p.head_dim))
      return unsupported(cat("head_dim: ", p.head_dim, " is supported but not built into this library (built: ",
                             built.head_dim_list(), "); rebuild with FLASH3_HEAD_DIMS including ",
                             p.head_dim));
    if (!built.has(p.dtype, p.head_dim))
      return unsupported(cat("no kernel built for dtype ", dtype, " with head_dim ", p.head_dim));
  }

  if (p.heads_q % p.heads_kv != 0)
    return invalid(cat("num_heads_q (", p.heads_q, ") must be divisible by num_heads_kv (",
                       p.heads_kv, ")"));
  if (CheckResult r = check_varlen(p); !r.ok()) return r;
  if (CheckResult r = check_kv_cache(p); !r.ok()) return r;
  if (CheckResult r = check_append(p); !r.ok()) return r;
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (!varlen) {
    if (CheckResult r = check_rows("batch * seqlen_q * num_heads_q", rows(p.batch, p.seqlen_q, p.heads_q));
        !r.ok())
      return r;
  }
  if (!varlen_kv(p)) {
    const bool paged = p.page_table != nullptr;
    CheckResult const kv_rows =
        p.cache_batch > 0
            ? check_rows(paged ? "cache_batch * page_size * num_heads_kv" : "cache_batch * seqlen_k * num_heads_kv",
                         rows(p.cache_batch, paged ? p.page_size : p.seqlen_k, p.heads_kv))
            : check_rows("batch * seqlen_k * num_heads_kv", rows(p.batch, p.seqlen_k, p.heads_kv));
    if (!kv_rows.ok()) return kv_rows;
  }

  if (!std::isfinite(p.softmax_scale) || p.softmax_scale < 0.f)
    return invalid(cat("softmax_scale must be finite and >= 0 (0 selects 1/sqrt(head_dim)); got ",
                       p.softmax_scale));
  if (CheckResult r = check_mask(p); !r.ok()) return r;

  const bool q_used = p.batch > 0 && p.seqlen_q > 0 && (!varlen || p.total_q > 0);
  const bool kv_used = p.batch > 0 && (varlen_kv(p) ? p.total_k > 0 : p.seqlen_k > 0);
  const struct {
    const char* name;
    const Tensor4d& tensor;
    bool used;
  } tensors[] = {{"q", p.q, q_used}, {"k", p.k, kv_used}, {"v", p.v, kv_used}, {"out", p.out, q_used}};
  for (const auto& t : tensors) {
    if (!t.used) continue;
    // FP8 writes bf16; its v is V^T, whose strides obey the same TMA rules.
    const int bytes = fp8 && &t.tensor == &p.out ? 2 : dtype_bytes(p.dtype);
    if (CheckResult r = check_tensor(t.name, t.tensor, bytes); !r.ok()) return r;
  }
  for (CheckResult r : {check_aligned_pointer("lse", p.lse), check_aligned_pointer("sinks", p.sinks),
                        check_aligned_pointer("alibi_slopes", p.alibi_slopes)})
    if (!r.ok()) return r;
  if (p.alibi_slopes_batch_stride < 0)
    return invalid(cat("alibi_slopes_batch_stride must be >= 0 (0: one slope per head); got ",
                       p.alibi_slopes_batch_stride));
  // (The backward adds the bias to the capped scores it needs unbiased.)
  if (p.alibi_slopes != nullptr && p.softcap != 0.f)
    return unsupported(cat("alibi_slopes: not supported with softcap; got softcap ", p.softcap));
  if (p.alibi_slopes != nullptr && p.head_dim > kernels::kMaxAlibiHeadDim)
    return unsupported(cat("alibi_slopes: supported up to head_dim ", kernels::kMaxAlibiHeadDim,
                           "; got head_dim ", p.head_dim));
  if (fp8) return check_fp8(p);
  return {};
}

ForwardParams forward_view(const BackwardParams& p) {
  ForwardParams f;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.out = p.out;
  f.lse = const_cast<float*>(p.lse);  // only read through this view
  f.dtype = p.dtype;
  f.batch = p.batch;
  f.seqlen_q = p.seqlen_q;
  f.seqlen_k = p.seqlen_k;
  f.heads_q = p.heads_q;
  f.heads_kv = p.heads_kv;
  f.head_dim = p.head_dim;
  f.head_dim_v = p.head_dim_v;
  f.softmax_scale = p.softmax_scale;
  f.causal = p.causal;
  f.window_left = p.window_left;
  f.window_right = p.window_right;
  f.softcap = p.softcap;
  f.sinks = p.sinks;
  f.cu_seqlens_q = p.cu_seqlens_q;
  f.cu_seqlens_k = p.cu_seqlens_k;
  f.seqused_q = p.seqused_q;
  f.seqused_k = p.seqused_k;
  f.total_q = p.total_q;
  f.total_k = p.total_k;
  f.alibi_slopes = p.alibi_slopes;
  f.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  return f;
}

bool backward_has_queries(const BackwardParams& p) {
  return p.batch > 0 && p.seqlen_q > 0 && (p.cu_seqlens_q == nullptr || p.total_q > 0);
}

bool backward_has_keys(const BackwardParams& p) {
  return p.batch > 0 && p.seqlen_k > 0 && (p.cu_seqlens_q == nullptr || p.total_k > 0);
}

CheckResult validate_backward(const BackwardParams& p, const BuildConfig& built) {
  if (p.dtype == DType::kFloat8E4M3)
    return unsupported("dtype: e4m3 (FP8) has a forward only; the backward takes bf16 or fp16");
  if ((p.cu_seqlens_q != nullptr) != (p.cu_seqlens_k != nullptr))
    return invalid(cat("cu_seqlens_q and cu_seqlens_k: give both (varlen) or neither in the "
                       "backward; got cu_seqlens_q = ", pointer_text(p.cu_seqlens_q),
                       ", cu_seqlens_k = ", pointer_text(p.cu_seqlens_k)));
  if (p.seqused_k != nullptr && p.cu_seqlens_q == nullptr)
    return unsupported("seqused_k: only with varlen (cu_seqlens_q) in the backward (a KV cache's "
                       "key counts are forward only)");
  if (CheckResult r = validate_forward(forward_view(p), built); !r.ok()) return r;
  // Varlen's workspace rows: every sequence padded to whole query blocks (bwd_workspace.cpp).
  const int64_t block_m = kernels::bwd_tile_config(p.head_dim).block_m;
  if (p.cu_seqlens_q != nullptr && int64_t{p.total_q} + (int64_t{p.batch} + 1) * block_m > kMaxRows)
    return invalid(cat("total_q + (batch + 1) * ", block_m, " must be at most ", kMaxRows,
                       " for the varlen backward; got ", int64_t{p.total_q} + (int64_t{p.batch} + 1) * block_m));
  const bool q_used = backward_has_queries(p);
  const bool kv_used = backward_has_keys(p);
  const struct {
    const char* name;
    const Tensor4d& tensor;
    bool used;
  } tensors[] = {{"dout", p.dout, q_used}, {"dq", p.dq, q_used}, {"dk", p.dk, kv_used},
                 {"dv", p.dv, kv_used}};
  for (const auto& t : tensors) {
    if (!t.used) continue;
    if (CheckResult r = check_tensor(t.name, t.tensor, dtype_bytes(p.dtype)); !r.ok()) return r;
  }
  if (p.dsinks != nullptr && p.sinks == nullptr)
    return invalid("dsinks: the gradient of the sinks needs the forward's sinks; got sinks = NULL");
  if (CheckResult r = check_aligned_pointer("dsinks", p.dsinks); !r.ok()) return r;
  // Only a problem with queries and keys reads lse and needs the workspace.
  if (!q_used || !kv_used) return {};
  if (p.lse == nullptr)
    return invalid(cat("lse: expected the forward's LSE, ",
                       p.cu_seqlens_q != nullptr ? "(num_heads_q, total_q)" : "(batch, num_heads_q, seqlen_q)",
                       " fp32; got NULL"));
  return check_workspace(p.workspace, p.workspace_bytes, bwd_workspace_layout(p).bytes,
                         "backward_workspace_size");
}

}  // namespace flash3::host

namespace flash3::host {

CheckResult validate_quantize_fp8(const QuantizeFp8Params& p) {
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16 && p.dtype != DType::kFloat8E4M3)
    return invalid(cat("dtype: expected fp16 (", static_cast<int>(DType::kFloat16), "), bf16 (",
                       static_cast<int>(DType::kBFloat16), ") or e4m3 (",
                       static_cast<int>(DType::kFloat8E4M3), ", v only); got ",
                       static_cast<int>(p.dtype)));
  if (p.scaling != Fp8Scaling::kPerBlock && p.scaling != Fp8Scaling::kPerTensor)
    return invalid(cat("scaling: expected per-block (0) or per-tensor (1); got ",
                       static_cast<int>(p.scaling)));
  for (CheckResult r : {check_size("batch", p.batch, 0), check_size("seqlen_q", p.seqlen_q, 0),
                        check_size("seqlen_k", p.seqlen_k, 0),
                        check_size("num_heads_q", p.heads_q, 1),
                        check_size("num_heads_kv", p.heads_kv, 1)})
    if (!r.ok()) return r;
  if (head_dim_index(p.head_dim) < 0)
    return unsupported(
        cat("head_dim: supported head dims are ", supported_head_dims(), "; got ", p.head_dim));
  if (CheckResult r = check_fp8_head_dim(p.head_dim); !r.ok()) return r;
  for (CheckResult r : {check_rows("batch * seqlen_q * num_heads_q", rows(p.batch, p.seqlen_q, p.heads_q)),
                        check_rows("batch * seqlen_k * num_heads_kv", rows(p.batch, p.seqlen_k, p.heads_kv))})
    if (!r.ok()) return r;

  const bool v_only = p.dtype == DType::kFloat8E4M3;
  const bool q_used = !v_only && p.batch > 0 && p.seqlen_q > 0;
  const bool kv_used = p.batch > 0 && p.seqlen_k > 0;
  const int in_bytes = dtype_bytes(p.dtype);
  const struct {
    const char* name;
    const Tensor4d& tensor;
    int bytes;
    bool used;
  } tensors[] = {{"q", p.q, in_bytes, q_used},        {"k", p.k, in_bytes, kv_used && !v_only},
                 {"v", p.v, in_bytes, kv_used},       {"q_out", p.q_out, 1, q_used},
                 {"k_out", p.k_out, 1, kv_used && !v_only}, {"vt_out", p.vt_out, 1, kv_used}};
  for (const auto& t : tensors) {
    if (!t.used) continue;
    if (CheckResult r = check_tensor(t.name, t.tensor, t.bytes); !r.ok()) return r;
  }
  const struct {
    const char* name;
    const float* scale;
    bool used;
  } scales[] = {{"q_scale", p.q_scale, q_used},
                {"k_scale", p.k_scale, kv_used && !v_only},
                {"v_scale", p.v_scale, kv_used && !v_only}};
  for (const auto& s : scales) {
    if (!s.used) continue;
    if (s.scale == nullptr)
      return invalid(cat(s.name, ": expected fp32 device memory for the scales; got NULL"));
    if (CheckResult r = check_aligned_pointer(s.name, s.scale); !r.ok()) return r;
  }
  return check_aligned_pointer("hadamard_signs", p.hadamard_signs);
}

}  // namespace flash3::host

namespace flash3::host {

CheckResult validate_combine(const CombineParams& p) {
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16 && p.out_dtype != DType::kFloat32)
    return invalid(cat("out_dtype: expected fp16 (", static_cast<int>(DType::kFloat16), "), bf16 (",
                       static_cast<int>(DType::kBFloat16), ") or fp32 (",
                       static_cast<int>(DType::kFloat32), "); got ", static_cast<int>(p.out_dtype)));
  for (CheckResult r : {check_size("num_splits", p.num_splits, 1), check_size("batch", p.batch, 0),
                        check_size("seqlen", p.seqlen, 0), check_size("num_heads", p.heads, 1),
                        check_size("head_dim", p.head_dim, 1),
                        check_rows("batch * seqlen * num_heads", rows(p.batch, p.seqlen, p.heads))})
    if (!r.ok()) return r;
  if (p.head_dim > kernels::kCombineMaxHeadDim)
    return unsupported(cat("head_dim: combine supports up to ", kernels::kCombineMaxHeadDim, "; got ",
                           p.head_dim));
  if (p.batch == 0 || p.seqlen == 0) return {};
  const struct {
    const char* name;
    const void* pointer;
    size_t alignment;
  } pointers[] = {{"out_partial", p.out_partial, alignof(float)},
                  {"lse_partial", p.lse_partial, alignof(float)},
                  {"out", p.out.data, size_t(dtype_bytes(p.out_dtype))}};
  for (const auto& t : pointers) {
    if (t.pointer == nullptr) return invalid(cat(t.name, ": expected a non-null data pointer; got NULL"));
    if (reinterpret_cast<uintptr_t>(t.pointer) % t.alignment != 0)
      return invalid(cat(t.name, ": pointer must be ", t.alignment, "-byte aligned; got ", t.pointer));
  }
  if (p.out_partial_stride[4] != 1)
    return invalid(cat("out_partial: head_dim stride must be 1 (last dimension contiguous); got ",
                       p.out_partial_stride[4]));
  if (p.out.stride[3] != 1)
    return invalid(cat("out: head_dim stride must be 1 (last dimension contiguous); got ", p.out.stride[3]));
  for (int d = 0; d < 4; ++d) {
    if (p.out_partial_stride[d] < 0)
      return invalid(cat("out_partial: stride[", d, "] must be >= 0; got ", p.out_partial_stride[d]));
    if (p.lse_partial_stride[d] < 0)
      return invalid(cat("lse_partial: stride[", d, "] must be >= 0; got ", p.lse_partial_stride[d]));
  }
  for (int d = 0; d < 3; ++d)
    if (p.out.stride[d] < 0)
      return invalid(cat("out: ", kDimNames[d], " stride must be >= 0; got ", p.out.stride[d]));
  for (CheckResult r : {check_aligned_pointer("lse", p.lse), check_aligned_pointer("sinks", p.sinks)})
    if (!r.ok()) return r;
  return {};
}

}  // namespace flash3::host
