"""FP8 (e4m3) attention: quantize bf16 / fp16 inputs with block scales and
incoherent processing (a random Hadamard rotation of q and k), then run the
FP8 forward kernel (FA3 paper, section 3.3).

`fp8_attention` does both from bf16 / fp16 inputs. `quantize_fp8` and
`fp8_forward` are the two steps, for callers that keep the quantized tensors
(a KV cache, say). `flash_attn_fp8` takes e4m3 tensors the way FA3 does,
with optional per-(batch, kv head) descales.

The FP8 kernel reads V transposed (FP8 WGMMA needs K-major operands) with
the keys of every 16 in the order its P registers have (flash3.hpp:
fp8_vt_key_position), so quantize_fp8 writes `vt`, not v. Forward only.

The steps are torch custom ops (`flash3::quantize_fp8`, `flash3::fp8_vt`,
`flash3::fwd_fp8`) with fake registrations, so torch.compile traces all of
this module with fullgraph=True and CUDA graphs capture it.
"""

import ctypes
from typing import NamedTuple, Optional

import torch

from . import _lib
from .ops import _abi_scale, _abi_window, _check_sinks, _sinks_as_fp32, _raw_stream

SCALE_BLOCK = 128  # kFp8ScaleBlock: rows per block scale
_E4M3 = torch.float8_e4m3fn
_INPUT_DTYPES = {torch.bfloat16: _lib.DType.BFLOAT16, torch.float16: _lib.DType.FLOAT16}
_SCALING = {"block": 0, "tensor": 1}
# One fixed rotation per (head_dim, device): results are reproducible, and
# any fixed choice of signs is as good as another for spreading outliers.
_SIGN_SEED = 20240711
_signs = {}


class Fp8Inputs(NamedTuple):
    """What the FP8 forward reads: e4m3 q (b, sq, hq, d) and k (b, sk, hkv,
    d); vt, e4m3 V^T (b, hkv, d, keys padded to whole scale blocks); and the
    fp32 dequantization scales (b, heads, blocks)."""

    q: torch.Tensor
    k: torch.Tensor
    vt: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor


def _invalid(message):
    return _lib.Flash3InvalidArgument(_lib.Status.INVALID_ARGUMENT, message)


def _blocks(rows):
    return (rows + SCALE_BLOCK - 1) // SCALE_BLOCK


def hadamard_signs(head_dim, device):
    """The fixed +-1 diagonal of the rotation diag(signs) H / sqrt(head_dim)."""
    key = (head_dim, torch.device(device))
    signs = _signs.get(key)
    if signs is None:
        generator = torch.Generator().manual_seed(_SIGN_SEED + head_dim)
        bits = torch.randint(0, 2, (head_dim,), generator=generator)
        signs = _signs[key] = (bits * 2 - 1).to(torch.float32).to(device)
    return signs


def _tensor(t):
    return _lib.Tensor(t.data_ptr(), (t.stride(0), t.stride(1), t.stride(2), t.stride(3)))


def _vt_tensor(vt):
    # flash3.hpp: V^T's stride[1] is the head-dim row, stride[2] the head.
    return _lib.Tensor(vt.data_ptr(), (vt.stride(0), vt.stride(2), vt.stride(1), 1))


def _check_4d(name, t, need_cuda):
    """need_cuda is False in the fakes (meta / fake tensors while tracing)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise _invalid(f"{name}: must be a 4-d tensor (batch, seqlen, heads, headdim); got {shape}")
    if need_cuda and t.device.type != "cuda":
        raise _invalid(f"{name}: must be a CUDA tensor; got device {t.device}")


def _check_qkv(q, k, v, dtypes, need_cuda):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_4d(name, t, need_cuda)
        if t.dtype not in dtypes:
            raise _invalid(f"{name}: dtype must be one of {sorted(map(str, dtypes))}; got {t.dtype}")
        if t.dtype != q.dtype:
            raise _invalid(f"{name}: dtype must equal q's ({q.dtype}); got {t.dtype}")
        if t.device != q.device:
            raise _invalid(f"{name}: must be on q's device ({q.device}); got {t.device}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise _invalid(f"k: batch and head_dim must equal q's {(q.shape[0], q.shape[3])}; "
                       f"got {(k.shape[0], k.shape[3])}")
    if v.shape != k.shape:
        raise _invalid(f"v: shape must equal k's {tuple(k.shape)}; got {tuple(v.shape)}")


def _run_quantize(q, k, v, dtype, scaling, signs, outputs):
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    params = _lib.QuantizeFp8Params(
        q=_tensor(q), k=_tensor(k), v=_tensor(v), dtype=dtype, scaling=scaling,
        q_out=_tensor(outputs.q), k_out=_tensor(outputs.k), vt_out=_vt_tensor(outputs.vt),
        q_scale=outputs.q_scale.data_ptr(), k_scale=outputs.k_scale.data_ptr(),
        v_scale=outputs.v_scale.data_ptr(), batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim,
        hadamard_signs=0 if signs is None else signs.data_ptr())
    with torch.cuda.device(q.device):
        _lib.quantize_fp8(params, _raw_stream(q.get_device()))


def _empty_vt(v):
    batch, seqlen_k, heads_kv, head_dim = v.shape
    return v.new_zeros((batch, heads_kv, head_dim, _blocks(seqlen_k) * SCALE_BLOCK), dtype=_E4M3)


def _empty_outputs(q, k, v):
    """Fp8Inputs to be written by the quantize kernel for these q, k, v."""
    batch, seqlen_q, heads_q, _ = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    f32, device = torch.float32, q.device
    return Fp8Inputs(
        q=torch.empty(q.shape, dtype=_E4M3, device=device),
        k=torch.empty(k.shape, dtype=_E4M3, device=device),
        vt=_empty_vt(v),
        q_scale=torch.empty((batch, heads_q, _blocks(seqlen_q)), dtype=f32, device=device),
        k_scale=torch.empty((batch, heads_kv, _blocks(seqlen_k)), dtype=f32, device=device),
        v_scale=torch.empty((batch, heads_kv, _blocks(seqlen_k)), dtype=f32, device=device))


def _check_quantize(q, k, v, scaling, need_cuda):
    _check_qkv(q, k, v, _INPUT_DTYPES, need_cuda)
    if scaling not in _SCALING:
        raise _invalid(f"scaling: expected 'block' or 'tensor'; got {scaling!r}")


_Tensors6 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                  torch.Tensor]


@torch.library.custom_op("flash3::quantize_fp8", mutates_args=())
def _quantize_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: str,
                 hadamard: bool) -> _Tensors6:
    """quantize_fp8 as an op: the six fields of Fp8Inputs."""
    _check_quantize(q, k, v, scaling, need_cuda=True)
    outputs = _empty_outputs(q, k, v)
    signs = hadamard_signs(q.shape[3], q.device) if hadamard else None
    _run_quantize(q, k, v, _INPUT_DTYPES[q.dtype], _SCALING[scaling], signs, outputs)
    return tuple(outputs)


@_quantize_op.register_fake
def _quantize_fake(q, k, v, scaling, hadamard):
    _check_quantize(q, k, v, scaling, need_cuda=False)
    return tuple(_empty_outputs(q, k, v))


def quantize_fp8(q, k, v, scaling="block", hadamard=True):
    """bf16 / fp16 q, k, v -> Fp8Inputs. scaling: "block" (one scale per
    128 rows of one head) or "tensor" (one per tensor). hadamard: rotate q
    and k by diag(signs) H / sqrt(head_dim) first, which leaves q k^T
    unchanged and spreads outliers over all dims."""
    return Fp8Inputs(*_quantize_op(q, k, v, scaling, bool(hadamard)))


def _check_e4m3_v(v, need_cuda):
    _check_4d("v", v, need_cuda)
    if v.dtype != _E4M3:
        raise _invalid(f"v: dtype must be torch.float8_e4m3fn; got {v.dtype}")


@torch.library.custom_op("flash3::fp8_vt", mutates_args=())
def _vt_op(v: torch.Tensor) -> torch.Tensor:
    """e4m3 v (b, sk, hkv, d) -> the kernel's V^T (quantize_fp8's vt, unscaled)."""
    _check_e4m3_v(v, need_cuda=True)
    vt = _empty_vt(v)
    # The kernel only transposes an e4m3 v: q, k and the scales are not read.
    placeholder = torch.empty((1,), dtype=torch.float32, device=v.device)
    _run_quantize(v, v, v, _lib.DType.FLOAT8_E4M3, 0, None,
                  Fp8Inputs(v, v, vt, placeholder, placeholder, placeholder))
    return vt


@_vt_op.register_fake
def _vt_fake(v):
    _check_e4m3_v(v, need_cuda=False)
    return _empty_vt(v)


def _scale_view(name, scale, batch, heads, blocks, need_cuda):
    """A (..., ..., ...) fp32 scale tensor broadcast to (batch, heads, blocks)."""
    if (scale.dtype != torch.float32 or (need_cuda and scale.device.type != "cuda")
            or scale.dim() != 3):
        raise _invalid(f"{name}: expected a 3-d float32 CUDA tensor; got {scale.dtype} "
                       f"{tuple(scale.shape)} on {scale.device}")
    try:
        return scale.expand(batch, heads, blocks)
    except RuntimeError:
        raise _invalid(f"{name}: shape {tuple(scale.shape)} does not broadcast to "
                       f"(batch, heads, blocks) = {(batch, heads, blocks)}") from None


def _check_fwd_fp8(q, k, vt, q_scale, k_scale, v_scale, sinks, need_cuda):
    """What the C ABI cannot see; returns the scales as (batch, heads, blocks) views."""
    for name, t in (("q", q), ("k", k)):
        _check_4d(name, t, need_cuda)
        if t.dtype != _E4M3:
            raise _invalid(f"{name}: dtype must be torch.float8_e4m3fn; got {t.dtype}")
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    expected_vt = (batch, heads_kv, head_dim, _blocks(seqlen_k) * SCALE_BLOCK)
    if vt.dtype != _E4M3 or tuple(vt.shape) != expected_vt or vt.stride(3) != 1:
        raise _invalid(f"vt: expected float8_e4m3fn V^T of shape {expected_vt} with contiguous "
                       f"keys (quantize_fp8's vt); got {vt.dtype} {tuple(vt.shape)}")
    _check_sinks(sinks, q)
    return [_scale_view(name, scale, batch, heads, _blocks(rows), need_cuda)
            for name, scale, heads, rows in (("q_scale", q_scale, heads_q, seqlen_q),
                                             ("k_scale", k_scale, heads_kv, seqlen_k),
                                             ("v_scale", v_scale, heads_kv, seqlen_k))]


def _empty_fwd_outputs(q, want_lse):
    batch, seqlen_q, heads_q, _ = q.shape
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse_shape = (batch, heads_q, seqlen_q) if want_lse else (0,)
    return out, torch.empty(lse_shape, dtype=torch.float32, device=q.device)


def _scale_field(view):
    return view.data_ptr(), view.stride()


@torch.library.custom_op("flash3::fwd_fp8", mutates_args=())
def _fwd_fp8_op(q: torch.Tensor, k: torch.Tensor, vt: torch.Tensor, q_scale: torch.Tensor,
                k_scale: torch.Tensor, v_scale: torch.Tensor, softmax_scale: Optional[float],
                causal: bool, window_left: int, window_right: int,
                sinks: Optional[torch.Tensor], want_lse: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 forward: (out bf16, lse fp32 (b, hq, sq), or (0,) unless want_lse)."""
    scales = _check_fwd_fp8(q, k, vt, q_scale, k_scale, v_scale, sinks, need_cuda=True)
    out, lse = _empty_fwd_outputs(q, want_lse)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    params = _lib.FwdParams(
        q=_tensor(q), k=_tensor(k), v=_vt_tensor(vt), out=_tensor(out),
        lse=ctypes.cast(lse.data_ptr(), ctypes.POINTER(ctypes.c_float)) if want_lse else None,
        dtype=_lib.DType.FLOAT8_E4M3,
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads_q=heads_q,
        num_heads_kv=heads_kv, head_dim=head_dim, softmax_scale=_abi_scale(softmax_scale),
        causal=1 if causal else 0, window_left=window_left, window_right=window_right,
        sinks=0 if sinks is None else sinks.data_ptr(),
        q_scale=_lib.Fp8Scale(*_scale_field(scales[0])),
        k_scale=_lib.Fp8Scale(*_scale_field(scales[1])),
        v_scale=_lib.Fp8Scale(*_scale_field(scales[2])))
    with torch.cuda.device(q.device):
        _lib.fwd(params, _raw_stream(q.get_device()))
    return out, lse


@_fwd_fp8_op.register_fake
def _fwd_fp8_fake(q, k, vt, q_scale, k_scale, v_scale, softmax_scale, causal, window_left,
                  window_right, sinks, want_lse):
    _check_fwd_fp8(q, k, vt, q_scale, k_scale, v_scale, sinks, need_cuda=False)
    _abi_scale(softmax_scale)
    return _empty_fwd_outputs(q, want_lse)


def fp8_forward(inputs, softmax_scale=None, causal=False, window_size=(-1, -1), sinks=None,
                return_lse=False):
    """The FP8 forward on quantize_fp8's output. Returns out (b, sq, hq, d)
    bf16, or (out, lse) with lse (b, hq, sq) fp32. Same masks, GQA and sinks
    as flash_attn_func; no softcap."""
    window_left, window_right = _abi_window(window_size)
    out, lse = _fwd_fp8_op(inputs.q, inputs.k, inputs.vt, inputs.q_scale, inputs.k_scale,
                           inputs.v_scale, softmax_scale, bool(causal), window_left,
                           window_right, _sinks_as_fp32(sinks), bool(return_lse))
    return (out, lse) if return_lse else out


def fp8_attention(q, k, v, causal=False, quant="block", hadamard=True, softmax_scale=None,
                  window_size=(-1, -1), sinks=None, return_lse=False):
    """Attention from bf16 / fp16 q, k, v computed in FP8: quantize_fp8(q, k,
    v, scaling=quant, hadamard=hadamard), then the FP8 forward. The output
    comes back in q's dtype."""
    inputs = quantize_fp8(q, k, v, scaling=quant, hadamard=hadamard)
    result = fp8_forward(inputs, softmax_scale=softmax_scale, causal=causal,
                         window_size=window_size, sinks=sinks, return_lse=return_lse)
    out = result[0] if return_lse else result
    if out.dtype != q.dtype:
        out = out.to(q.dtype)
    return (out, result[1]) if return_lse else out


def _fa3_descale(name, descale, batch, heads_kv, group, device):
    """FA3's descale, (batch, heads_kv) fp32 or None (= 1), as a scale tensor;
    q's is indexed by query head, so it is repeated over each group."""
    if descale is None:
        return torch.ones((1, 1, 1), dtype=torch.float32, device=device)
    if descale.shape != (batch, heads_kv):
        raise _invalid(f"{name}: expected shape (batch, num_heads_k) = {(batch, heads_kv)}; "
                       f"got {tuple(descale.shape)}")
    descale = descale.to(torch.float32)
    if group > 1:
        descale = descale.repeat_interleave(group, dim=1)
    return descale.unsqueeze(-1)


def flash_attn_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                   causal=False, window_size=(-1, -1), sinks=None, return_lse=False):
    """FA3's FP8 call: e4m3 q, k, v in the usual layout with optional
    (batch, num_heads_k) fp32 descales. v is transposed into the kernel's
    V^T first (one memory-bound pass over v). Returns bf16 out (and lse)."""
    _check_qkv(q, k, v, {_E4M3}, need_cuda=False)  # the ops check the device
    batch, _, heads_q, _ = q.shape
    heads_kv = k.shape[2]
    if heads_q % heads_kv != 0:
        raise _invalid(f"num_heads_q ({heads_q}) must be divisible by num_heads_kv ({heads_kv})")
    group = heads_q // heads_kv
    inputs = Fp8Inputs(q, k, _vt_op(v),
                       _fa3_descale("q_descale", q_descale, batch, heads_kv, group, q.device),
                       _fa3_descale("k_descale", k_descale, batch, heads_kv, 1, q.device),
                       _fa3_descale("v_descale", v_descale, batch, heads_kv, 1, q.device))
    return fp8_forward(inputs, softmax_scale=softmax_scale, causal=causal,
                       window_size=window_size, sinks=sinks, return_lse=return_lse)
