"""Inference entry points: `flash_attn_with_kvcache` (FA3's argument names)
over a KV cache, plain or paged, with split-KV decoding, and
`flash_attn_combine`, the split merge on its own.

The C library reads the cache as it is: per-batch key ranges (cache_seqlens,
cache_leftpad), a batch index (cache_batch_idx) and a page table are device
arrays the kernel follows, so a decode step does no host synchronization
and can be captured in a CUDA graph. The steps are custom ops
(`flash3::fwd_kvcache`, `flash3::combine`) with fakes for torch.compile.

With k and v the kernel itself appends them to the cache at cache_seqlens
(rotating them, and q, when rotary tables are given) before attending: one
launch, and the custom op `flash3::fwd_kvcache_append` says it mutates the
caches.

Varlen q (cu_seqlens_q) appends one new key per query: k and v are packed
like q (chunked prefill, speculative decoding).
Not yet here (see docs/python.md): FP8 caches.
"""

from typing import Optional

import torch

from . import _lib
from .ops import (_ABI_DTYPE, _CONTIGUOUS, _abi_scale, _abi_window, _can_skip_dispatcher,
                  _check_alibi, _check_sinks, _fwd_fields, _on_device, _raw_stream,
                  _sinks_as_fp32)

_INT32 = torch.int32
_FLOAT32 = torch.float32
_OUT_DTYPES = {torch.float16: _lib.DType.FLOAT16, torch.bfloat16: _lib.DType.BFLOAT16,
               torch.float32: _lib.DType.FLOAT32}


def _invalid(message):
    return _lib.Flash3InvalidArgument(_lib.Status.INVALID_ARGUMENT, message)


def _tensor(t):
    return _lib.Tensor(t.data_ptr(), tuple(t.stride()))


def _address(t):
    return 0 if t is None else t.data_ptr()


def _check_index(name, t, batch, device):
    """An optional (batch,) int32 array on q's device."""
    if t is None:
        return
    if t.dtype != _INT32 or t.shape != (batch,) or (batch and t.stride() != (1,)):
        raise _invalid(f"{name}: expected a contiguous int32 tensor of shape ({batch},); got "
                       f"{t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise _invalid(f"{name}: must be on q's device ({device}); got {t.device}")


def _check_cu_seqlens_q(cu_seqlens_q, max_seqlen_q, q):
    """Varlen q: q (total_q, heads, dim) and cu_seqlens_q (batch + 1,) int32;
    returns batch."""
    if q.dim() != 3:
        raise _invalid(f"q: must be 3-d (total_q, heads, headdim) with cu_seqlens_q; got shape "
                       f"{tuple(q.shape)}")
    if (cu_seqlens_q.dtype != _INT32 or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1
            or cu_seqlens_q.stride() != (1,)):
        raise _invalid(f"cu_seqlens_q: expected a contiguous int32 tensor (batch + 1,); got "
                       f"{cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}")
    if cu_seqlens_q.device != q.device:
        raise _invalid(f"cu_seqlens_q: must be on q's device ({q.device}); got "
                       f"{cu_seqlens_q.device}")
    _check_max_seqlen_q(max_seqlen_q)
    return cu_seqlens_q.shape[0] - 1


def _check_max_seqlen_q(max_seqlen_q):
    if not isinstance(max_seqlen_q, int) or isinstance(max_seqlen_q, bool) or max_seqlen_q < 0:
        raise _invalid(f"max_seqlen_q: expected an int >= 0 with cu_seqlens_q (the longest "
                       f"sequence; it sizes the grid); got {max_seqlen_q!r}")


def _check_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                   page_table, sinks, need_cuda, varlen_q=None):
    """What the C ABI cannot see: devices, dtypes, and shapes agreeing
    where it carries one value. varlen_q: (cu_seqlens_q, max_seqlen_q) or
    None. Returns seqlen_k (the capacity per batch entry)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
        if t.dim() != 4 and (t is not q or varlen_q is None):
            raise _invalid(f"{name}: must be 4-d (batch, seqlen, heads, headdim); got shape "
                           f"{tuple(t.shape)}")
    batch = q.shape[0] if varlen_q is None else _check_cu_seqlens_q(*varlen_q, q)
    if need_cuda and q.device.type != "cuda":
        raise _invalid(f"q: must be a CUDA tensor; got device {q.device}")
    if q.dtype not in _ABI_DTYPE:
        raise _invalid(f"q: dtype must be torch.float16 or torch.bfloat16; got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
    if v_cache.shape != k_cache.shape:
        raise _invalid(f"v_cache: shape must equal k_cache's {tuple(k_cache.shape)}; got "
                       f"{tuple(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[-1]:
        raise _invalid(f"k_cache: head_dim must equal q's ({q.shape[-1]}); got {k_cache.shape[3]}")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad)):
        _check_index(name, t, batch, q.device)
    _check_sinks(sinks, q)
    if page_table is None:
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            raise _invalid(f"k_cache: batch must equal q's ({batch}) without cache_batch_idx; "
                           f"got {k_cache.shape[0]}")
        return k_cache.shape[1]
    if (page_table.dtype != _INT32 or page_table.dim() != 2 or page_table.shape[0] != batch
            or (page_table.numel() and page_table.stride(1) != 1)):
        raise _invalid(f"page_table: expected an int32 tensor (batch, max_pages) = ({batch}, ...) "
                       f"with contiguous rows; got {page_table.dtype} {tuple(page_table.shape)}")
    if page_table.device != q.device:
        raise _invalid(f"page_table: must be on q's device ({q.device}); got {page_table.device}")
    return page_table.shape[1] * k_cache.shape[1]


def _check_append(q, k_cache, k, v, rotary_cos, rotary_sin, cache_seqlens):
    """Append's tensors: k and v (batch, seqlen_new, heads_kv, head_dim) like
    the cache's rows, or with varlen q (3-d) (total_q, heads_kv, head_dim),
    one new key per query; rotary tables (seqlen_ro, rotary_dim / 2) of q's
    dtype. The C library checks the rest (rotary_dim, table length, strides)."""
    if (k is None) != (v is None):
        raise _invalid(f"k and v: give both (to append to the cache) or neither; got "
                       f"{'k' if v is None else 'v'} only")
    if k is None:
        if rotary_cos is not None or rotary_sin is not None:
            raise _invalid("rotary_cos, rotary_sin: rotary embedding applies to appended keys "
                           "(and q); pass k and v too")
        return
    if q.dim() == 3:
        layout, expected = "(total_q, heads_kv, head_dim)", (q.shape[0], k_cache.shape[2], q.shape[2])
    else:
        layout = "(batch, seqlen_new, heads_kv, head_dim)"
        expected = (q.shape[0], k.shape[1] if k.dim() == 4 else -1, k_cache.shape[2], q.shape[3])
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != expected:
            raise _invalid(f"{name}: expected shape {layout} = {expected}; got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
    if cache_seqlens is None:
        raise _invalid("cache_seqlens: required with k and v (each batch entry's new keys go "
                       "at its cache_seqlens)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise _invalid("rotary_cos and rotary_sin: give both or neither")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t.dim() != 2 or t.shape != rotary_cos.shape:
            raise _invalid(f"{name}: expected shape (seqlen_ro, rotary_dim / 2), the same for "
                           f"cos and sin; got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")


def _append_fields(append, causal, window_left, window_right, varlen_q=None):
    """The v8 fields of FwdLauncher's `cache` for append = (k, v, rotary_cos,
    rotary_sin, rotary_interleaved), or None. Varlen q: k and v are one
    packed entry (its batch stride unused), seqlen_new is max_seqlen_q."""
    if append is None:
        return _NO_APPEND
    k, v, cos, sin, interleaved = append
    rotary = () if cos is None else (cos.shape[1] * 2, cos.shape[0])
    # FA's rule: causal or windowed queries sit at the end of the keys, one
    # position each; otherwise all at cache_seqlens.
    per_row = causal or window_left >= 0 or window_right >= 0
    if varlen_q is None:
        k_strides, v_strides, seqlen_new = k.stride(), v.stride(), k.shape[1]
    else:
        k_strides, v_strides, seqlen_new = (0, *k.stride()), (0, *v.stride()), varlen_q[1]
    return (k.data_ptr(), *k_strides, v.data_ptr(), *v_strides, _address(cos), _address(sin),
            seqlen_new, *(rotary or (0, 0)), 1 if interleaved else 0, 1 if per_row else 0)


_NO_APPEND = (0,) * 17


def _lse_shape(q):
    """(batch, heads_q, seqlen_q), or with varlen q (3-d) (heads_q, total_q)."""
    return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])


def _empty_outputs(q):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(_lse_shape(q), dtype=_FLOAT32, device=q.device))


_launcher = None
# (device, dtype, sizes, num_splits) -> workspace bytes: the library's answer
# depends on nothing else, and asking costs a C call per step otherwise.
_workspace_bytes = {}
_MAX_WORKSPACE_ENTRIES = 1024


def _kvcache_ok(q, k_cache, v_cache, page_table):
    """True when _check_kvcache(need_cuda=True) would pass for a call with
    no index arrays and no sinks; one cheap expression for the decode path."""
    qs, ks = q.shape, k_cache.shape
    device = q.get_device()
    return (
        q.is_cuda and k_cache.get_device() == device and v_cache.get_device() == device
        and q.dtype in _ABI_DTYPE and k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
        and len(qs) == 4 and len(ks) == 4 and v_cache.shape == ks and ks[3] == qs[3]
        and (ks[0] == qs[0] if page_table is None else (
            page_table.dtype == _INT32 and page_table.dim() == 2 and page_table.shape[0] == qs[0]
            and page_table.get_device() == device and page_table.stride(1) == 1))
    )


def _fwd_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
                 softmax_scale, causal, window_left, window_right, softcap, sinks, num_splits,
                 want_lse=True, append=None, varlen_q=None, pack_gqa=0, alibi_slopes=None):
    """The eager implementation: check, allocate out (and lse unless
    want_lse is false), size and allocate the split workspace, launch.
    append: (k, v, rotary_cos, rotary_sin, rotary_interleaved) or None;
    varlen_q: (cu_seqlens_q, max_seqlen_q) or None;
    pack_gqa: the C ABI's value (0 auto, 1 off, 2 on)."""
    global _launcher
    if append is not None:
        seqlen_k = _check_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx,
                                  cache_leftpad, page_table, sinks, need_cuda=True,
                                  varlen_q=varlen_q)
        _check_append(q, k_cache, *append[:4], cache_seqlens)
        # The kernel reads rows with unit stride along head_dim, and whole tables.
        k, v, cos, sin, interleaved = append
        k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
        cos, sin = (None if t is None else t.contiguous() for t in (cos, sin))
        append = (k, v, cos, sin, interleaved)
    elif (varlen_q is None and cache_batch_idx is None and cache_leftpad is None and sinks is None
            and (cache_seqlens is None or (cache_seqlens.dtype == _INT32
                                           and cache_seqlens.shape == (q.shape[0],)
                                           and cache_seqlens.get_device() == q.get_device()
                                           and cache_seqlens.is_contiguous()))
            and _kvcache_ok(q, k_cache, v_cache, page_table)):
        seqlen_k = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
    else:
        seqlen_k = _check_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx,
                                  cache_leftpad, page_table, sinks, need_cuda=True,
                                  varlen_q=varlen_q)
    batch = _batch(q, varlen_q)
    seqlen_q = q.shape[1] if varlen_q is None else varlen_q[1]
    alibi = _check_alibi(alibi_slopes, batch, q)
    if _launcher is None:
        _launcher = _lib.FwdLauncher(with_cache=True)
    out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    lse = q.new_empty(_lse_shape(q), dtype=_FLOAT32) if want_lse else None
    fields = _fwd_fields(q, k_cache, v_cache, out, lse, softmax_scale, causal, window_left,
                         window_right, softcap, sinks, None, seqlen_k, cache_seqlens, varlen_q)
    paged = page_table is not None
    cache = [_address(cache_batch_idx), _address(cache_leftpad), _address(page_table),
             page_table.stride(0) if paged else 0, k_cache.shape[1] if paged else 0,
             k_cache.shape[0], num_splits, 0, 0,
             *_append_fields(append, causal, window_left, window_right, varlen_q), pack_gqa]
    device = q.get_device()
    heads_q, head_dim = q.shape[-2:]
    key = (device, q.dtype, batch, seqlen_q, seqlen_k, heads_q, k_cache.shape[2], head_dim,
           num_splits, pack_gqa)
    workspace_bytes = _workspace_bytes.get(key)
    if workspace_bytes is None:
        workspace_bytes = _launcher.workspace_size(fields, cache, alibi)
        if len(_workspace_bytes) >= _MAX_WORKSPACE_ENTRIES:
            _workspace_bytes.clear()
        _workspace_bytes[key] = workspace_bytes
    if workspace_bytes:
        workspace = q.new_empty((workspace_bytes,), dtype=torch.uint8)
        cache[7:9] = workspace.data_ptr(), workspace_bytes
    _on_device(device, lambda stream: _launcher(stream, fields, cache, alibi))
    return out, lse


@torch.library.custom_op("flash3::fwd_kvcache", mutates_args=())
def _fwd_kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
                    cache_leftpad: Optional[torch.Tensor], page_table: Optional[torch.Tensor],
                    softmax_scale: Optional[float], causal: bool, window_left: int,
                    window_right: int, softcap: float, sinks: Optional[torch.Tensor],
                    num_splits: int, cu_seqlens_q: Optional[torch.Tensor], max_seqlen_q: int,
                    pack_gqa: int, alibi_slopes: Optional[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over the cache: (out like q, lse (b, hq, sq) fp32, or
    with cu_seqlens_q (hq, total_q))."""
    return _fwd_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                        page_table, softmax_scale, causal, window_left, window_right, softcap,
                        sinks, num_splits, varlen_q=_varlen_q(cu_seqlens_q, max_seqlen_q),
                        pack_gqa=pack_gqa, alibi_slopes=alibi_slopes)


@_fwd_kvcache_op.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                      page_table, softmax_scale, causal, window_left, window_right, softcap,
                      sinks, num_splits, cu_seqlens_q=None, max_seqlen_q=0, pack_gqa=0,
                      alibi_slopes=None):
    varlen_q = _varlen_q(cu_seqlens_q, max_seqlen_q)
    _check_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                   page_table, sinks, need_cuda=False, varlen_q=varlen_q)
    _check_alibi(alibi_slopes, _batch(q, varlen_q), q)
    _abi_scale(softmax_scale)
    return _empty_outputs(q)


def _varlen_q(cu_seqlens_q, max_seqlen_q):
    return None if cu_seqlens_q is None else (cu_seqlens_q, max_seqlen_q)


def _batch(q, varlen_q):
    return q.shape[0] if varlen_q is None else varlen_q[0].shape[0] - 1


@torch.library.custom_op("flash3::fwd_kvcache_append", mutates_args=("k_cache", "v_cache"))
def _fwd_kvcache_append_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           k: torch.Tensor, v: torch.Tensor, rotary_cos: Optional[torch.Tensor],
                           rotary_sin: Optional[torch.Tensor], rotary_interleaved: bool,
                           cache_seqlens: Optional[torch.Tensor],
                           cache_batch_idx: Optional[torch.Tensor],
                           cache_leftpad: Optional[torch.Tensor], page_table: Optional[torch.Tensor],
                           softmax_scale: Optional[float], causal: bool, window_left: int,
                           window_right: int, softcap: float, sinks: Optional[torch.Tensor],
                           num_splits: int, pack_gqa: int, alibi_slopes: Optional[torch.Tensor],
                           cu_seqlens_q: Optional[torch.Tensor], max_seqlen_q: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v appended to the caches (in place), then attention of q over them."""
    return _fwd_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                        page_table, softmax_scale, causal, window_left, window_right, softcap,
                        sinks, num_splits, append=(k, v, rotary_cos, rotary_sin,
                                                   rotary_interleaved), pack_gqa=pack_gqa,
                        alibi_slopes=alibi_slopes, varlen_q=_varlen_q(cu_seqlens_q, max_seqlen_q))


@_fwd_kvcache_append_op.register_fake
def _fwd_kvcache_append_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                             rotary_interleaved, cache_seqlens, cache_batch_idx, cache_leftpad,
                             page_table, softmax_scale, causal, window_left, window_right,
                             softcap, sinks, num_splits, pack_gqa, alibi_slopes, cu_seqlens_q,
                             max_seqlen_q):
    outputs = _fwd_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx,
                                cache_leftpad, page_table, softmax_scale, causal, window_left,
                                window_right, softcap, sinks, num_splits, cu_seqlens_q,
                                max_seqlen_q, alibi_slopes=alibi_slopes)
    _check_append(q, k_cache, k, v, rotary_cos, rotary_sin, cache_seqlens)
    return outputs


def _cache_seqlens_tensor(cache_seqlens, q, cu_seqlens_q=None):
    # FA's API also takes one int for every batch entry.
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((_batch(q, _varlen_q(cu_seqlens_q, None)),), cache_seqlens,
                          dtype=_INT32, device=q.device)
    raise _invalid(f"cache_seqlens: expected an int, an int32 tensor (batch,) or None; got "
                   f"{type(cache_seqlens).__name__}")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            max_seqlen_q=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            num_splits=0, pack_gqa=None, return_softmax_lse=False, sinks=None,
                            return_lse=None, alibi_slopes=None):
    """Attention of q (batch, seqlen_q, heads_q, head_dim) over a KV cache,
    or with cu_seqlens_q ((batch + 1,) int32) of q (total_q, heads_q,
    head_dim) packed as for flash_attn_varlen_func (sequence b is rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1], max_seqlen_q the longest).

    k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv, head_dim), or with
    page_table (num_pages, page_size, heads_kv, head_dim) with page_size a
    multiple of 16 and page_table (batch, max_pages) int32: key j of batch
    entry b is row j % page_size of page page_table[b, j // page_size].
    cache_seqlens: int or (batch,) int32, keys used per batch entry (default:
    the whole cache); cache_leftpad: (batch,) int32, the first key used;
    k, v (batch, seqlen_new, heads_kv, head_dim): new keys and values the
    kernel writes into the cache at cache_seqlens (which needs room for
    them; the caller advances cache_seqlens afterwards) and attends to;
    with cu_seqlens_q, k, v (total_q, heads_kv, head_dim) packed like q:
    sequence b appends one key per query, its rows of k and v.
    rotary_cos, rotary_sin (seqlen_ro >= the cache's capacity, rotary_dim / 2),
    q's dtype, rotary_dim a multiple of 16: rotary embedding of the new keys
    (key i at position cache_seqlens + i) and of q (query i at
    cache_seqlens + i when causal or windowed, else all at cache_seqlens),
    interleaved pairs (2j, 2j + 1) when rotary_interleaved, else GPT-NeoX
    pairs (j, j + rotary_dim / 2); q itself is left unchanged.
    cache_batch_idx: (batch,) int32, the cache entry each batch entry reads.
    Cache rows past cache_seqlens in the last key block are read and masked:
    they must be finite (e.g. a cache made with torch.zeros).
    causal and window_size align to the end of each entry's keys, as in FA.
    num_splits: split-KV; 0 chooses (more splits when batch x heads is small),
    1 none. pack_gqa: the query heads of a KV head as the rows of one tile;
    None chooses (where it takes fewer tiles), True or False forces it.
    alibi_slopes: ALiBi as in flash_attn_func, distances from the end of
    each entry's keys.
    Returns out (like q), or (out, lse) with lse (batch, heads_q, seqlen_q)
    fp32 ((heads_q, total_q) with cu_seqlens_q) when return_softmax_lse
    (FA3's name) or return_lse.
    """
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise _invalid(f"num_splits: expected an int >= 0 (0: chosen); got {num_splits!r}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise _invalid(f"pack_gqa: expected None (chosen), True or False; got {pack_gqa!r}")
    if cu_seqlens_q is not None and not isinstance(cu_seqlens_q, torch.Tensor):
        raise _invalid(f"cu_seqlens_q: expected an int32 tensor (batch + 1,); got "
                       f"{type(cu_seqlens_q).__name__}")
    pack = _PACK_GQA[pack_gqa]
    window_left, window_right = (-1, -1) if window_size == (-1, -1) else _abi_window(window_size)
    args = (q, k_cache, v_cache, _cache_seqlens_tensor(cache_seqlens, q, cu_seqlens_q),
            cache_batch_idx, cache_leftpad, page_table, softmax_scale, bool(causal), window_left,
            window_right, float(softcap), _sinks_as_fp32(sinks), num_splits)
    want_lse = return_softmax_lse if return_lse is None else return_lse
    appends = k is not None or v is not None or rotary_cos is not None or rotary_sin is not None
    varlen_q = None
    if cu_seqlens_q is not None:
        _check_max_seqlen_q(max_seqlen_q)  # the op's schema would refuse it unnamed
        varlen_q = (cu_seqlens_q, max_seqlen_q)
    if varlen_q is not None and not appends:
        if _can_skip_dispatcher(q, k_cache, v_cache) and all(
                t is None or type(t) is torch.Tensor
                for t in args[3:7] + args[12:13] + varlen_q[:1] + (alibi_slopes,)):
            out, lse = _fwd_kvcache(*args, want_lse=want_lse, varlen_q=varlen_q, pack_gqa=pack,
                                    alibi_slopes=alibi_slopes)
        else:
            out, lse = _fwd_kvcache_op(*args, cu_seqlens_q, max_seqlen_q, pack, alibi_slopes)
        return (out, lse) if want_lse else out
    if appends:
        appended = (k, v, rotary_cos, rotary_sin, bool(rotary_interleaved))
        if _can_skip_dispatcher(q, k_cache, v_cache) and all(
                t is None or type(t) is torch.Tensor
                for t in args[3:7] + args[12:13] + appended[:4] + (alibi_slopes, cu_seqlens_q)):
            out, lse = _fwd_kvcache(*args, want_lse=want_lse, append=appended, pack_gqa=pack,
                                    alibi_slopes=alibi_slopes, varlen_q=varlen_q)
        elif k is None or v is None:
            _check_append(q, k_cache, k, v, rotary_cos, rotary_sin, args[3])  # raises
        else:
            out, lse = _fwd_kvcache_append_op(q, k_cache, v_cache, *appended, *args[3:], pack,
                                              alibi_slopes, cu_seqlens_q,
                                              0 if varlen_q is None else max_seqlen_q)
        return (out, lse) if want_lse else out
    # The custom op costs ~15-20 us of host time; decode steps are short
    # enough that it would show. Skipped only where nothing could intercept it.
    if _can_skip_dispatcher(q, k_cache, v_cache) and all(
            t is None or type(t) is torch.Tensor
            for t in (args[3:7] + args[12:13] + (alibi_slopes,))):
        out, lse = _fwd_kvcache(*args, want_lse=want_lse, pack_gqa=pack, alibi_slopes=alibi_slopes)
    else:
        out, lse = _fwd_kvcache_op(*args, None, 0, pack, alibi_slopes)
    return (out, lse) if want_lse else out


# flash3_fwd_params.pack_gqa (FLASH3_PACK_GQA_*) for the Python argument.
_PACK_GQA = {None: 0, False: 1, True: 2}


def _check_combine(out_partial, lse_partial, out_dtype, need_cuda):
    if out_partial.dim() != 5 or out_partial.dtype != _FLOAT32:
        raise _invalid(f"out_partial: expected a float32 tensor (num_splits, batch, seqlen, "
                       f"heads, head_dim); got {out_partial.dtype} {tuple(out_partial.shape)}")
    expected = tuple(out_partial.shape[:4])
    if lse_partial.dtype != _FLOAT32 or tuple(lse_partial.shape) != expected:
        raise _invalid(f"lse_partial: expected a float32 tensor (num_splits, batch, seqlen, "
                       f"heads) = {expected}; got {lse_partial.dtype} {tuple(lse_partial.shape)}")
    if lse_partial.device != out_partial.device:
        raise _invalid(f"lse_partial: must be on out_partial's device ({out_partial.device}); "
                       f"got {lse_partial.device}")
    if need_cuda and out_partial.device.type != "cuda":
        raise _invalid(f"out_partial: must be a CUDA tensor; got device {out_partial.device}")
    if out_dtype not in _OUT_DTYPES:
        raise _invalid(f"out_dtype: expected torch.float16, torch.bfloat16 or torch.float32; "
                       f"got {out_dtype}")


def _empty_combined(out_partial, out_dtype):
    _, batch, seqlen, heads, head_dim = out_partial.shape
    device = out_partial.device
    return (torch.empty((batch, seqlen, heads, head_dim), dtype=out_dtype, device=device),
            torch.empty((batch, heads, seqlen), dtype=_FLOAT32, device=device))


@torch.library.custom_op("flash3::combine", mutates_args=())
def _combine_op(out_partial: torch.Tensor, lse_partial: torch.Tensor,
                out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV merge: (out (b, s, h, d) of out_dtype, lse (b, h, s) fp32)."""
    _check_combine(out_partial, lse_partial, out_dtype, need_cuda=True)
    if out_partial.stride(-1) != 1:
        out_partial = out_partial.contiguous()
    out, lse = _empty_combined(out_partial, out_dtype)
    splits, batch, seqlen, heads, head_dim = out_partial.shape
    params = _lib.CombineParams(
        out_partial=out_partial.data_ptr(), out_partial_stride=tuple(out_partial.stride()),
        lse_partial=lse_partial.data_ptr(), lse_partial_stride=tuple(lse_partial.stride()),
        out=_tensor(out), out_dtype=_OUT_DTYPES[out_dtype], num_splits=splits,
        lse=lse.data_ptr(), batch=batch, seqlen=seqlen, num_heads=heads, head_dim=head_dim)
    device = out_partial.get_device()
    with torch.cuda.device(device):
        _lib.combine(params, _raw_stream(device))
    return out, lse


@_combine_op.register_fake
def _combine_fake(out_partial, lse_partial, out_dtype):
    _check_combine(out_partial, lse_partial, out_dtype, need_cuda=False)
    return _empty_combined(out_partial, out_dtype)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None, return_lse=False):
    """Merge split-KV partial results as FA3's flash_attn_combine does:
    out_partial (num_splits, batch, seqlen, heads, head_dim) fp32, each
    split's normalized output, and lse_partial (num_splits, batch, seqlen,
    heads) fp32, its natural-log LSE (-inf for a split that saw no key).
    Returns out (batch, seqlen, heads, head_dim) in out_dtype (default fp32),
    written into `out` when given; with return_lse also lse (batch, heads,
    seqlen) fp32."""
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else _FLOAT32
    result, lse = _combine_op(out_partial, lse_partial, out_dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return (result, lse) if return_lse else result
