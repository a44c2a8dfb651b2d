"""Variable-length batches: the `flash3::fwd_varlen` custom op and
flash_attn_varlen_func (FlashAttention's interface for packed sequences).

Sequences of different lengths are packed along one token dimension, q
(total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim), and
cu_seqlens_q / cu_seqlens_k (batch + 1, int32) give where each starts. The
library checks everything the C ABI carries; this module checks what only
torch can see (devices, dtypes, the arrays' shapes). The cu_seqlens' values
are on the GPU and not checked (that would synchronize): the kernels clamp
them to the packed tensors, so wrong ones give wrong rows, never an access
outside the tensors.
"""

from typing import Optional

import torch

from . import _lib
from .ops import (_ABI_DTYPE, _CONTIGUOUS, _FLOAT32, _Tensor, _abi_scale, _abi_window,
                  _can_skip_dispatcher, _check_alibi, _check_bwd_inputs, _check_sinks,
                  _check_v_shape, _dense, _empty_dsinks, _empty_out, _invalid, _launch,
                  _launch_bwd, _sinks_as_fp32)

_INT32 = torch.int32


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                         max_seqlen_q, max_seqlen_k, need_cuda):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise _invalid(f"{name}: must be 3-d (total_tokens, heads, headdim) with varlen; "
                           f"got shape {tuple(t.shape)}")
    if need_cuda and q.device.type != "cuda":
        raise _invalid(f"q: must be a CUDA tensor; got device {q.device}")
    if q.dtype not in _ABI_DTYPE:
        raise _invalid(f"q: dtype must be torch.float16 or torch.bfloat16; got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
    if k.shape[2] != q.shape[2]:
        raise _invalid(f"k: head_dim must equal q's ({q.shape[2]}); got {k.shape[2]}")
    _check_v_shape(k, v)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < 1:
            raise _invalid(f"{name}: expected a 1-d int32 tensor of batch + 1 offsets; got "
                           f"{_describe(t)}")
    batch = cu_seqlens_q.shape[0] - 1
    expected = {"cu_seqlens_q": batch + 1, "cu_seqlens_k": batch + 1,
                "seqused_q": batch, "seqused_k": batch}
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                    ("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if t is None:
            continue
        if (not isinstance(t, torch.Tensor) or t.dtype != _INT32 or t.dim() != 1
                or t.shape[0] != expected[name] or (t.numel() and t.stride() != (1,))):
            raise _invalid(f"{name}: expected a contiguous int32 tensor of shape "
                           f"({expected[name]},) (batch = {batch} from cu_seqlens_q); "
                           f"got {_describe(t)}")
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
    _check_max_seqlens(max_seqlen_q, max_seqlen_k)


def _check_max_seqlens(max_seqlen_q, max_seqlen_k):
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        # SymInt under torch.compile.
        if not isinstance(value, (int, torch.SymInt)) or isinstance(value, bool) or value < 0:
            raise _invalid(f"{name}: expected an int >= 0 (the longest sequence); got {value!r}")


def _describe(t):
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {tuple(t.shape)} with strides {t.stride()}"


def _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal, window_left, window_right, softcap, sinks, seqused_q,
                    seqused_k, want_lse=True, alibi_slopes=None):
    """The eager implementation; want_lse false: lse is None (the kernel skips it)."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                         max_seqlen_q, max_seqlen_k, need_cuda=True)
    _check_sinks(sinks, q[None])
    alibi = _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q)
    out = _empty_out(q, v)
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=_FLOAT32) if want_lse else None
    _launch(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, sinks,
            varlen=(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                    max_seqlen_k), alibi=alibi)
    return out, lse


@torch.library.custom_op("flash3::fwd_varlen", mutates_args=())
def fwd_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention forward. q (total_q, hq, d); k, v (total_k, hkv, d);
    cu_seqlens (batch + 1,) int32. Returns out (total_q, hq, d) contiguous in
    q's dtype (rows in no sequence are left unwritten) and lse (hq, total_q)
    fp32. `deterministic` only affects the backward."""
    return _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale, causal, window_left, window_right, softcap, sinks,
                           seqused_q, seqused_k, alibi_slopes=alibi_slopes)


@fwd_varlen.register_fake
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left=-1, window_right=-1, softcap=0.0,
                     sinks=None, seqused_q=None, seqused_k=None, deterministic=False,
                     alibi_slopes=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                         max_seqlen_q, max_seqlen_k, need_cuda=False)
    _check_sinks(sinks, q[None])
    _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q)
    _abi_scale(softmax_scale)
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=_FLOAT32))


def _backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, deterministic, window_left,
                     window_right, softcap, sinks, seqused_q, seqused_k, alibi_slopes=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                         max_seqlen_q, max_seqlen_k, need_cuda=True)
    _check_bwd_inputs(dout, q, v, out, lse, varlen=True)
    _check_sinks(sinks, q[None])
    alibi = _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q)
    # Rows in no sequence get no gradient from the kernels: zeros, not garbage.
    dq = torch.zeros_like(q, memory_format=_CONTIGUOUS)
    dk = torch.zeros_like(k, memory_format=_CONTIGUOUS)
    dv = torch.zeros_like(v, memory_format=_CONTIGUOUS)
    dsinks = _empty_dsinks(q, sinks)
    _launch_bwd(_dense(dout), q, k, v, out, lse, dq, dk, dv, dsinks, softmax_scale, causal,
                deterministic, window_left, window_right, softcap, sinks,
                varlen=(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                        max_seqlen_k), alibi=alibi)
    return dq, dk, dv, dsinks


@torch.library.custom_op("flash3::bwd_varlen", mutates_args=())
def bwd_varlen(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Varlen attention backward: (dq, dk, dv, dsinks) for the forward that
    gave out, lse, packed like q, k, v (rows in no sequence are zero).
    dsinks: (hq,) fp32 with sinks, else an empty tensor."""
    return _backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, softmax_scale, causal, deterministic, window_left,
                            window_right, softcap, sinks, seqused_q, seqused_k, alibi_slopes)


@bwd_varlen.register_fake
def _bwd_varlen_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, deterministic, window_left=-1,
                     window_right=-1, softcap=0.0, sinks=None, seqused_q=None, seqused_k=None,
                     alibi_slopes=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                         max_seqlen_q, max_seqlen_k, need_cuda=False)
    _check_bwd_inputs(dout, q, v, out, lse, varlen=True)
    _check_sinks(sinks, q[None])
    _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q)
    return (torch.empty_like(q, memory_format=_CONTIGUOUS),
            torch.empty_like(k, memory_format=_CONTIGUOUS),
            torch.empty_like(v, memory_format=_CONTIGUOUS),
            _empty_dsinks(q, sinks))


def _fwd_varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     window_left, window_right, softcap, sinks, seqused_q, seqused_k, deterministic,
     alibi_slopes) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks, seqused_q,
                          seqused_k, alibi_slopes)
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad  # as in ops.py
    ctx.lengths = (max_seqlen_q, max_seqlen_k)
    ctx.options = (softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.mark_non_differentiable(lse)


def _fwd_varlen_backward(ctx, dout, _dlse):
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks, seqused_q, seqused_k,
     alibi_slopes) = ctx.saved_tensors
    sinks = sinks if ctx.sinks_need_grad else None
    dq, dk, dv, dsinks = torch.ops.flash3.bwd_varlen.default(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.lengths, *ctx.options, sinks,
        seqused_q, seqused_k, alibi_slopes)
    return (dq, dk, dv) + (None,) * 9 + (None if sinks is None else dsinks,) + (None,) * 4


fwd_varlen.register_autograd(_fwd_varlen_backward, setup_context=_fwd_varlen_setup_context)
_fwd_varlen_op = torch.ops.flash3.fwd_varlen.default


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           sinks=None, seqused_q=None, seqused_k=None, return_lse=False,
                           deterministic=False, alibi_slopes=None):
    """Exact attention over a batch of packed sequences of different lengths.

    q: (total_q, heads_q, head_dim); k, v: (total_k, heads_kv, head_dim),
    float16 or bfloat16 CUDA tensors (last dim contiguous); v's head dim may
    differ as in flash_attn_func. cu_seqlens_q,
    cu_seqlens_k: (batch + 1,) int32 on q's device, non-decreasing from 0:
    sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 (length 0 is
    allowed). seqused_q / seqused_k: optional (batch,) int32, sequence b is
    then that many rows from cu_seqlens[b]. max_seqlen_q / max_seqlen_k: the
    longest lengths (ints; max_seqlen_q sizes the launch, so it must not be
    below any sequence's length).
    softmax_scale, causal, window_size, softcap, sinks, alibi_slopes ((heads_q,)
    or (batch, heads_q)): as in flash_attn_func, with masks and ALiBi's
    distances aligned to each sequence's own bottom-right corner.
    Returns out (total_q, heads_q, head_dim), or (out, lse) with lse
    (heads_q, total_q) fp32 when return_lse is true. Rows that belong to no
    sequence are left unwritten. Differentiable in q, k, v and sinks as
    flash_attn_func (gradient rows in no sequence are zero); deterministic=True
    makes the backward bitwise reproducible.
    """
    window_left, window_right = (-1, -1) if window_size == (-1, -1) else _abi_window(window_size)
    sinks = _sinks_as_fp32(sinks)
    _check_max_seqlens(max_seqlen_q, max_seqlen_k)  # the op's schema would refuse them unnamed
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            bool(causal), window_left, window_right, float(softcap), sinks, seqused_q, seqused_k)
    if _can_skip_dispatcher(q, k, v) and all(
            t is None or type(t) is _Tensor for t in (cu_seqlens_q, cu_seqlens_k, sinks,
                                                      seqused_q, seqused_k, alibi_slopes)) and not (
            sinks is not None and torch.is_grad_enabled() and sinks.requires_grad):
        # As in flash_attn_func: the op's dispatch costs more host time than a
        # small problem's kernel, and nothing here needs it.
        out, lse = _forward_varlen(*args, want_lse=return_lse, alibi_slopes=alibi_slopes)
    else:
        out, lse = _fwd_varlen_op(*args, bool(deterministic), alibi_slopes)
    return (out, lse) if return_lse else out
