"""PyTorch entry points: the `flash3::fwd` and `flash3::bwd` custom ops
(autograd registered on fwd) and flash_attn_func.

Division of labour (DESIGN.md section 1): the C library validates everything
it can see (head dim, head divisibility, strides, alignment, GPU). This
module checks only what the C ABI cannot see or express: that tensors are
CUDA tensors on one device, that the dtype is one the ABI has, that q, k and
v agree on dtype, and that their shapes agree where the ABI carries a single
value (batch, head_dim, k vs v).

Host overhead matters (the goal is < 20 us per call from Python), so the
eager path avoids torch's dispatcher when nothing needs it; see
_can_skip_dispatcher.
"""

from typing import Optional

import torch

from . import _lib

_ABI_DTYPE = {
    torch.float16: _lib.DType.FLOAT16,
    torch.bfloat16: _lib.DType.BFLOAT16,
}
_FLOAT32 = torch.float32
_CONTIGUOUS = torch.contiguous_format


def _invalid(message):
    return _lib.Flash3InvalidArgument(_lib.Status.INVALID_ARGUMENT, message)


def _inputs_ok(q, k, v):
    """True when _check_inputs(need_cuda=True) would pass; one cheap expression
    for the hot path (a few us less than the checks that build messages)."""
    qs, ks = q.shape, k.shape
    device = q.get_device()
    return (
        q.is_cuda and k.is_cuda and v.is_cuda
        and k.get_device() == device and v.get_device() == device
        and q.dtype in _ABI_DTYPE and k.dtype == q.dtype and v.dtype == q.dtype
        and len(qs) == 4 and len(ks) == 4 and v.shape[:3] == ks[:3]
        and ks[0] == qs[0] and ks[3] == qs[3]
    )


def _check_inputs(q, k, v, need_cuda):
    """Torch-side checks with messages; `need_cuda` is False for fake/meta tracing."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise _invalid(
                f"{name}: must be 4-d (batch, seqlen, heads, headdim); "
                f"got shape {tuple(t.shape)}"
            )
    if need_cuda and q.device.type != "cuda":
        raise _invalid(f"q: must be a CUDA tensor; got device {q.device}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
    if q.dtype not in _ABI_DTYPE:
        raise _invalid(f"q: dtype must be torch.float16 or torch.bfloat16; got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
    # The ABI has one batch, q's and k's head_dim, v's head_dim_v (the library
    # says which pairs it takes), and one (seqlen_k, heads_kv) for k and v.
    if k.shape[0] != q.shape[0]:
        raise _invalid(f"k: batch must equal q's ({q.shape[0]}); got {k.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise _invalid(f"k: head_dim must equal q's ({q.shape[3]}); got {k.shape[3]}")
    _check_v_shape(k, v)


def _check_v_shape(k, v):
    """v is shaped like k but for its head dim (head_dim_v)."""
    if v.shape[:-1] != k.shape[:-1]:
        raise _invalid(f"v: shape must equal k's {tuple(k.shape)} but for the last (head) dim; "
                       f"got {tuple(v.shape)}")


def _check_sinks(sinks, q):
    """The ABI takes sinks as a bare (heads_q,) fp32 pointer."""
    if sinks is None:
        return
    heads_q = q.shape[-2]  # (batch, seqlen, heads, dim) or packed (total, heads, dim)
    if (sinks.shape != (heads_q,) or sinks.dtype != _FLOAT32
            or (sinks.numel() and sinks.stride() != (1,))):
        raise _invalid(
            f"sinks: expected a contiguous float32 tensor of shape ({heads_q},) (one logit per "
            f"query head); got {sinks.dtype} {tuple(sinks.shape)} with strides {sinks.stride()}")
    if sinks.device != q.device:
        raise _invalid(f"sinks: must be on q's device ({q.device}); got {sinks.device}")


def _check_alibi(alibi_slopes, batch, q):
    """FA2's alibi_slopes: (heads_q,) or (batch, heads_q) fp32 on q's device,
    heads contiguous. Returns the ABI's (address, batch stride)."""
    if alibi_slopes is None:
        return _lib.NO_ALIBI
    heads_q = q.shape[-2]
    t = alibi_slopes
    if (not isinstance(t, torch.Tensor) or t.dtype != _FLOAT32
            or tuple(t.shape) not in ((heads_q,), (batch, heads_q))
            or (t.numel() and t.stride(-1) != 1)):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise _invalid(f"alibi_slopes: expected a float32 tensor ({heads_q},) or ({batch}, "
                       f"{heads_q}) with heads contiguous; got {got}")
    if t.device != q.device:
        raise _invalid(f"alibi_slopes: must be on q's device ({q.device}); got {t.device}")
    return t.data_ptr(), t.stride(0) if t.dim() == 2 else 0


def _sinks_as_fp32(sinks):
    # Sinks are often kept in the model's dtype; the kernels read fp32.
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise _invalid(f"sinks: expected a tensor of shape (heads_q,) or None; got {type(sinks).__name__}")
    return sinks.to(_FLOAT32).contiguous()


def _abi_scale(softmax_scale):
    # The ABI reserves 0 for "default"; an explicit 0 would silently change meaning.
    if softmax_scale is None:
        return 0.0
    if softmax_scale == 0:
        raise _invalid(
            "softmax_scale: must be nonzero (None selects 1/sqrt(head_dim)); got 0.0"
        )
    return float(softmax_scale)


_INT32_MAX = 2**31 - 1


def _abi_window(window_size):
    """(left, right) as the ABI's int32s. The library checks the values
    (>= -1, right <= 0 with causal); here only what the ABI cannot carry. A
    bound past any sequence means the same as int32 max, so it is clamped."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise _invalid(f"window_size: expected a pair (left, right); got {window_size!r}") from None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right)):
        raise _invalid(f"window_size: expected two ints (-1: unbounded); got {window_size!r}")
    return min(left, _INT32_MAX), min(right, _INT32_MAX)


def _public_or_private(private_name, public):
    # torch.cuda.current_stream() builds a Stream object per call and
    # current_device() goes through Python wrappers (microseconds each); the
    # raw torch._C getters return plain ints. Fall back if they ever move.
    return getattr(torch._C, private_name, None) or public


_raw_stream = _public_or_private(
    "_cuda_getCurrentRawStream", lambda index: torch.cuda.current_stream(index).cuda_stream)
_current_device = _public_or_private("_cuda_getDevice", lambda: torch.cuda.current_device())
_launcher = None


_NO_VARLEN = (0, 0, 0, 0, 0, 0)


def _address(t):
    return 0 if t is None else t.data_ptr()


def _fwd_fields(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
               sinks, varlen, seqlen_k=None, seqused_k=None, packed_q=None):
    """FwdLauncher's fields (see _launch). Without varlen: seqlen_k overrides
    k's (a paged cache's capacity per batch entry), seqused_k gives the
    keys used per batch entry, and packed_q = (cu_seqlens_q, max_seqlen_q)
    makes it varlen q over a cache: q and out (total_q, heads, dim)."""
    if varlen is None:
        _, k_rows, num_heads_kv, _ = k.shape
        seqlen_k = k_rows if seqlen_k is None else seqlen_k
        used_k = _address(seqused_k)
        if packed_q is None:
            batch, seqlen_q, num_heads_q, head_dim = q.shape
            strides = (q.stride(), k.stride(), v.stride(), out.stride())
            varlen_fields = _NO_VARLEN if seqused_k is None else (0, 0, 0, used_k, 0, 0)
        else:
            cu_seqlens_q, seqlen_q = packed_q
            batch = cu_seqlens_q.shape[0] - 1
            total_q, num_heads_q, head_dim = q.shape
            strides = ((0, *q.stride()), k.stride(), v.stride(), (0, *out.stride()))
            varlen_fields = (cu_seqlens_q.data_ptr(), 0, 0, used_k, total_q, 0)
    else:
        cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, seqlen_q, seqlen_k = varlen
        batch = cu_seqlens_q.shape[0] - 1
        total_q, num_heads_q, head_dim = q.shape
        total_k, num_heads_kv, _ = k.shape
        # One packed batch entry: the batch stride is never used.
        strides = tuple((0, *t.stride()) for t in (q, k, v, out))
        varlen_fields = (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), _address(seqused_q),
                         _address(seqused_k), total_q, total_k)
    # Field order of flash3_fwd_params after struct_size.
    return (
        q.data_ptr(), *strides[0],
        k.data_ptr(), *strides[1],
        v.data_ptr(), *strides[2],
        out.data_ptr(), *strides[3],
        _address(lse),
        _ABI_DTYPE[q.dtype], batch, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim,
        _abi_scale(softmax_scale), 1 if causal else 0,
        window_left, window_right, float(softcap),
        _address(sinks),
        *varlen_fields,
    )


def _on_device(device, launch):
    """Runs launch(stream) with q's device current (the library launches on
    the current device; the stream must belong to it)."""
    if device == _current_device():
        return launch(_raw_stream(device))
    with torch.cuda.device(device):
        return launch(_raw_stream(device))


def _launch(q, k, v, out, lse, softmax_scale, causal, window_left=-1, window_right=-1,
            softcap=0.0, sinks=None, varlen=None, alibi=_lib.NO_ALIBI):
    """flash3_fwd into caller-provided out/lse (lse may be None), on the
    current stream of q's device. The op below uses it; tests call it
    directly with NaN-poisoned buffers. varlen: None, or (cu_seqlens_q,
    cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k) with q,
    k, v, out packed (total, heads, head_dim) (varlen.py checks them).
    alibi: _check_alibi's (address, batch stride)."""
    global _launcher
    if _launcher is None:
        _launcher = _lib.FwdLauncher()
    fields = _fwd_fields(q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
                         softcap, sinks, varlen)
    head_dim_v = v.shape[-1]
    _on_device(q.get_device(), lambda stream: _launcher(stream, fields, (), alibi, head_dim_v))


def _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, sinks=None,
             want_lse=True, alibi_slopes=None):
    """The eager implementation: check, allocate out (and lse unless
    want_lse is false: then lse is None and the kernel skips it), launch."""
    if not _inputs_ok(q, k, v):
        _check_inputs(q, k, v, need_cuda=True)  # raises with the precise message
    _check_sinks(sinks, q)
    alibi = _check_alibi(alibi_slopes, q.shape[0], q)
    # empty_like and new_empty parse fewer arguments than torch.empty (~3 us less).
    out = _empty_out(q, v)
    lse = None
    if want_lse:
        batch, seqlen_q, num_heads_q, _ = q.shape
        lse = q.new_empty((batch, num_heads_q, seqlen_q), dtype=_FLOAT32)
    _launch(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, sinks,
            alibi=alibi)
    return out, lse


@torch.library.custom_op("flash3::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward. q (b, sq, hq, d); k, v (b, sk, hkv, d); sinks
    (hq,) fp32 or None; alibi_slopes (hq,) or (b, hq) fp32 or None. Returns
    out (b, sq, hq, d) contiguous in q's dtype and lse (b, hq, sq) fp32.
    `deterministic` only affects the backward (bitwise-reproducible dq)."""
    return _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap, sinks,
                    alibi_slopes=alibi_slopes)


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, deterministic=False, window_left=-1,
              window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None):
    _check_inputs(q, k, v, need_cuda=False)
    _check_sinks(sinks, q)
    _check_alibi(alibi_slopes, q.shape[0], q)
    _abi_scale(softmax_scale)
    batch, seqlen_q, num_heads_q, _ = q.shape
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty((batch, num_heads_q, seqlen_q), dtype=_FLOAT32)
    return out, lse


def _dense(t):
    # Gradients from autograd may be expanded (stride 0) or transposed; the
    # kernels need the last dim contiguous and 16-byte aligned rows.
    return t if t.is_contiguous() else t.contiguous()


def _check_bwd_inputs(dout, q, v, out, lse, varlen=False):
    """What the C ABI cannot see of the backward's extra tensors: their shapes
    and dtypes (it has one set of sizes, and lse is a bare pointer)."""
    out_shape = (*q.shape[:-1], v.shape[-1])
    for name, t in (("out", out), ("dout", dout)):
        if tuple(t.shape) != out_shape:
            raise _invalid(f"{name}: shape must be q's with v's head dim, {out_shape}; "
                           f"got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
    if varlen:
        total_q, num_heads_q, _ = q.shape
        expected = (num_heads_q, total_q)
    else:
        batch, seqlen_q, num_heads_q, _ = q.shape
        expected = (batch, num_heads_q, seqlen_q)
    if tuple(lse.shape) != expected or lse.dtype != _FLOAT32 or not lse.is_contiguous():
        raise _invalid(
            f"lse: expected the forward's LSE, a contiguous float32 tensor of shape {expected}; "
            f"got {lse.dtype} {tuple(lse.shape)}{'' if lse.is_contiguous() else ' non-contiguous'}")
    if lse.device != q.device:
        raise _invalid(f"lse: must be on q's device ({q.device}); got {lse.device}")


def _empty_out(q, v):
    """out: q's shape with v's head dim, contiguous."""
    if v.shape[-1] == q.shape[-1]:
        return torch.empty_like(q, memory_format=_CONTIGUOUS)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def _empty_dsinks(q, sinks):
    # (hq,) fp32 with sinks, else an empty placeholder (an op returns a fixed number of tensors).
    return q.new_empty((0,) if sinks is None else sinks.shape, dtype=_FLOAT32)


def _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, dsinks, softmax_scale, causal,
                deterministic, window_left, window_right, softcap, sinks, varlen=None,
                alibi=_lib.NO_ALIBI):
    """flash3_bwd into caller-provided gradients (dsinks: with sinks) and a
    fresh workspace, on the current stream of q's device. varlen as in
    _launch (varlen.py checks it)."""
    if varlen is None:
        batch, seqlen_q, num_heads_q, head_dim = q.shape
        _, seqlen_k, num_heads_kv, _ = k.shape
        varlen_fields = {}
    else:
        cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, seqlen_q, seqlen_k = varlen
        batch = cu_seqlens_q.shape[0] - 1
        total_q, num_heads_q, head_dim = q.shape
        total_k, num_heads_kv, _ = k.shape
        varlen_fields = dict(cu_seqlens_q=cu_seqlens_q.data_ptr(),
                             cu_seqlens_k=cu_seqlens_k.data_ptr(),
                             seqused_q=_address(seqused_q), seqused_k=_address(seqused_k),
                             total_q=total_q, total_k=total_k)
    params = _lib.BwdParams(
        dtype=_ABI_DTYPE[q.dtype], batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        num_heads_q=num_heads_q, num_heads_kv=num_heads_kv, head_dim=head_dim,
        head_dim_v=v.shape[-1],
        softmax_scale=_abi_scale(softmax_scale), causal=1 if causal else 0,
        deterministic=1 if deterministic else 0, lse=lse.data_ptr(),
        window_left=window_left, window_right=window_right, softcap=float(softcap),
        sinks=None if sinks is None else sinks.data_ptr(),
        dsinks=None if sinks is None else dsinks.data_ptr(), alibi_slopes=alibi[0] or None,
        alibi_slopes_batch_stride=alibi[1], **varlen_fields)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout),
                    ("dq", dq), ("dk", dk), ("dv", dv)):
        field = getattr(params, name)
        field.data = t.data_ptr()
        # Varlen: one packed batch entry, whose batch stride is never used.
        field.stride[:] = t.stride() if varlen is None else (0, *t.stride())
    workspace = q.new_empty((_lib.bwd_workspace_size(params),), dtype=torch.uint8)
    params.workspace = workspace.data_ptr()
    params.workspace_bytes = workspace.numel()
    device = q.get_device()
    with torch.cuda.device(device):
        _lib.bwd(params, _raw_stream(device))


def _backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, window_left,
              window_right, softcap, sinks, alibi_slopes=None):
    """The eager implementation of flash3::bwd: allocate dq, dk, dv (and
    dsinks with sinks), launch. (dq, dk, dv need nothing of the sinks: the
    forward's lse holds them.)"""
    _check_inputs(q, k, v, need_cuda=True)
    _check_bwd_inputs(dout, q, v, out, lse)
    _check_sinks(sinks, q)
    alibi = _check_alibi(alibi_slopes, q.shape[0], q)
    dq = torch.empty_like(q, memory_format=_CONTIGUOUS)
    dk = torch.empty_like(k, memory_format=_CONTIGUOUS)
    dv = torch.empty_like(v, memory_format=_CONTIGUOUS)
    dsinks = _empty_dsinks(q, sinks)
    _launch_bwd(_dense(dout), q, k, v, out, lse, dq, dk, dv, dsinks, softmax_scale, causal,
                deterministic, window_left, window_right, softcap, sinks, alibi=alibi)
    return dq, dk, dv, dsinks


@torch.library.custom_op("flash3::bwd", mutates_args=())
def bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward: (dq, dk, dv, dsinks) for the forward that gave
    out, lse. With GQA, dk and dv are summed over the query heads of each KV
    head. dsinks: (hq,) fp32 with sinks, else an empty tensor."""
    return _backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, window_left,
                     window_right, softcap, sinks, alibi_slopes)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, window_left=-1,
              window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None):
    _check_inputs(q, k, v, need_cuda=False)
    _check_bwd_inputs(dout, q, v, out, lse)
    _check_sinks(sinks, q)
    _check_alibi(alibi_slopes, q.shape[0], q)
    return (torch.empty_like(q, memory_format=_CONTIGUOUS),
            torch.empty_like(k, memory_format=_CONTIGUOUS),
            torch.empty_like(v, memory_format=_CONTIGUOUS),
            _empty_dsinks(q, sinks))


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, sinks,
     alibi_slopes) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, alibi_slopes)
    # dq, dk, dv need nothing of the sinks (lse holds them): frozen sinks skip
    # dsinks' cost in the backward (docs/performance.md: 4-8 %).
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic
    ctx.mask = (window_left, window_right, softcap)
    # The LSE is an output for inspection (and ring attention's merge), not
    # something gradients flow through.
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks, alibi_slopes = ctx.saved_tensors
    sinks = sinks if ctx.sinks_need_grad else None
    dq, dk, dv, dsinks = torch.ops.flash3.bwd.default(
        dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.deterministic, *ctx.mask,
        sinks, alibi_slopes)
    # (No gradient for the ALiBi slopes, as in FA2.)
    return dq, dk, dv, None, None, None, None, None, None, None if sinks is None else dsinks, None


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# The OpOverload skips CustomOpDef.__call__'s extra Python layer.
_fwd_op = torch.ops.flash3.fwd.default


def _dispatcher_probes():
    names = ("_len_torch_dispatch_stack", "_are_functorch_transforms_active",
             "_is_torch_function_mode_enabled")
    probes = tuple(getattr(torch._C, name, None) for name in names)
    probes += (getattr(torch.autograd, "_profiler_enabled", None),
               getattr(torch._C, "_get_tracing_state", None))
    return probes if all(probes) else None


_probes = _dispatcher_probes()
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor


def _can_skip_dispatcher(q, k, v):
    """Whether calling _forward directly is what the dispatcher would do.

    Going through the custom op costs ~15-20 us of host time per call
    (measured on the H200 machine). The op is still used whenever anything
    could intercept it: torch.compile/dynamo tracing, tensor subclasses
    (FakeTensor, DTensor), TorchDispatchMode/TorchFunctionMode, functorch
    transforms (vmap, grad), non-CUDA tensors (meta goes to the fake),
    inputs that require grad (the op carries the autograd registration),
    torch.jit tracing, and a running torch.profiler (so traces show
    flash3::fwd by name).
    If torch moves the private probes, every call takes the op path.
    """
    if _probes is None or _is_compiling():
        return False
    dispatch_stack_len, functorch_active, function_mode, profiling, jit_tracing = _probes
    return (
        type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
        and q.is_cuda
        and not dispatch_stack_len() and not functorch_active() and not function_mode()
        and not profiling() and jit_tracing() is None
        and not (torch.is_grad_enabled()
                 and (q.requires_grad or k.requires_grad or v.requires_grad))
    )


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, return_lse=False,
                    deterministic=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                    alibi_slopes=None):
    """Exact attention softmax(q k^T * scale) v.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv,
    head_dim), float16 or bfloat16 CUDA tensors, last dim contiguous, other
    strides arbitrary; heads_q % heads_kv == 0 (GQA/MQA: query head i uses
    key/value head i // (heads_q // heads_kv)). v may have its own head dim
    where the library has the pair (192 for q and k, 128 for v); out has v's.
    softmax_scale: None for 1/sqrt(head_dim).
    causal: mask aligned to the bottom-right corner (query i sees key j iff
    j <= i + seqlen_k - seqlen_q); rows that see no key give 0 and lse -inf.
    window_size: (left, right) sliding window, aligned like causal: query i
    sees keys i + d - left .. i + d + right, d = seqlen_k - seqlen_q; -1 is
    unbounded; with causal, right must be -1 or 0. Key blocks outside every
    window are skipped, not masked.
    softcap: > 0 replaces the scores s = scale * q.k by softcap * tanh(s /
    softcap) (Gemma 2, Grok), with its gradient.
    sinks: optional attention sinks (gpt-oss), a (heads_q,) tensor of logits
    (any float dtype; computed in fp32), one per query head, that join every
    row's softmax denominator: out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij)
    + exp(sinks[h])). lse includes them; differentiable (the gradient comes
    back in the sinks' dtype).
    alibi_slopes: optional ALiBi (FA2's argument), fp32 (heads_q,) or (batch,
    heads_q): query i's logit for key j gains -slope * |i + seqlen_k -
    seqlen_q - j|; not with softcap; no gradient for the slopes.
    Returns out (contiguous, q's dtype), or (out, lse) with lse (batch,
    heads_q, seqlen_q) fp32 natural log when return_lse is true.
    Differentiable in q, k, v and sinks (lse is not); deterministic=True
    makes the backward bitwise reproducible (dq accumulates in a fixed
    order; the sinks' gradient always is).
    """
    window_left, window_right = (-1, -1) if window_size == (-1, -1) else _abi_window(window_size)
    softcap = float(softcap)
    sinks = _sinks_as_fp32(sinks)
    plain_alibi = alibi_slopes is None or type(alibi_slopes) is _Tensor
    if _can_skip_dispatcher(q, k, v) and plain_alibi and (sinks is None or (
            type(sinks) is _Tensor and not (torch.is_grad_enabled() and sinks.requires_grad))):
        # No autograd here (_can_skip_dispatcher), so the LSE is needed only if returned.
        out, lse = _forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                            sinks, want_lse=return_lse, alibi_slopes=alibi_slopes)
    else:
        out, lse = _fwd_op(q, k, v, softmax_scale, bool(causal), bool(deterministic), window_left,
                           window_right, softcap, sinks, alibi_slopes)
    return (out, lse) if return_lse else out
