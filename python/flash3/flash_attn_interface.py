"""FlashAttention-3's Python interface (`flash_attn_interface`) on flash3.

Code written for FA3 switches with one import:

    from flash3.flash_attn_interface import flash_attn_func

Same function names, argument names, defaults and return conventions as
FA3's hopper/flash_attn_interface.py. Where flash3 does not (yet) implement
what an argument asks for, the call raises `flash3.Flash3Unsupported` naming
the argument instead of computing something else; arguments that are only
performance hints are accepted and ignored. docs/python.md lists every
difference.
"""

import torch

from . import _lib
from . import kvcache as _kvcache
from .fp8 import flash_attn_fp8
from .ops import flash_attn_func as _flash3_attn_func
from .varlen import flash_attn_varlen_func as _flash3_varlen_func

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "flash_attn_combine", "get_scheduler_metadata"]


def _unsupported(what):
    return _lib.Flash3Unsupported(_lib.Status.UNSUPPORTED, f"{what} is not supported by flash3 yet")


def _require_default(name, value, default):
    if value != default:
        raise _unsupported(f"{name}={value!r} (only {default!r})")


def _refuse_unimplemented(qv, q_descale, k_descale, v_descale, attention_chunk):
    # Descales belong to FP8 inputs (flash_attn_func routes those to flash3.fp8).
    for name, value in (("qv", qv), ("q_descale", q_descale), ("k_descale", k_descale),
                        ("v_descale", v_descale)):
        _require_default(name, value, None)
    _require_default("attention_chunk", attention_chunk, 0)


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """softmax(q k^T * softmax_scale) v as FA3 computes it; returns out, or
    (out, softmax_lse) with return_attn_probs=True. q: (batch, seqlen_q,
    nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); GQA/MQA
    when nheads_k divides nheads; causal aligned to the bottom-right corner.
    Differentiable in q, k, v. num_splits, pack_gqa and sm_margin are
    scheduling hints flash3 chooses itself; they are accepted and ignored.
    float8_e4m3fn q, k, v run the FP8 kernel with the optional (batch,
    nheads_k) fp32 descales and return bf16, forward only (flash3.fp8)."""
    if q.dtype == torch.float8_e4m3fn:
        _refuse_unimplemented(qv, None, None, None, attention_chunk)
        _require_default("softcap", softcap, 0.0)
        return flash_attn_fp8(q, k, v, q_descale, k_descale, v_descale,
                              softmax_scale=softmax_scale, causal=causal,
                              window_size=tuple(window_size), return_lse=return_attn_probs)
    _refuse_unimplemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    return _flash3_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                             return_lse=return_attn_probs, deterministic=deterministic,
                             window_size=tuple(window_size), softcap=softcap)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Packed variable-length batches as FA3 takes them: q (total_q, nheads,
    headdim), k, v (total_k, nheads_k, headdim), cu_seqlens (batch + 1,)
    int32; returns out, or (out, softmax_lse (nheads, total_q)).
    Differentiable in q, k, v; deterministic as in flash_attn_func; num_splits,
    pack_gqa and sm_margin are ignored hints as in flash_attn_func."""
    _refuse_unimplemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    return _flash3_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=softmax_scale, causal=causal,
                               window_size=tuple(window_size), softcap=softcap,
                               seqused_q=seqused_q, seqused_k=seqused_k,
                               return_lse=return_attn_probs, deterministic=deterministic)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """FA3's KV-cache call on flash3.kvcache (which documents what is not
    there yet: FP8 caches). With varlen q, flash3 appends one new key per
    query (k and v packed like q), so cu_seqlens_k_new may only be
    cu_seqlens_q itself. scheduler_metadata and sm_margin are ignored hints."""
    _refuse_unimplemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    if cu_seqlens_k_new is not None and cu_seqlens_k_new is not cu_seqlens_q:
        raise _unsupported("flash_attn_with_kvcache: cu_seqlens_k_new other than cu_seqlens_q "
                           "(new keys packed apart from q)")
    if rotary_seqlens is not None:
        raise _unsupported("flash_attn_with_kvcache: rotary_seqlens")
    del scheduler_metadata, sm_margin
    return _kvcache.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=causal,
        window_size=tuple(window_size), softcap=softcap, rotary_interleaved=rotary_interleaved,
        num_splits=num_splits, pack_gqa=pack_gqa, return_softmax_lse=return_softmax_lse)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's split merge: returns (out (batch, seqlen, heads, head_dim),
    lse (batch, heads, seqlen) fp32)."""
    return _kvcache.flash_attn_combine(out_partial, lse_partial, out=out, out_dtype=out_dtype,
                                       return_lse=True)


def get_scheduler_metadata(*args, **kwargs):
    """FA3 precomputes split-KV scheduling for flash_attn_with_kvcache; flash3
    chooses splits inside the call (no metadata to precompute)."""
    raise _unsupported("get_scheduler_metadata (KV-cache scheduling)")
