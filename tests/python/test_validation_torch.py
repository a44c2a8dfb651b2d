"""Torch-side checks and the fake (meta) registration; no GPU needed.

The Python layer only checks what the C ABI cannot see (device, dtype, shape
agreement between tensors); everything else is the library's (test_c_abi.py).
"""

import re

import pytest

torch = pytest.importorskip("torch")

import flash3  # noqa: E402
from flash3 import ops  # noqa: E402
from flash3.reference import attention_ref, causal_mask, visible_mask  # noqa: E402


def qkv(batch=2, seqlen_q=5, seqlen_k=7, heads_q=4, heads_kv=2, head_dim=64,
        dtype=torch.bfloat16, device="cpu"):
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    return q, k, v


def test_import_flash3_does_not_need_torch_attributes():
    assert isinstance(flash3.__version__, str)
    assert flash3.flash_attn_func is ops.flash_attn_func


def test_cpu_tensor_is_rejected():
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"q: must be a CUDA tensor; got device cpu"):
        flash3.flash_attn_func(*qkv())


def test_float32_is_rejected_with_a_clear_message():
    q, k, v = qkv(dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match=r"q: dtype must be torch.float16 or torch.bfloat16; "
                                         r"got torch.float32"):
        flash3.flash_attn_func(q, k, v)


@pytest.mark.parametrize("name", ["k", "v"])
def test_dtype_mismatch_is_rejected(name):
    tensors = dict(zip("qkv", qkv(device="meta")))
    tensors[name] = tensors[name].half()
    with pytest.raises(flash3.Flash3Error, match=rf"{name}: dtype must equal q's \(torch.bfloat16\); "
                                                 r"got torch.float16"):
        flash3.flash_attn_func(**tensors)


def test_shape_disagreements_are_rejected():
    q, k, v = qkv(device="meta")
    with pytest.raises(flash3.Flash3Error, match=r"k: batch must equal q's \(2\); got 3"):
        flash3.flash_attn_func(q, torch.cat([k, k[:1]]), torch.cat([v, v[:1]]))
    with pytest.raises(flash3.Flash3Error, match=r"k: head_dim must equal q's \(64\); got 32"):
        flash3.flash_attn_func(q, k[..., :32], v[..., :32])
    with pytest.raises(flash3.Flash3Error,
                       match=r"v: shape must equal k's \(2, 7, 2, 64\) but for the last \(head\) dim; "
                             r"got \(2, 6, 2, 64\)"):
        flash3.flash_attn_func(q, k, v[:, :6])
    # v's own head dim passes the torch-side checks (the fake gives out that
    # head dim); which pairs exist is the library's to say.
    out, lse = torch.ops.flash3.fwd(q, k, v[..., :32], None, False)
    assert out.shape == (2, 5, 4, 32) and lse.shape == (2, 4, 5)
    dq, dk, dv, _ = torch.ops.flash3.bwd(out, q, k, v[..., :32], out, lse, None, False, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, (2, 7, 2, 32))
    with pytest.raises(flash3.Flash3Error, match=r"dout: shape must be q's with v's head dim, "
                                                 r"\(2, 5, 4, 32\); got \(2, 5, 4, 64\)"):
        torch.ops.flash3.bwd(q, q, k, v[..., :32], out, lse, None, False, False)
    with pytest.raises(flash3.Flash3Error, match=r"q: must be 4-d"):
        flash3.flash_attn_func(q[0], k, v)


def test_explicit_zero_scale_is_rejected():
    with pytest.raises(flash3.Flash3Error, match=r"softmax_scale: must be nonzero"):
        flash3.flash_attn_func(*qkv(device="meta"), softmax_scale=0.0)


def test_alibi_slopes_are_checked():
    q, k, v = qkv(device="meta")
    for slopes in (torch.empty(4, device="meta"), torch.empty(2, 4, device="meta")):
        assert flash3.flash_attn_func(q, k, v, alibi_slopes=slopes).shape == q.shape
    for bad, got in ((torch.empty(3, device="meta"), "torch.float32 (3,)"),
                     (torch.empty(4, dtype=torch.bfloat16, device="meta"), "torch.bfloat16 (4,)"),
                     (torch.empty(4, 2, device="meta").t(), "torch.float32 (2, 4)")):
        with pytest.raises(flash3.Flash3InvalidArgument,
                           match=re.escape(f"alibi_slopes: expected a float32 tensor (4,) or (2, 4) "
                                           f"with heads contiguous; got {got}")):
            flash3.flash_attn_func(q, k, v, alibi_slopes=bad)
    with pytest.raises(flash3.Flash3InvalidArgument, match="alibi_slopes: must be on q's device"):
        flash3.flash_attn_func(q, k, v, alibi_slopes=torch.empty(4))


def test_meta_tensors_give_shapes():
    q, k, v = qkv(batch=3, seqlen_q=11, seqlen_k=5, heads_q=8, heads_kv=2, head_dim=128,
                  dtype=torch.float16, device="meta")
    out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == torch.float16 and out.is_contiguous()
    assert lse.shape == (3, 8, 11) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert flash3.flash_attn_func(q, k, v).shape == q.shape


def test_fake_tensor_mode_gives_shapes_for_noncontiguous_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        packed = torch.empty(2, 9, 3, 4, 64, dtype=torch.bfloat16)
        q, k, v = packed.unbind(2)
        out, lse = torch.ops.flash3.fwd(q, k, v, None, False)
    assert out.shape == (2, 9, 4, 64) and out.is_contiguous() and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32


def test_op_schema():
    schema = str(torch.ops.flash3.fwd.default._schema)
    assert schema == ("flash3::fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale, "
                      "bool causal, bool deterministic=False, SymInt window_left=-1, "
                      "SymInt window_right=-1, float softcap=0., Tensor? sinks=None, "
                      "Tensor? alibi_slopes=None) -> (Tensor, Tensor)"), schema
    schema = str(torch.ops.flash3.bwd.default._schema)
    assert schema == ("flash3::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
                      "Tensor lse, float? softmax_scale, bool causal, bool deterministic, "
                      "SymInt window_left=-1, SymInt window_right=-1, float softcap=0., "
                      "Tensor? sinks=None, Tensor? alibi_slopes=None) "
                      "-> (Tensor, Tensor, Tensor, Tensor)"), schema


def test_reference_matches_sdpa_math_in_fp64():
    # The reference itself, on CPU: against torch's math SDPA with an explicit
    # bottom-right mask (SDPA's is_causal is top-left aligned when sq != sk).
    for seqlen_q, seqlen_k in [(5, 7), (7, 5), (6, 6)]:
        q, k, v = (x.double() for x in qkv(seqlen_q=seqlen_q, seqlen_k=seqlen_k))
        for causal in (False, True):
            out, lse = attention_ref(q, k, v, causal=causal, compute_dtype=torch.float64)
            mask = causal_mask(seqlen_q, seqlen_k, "cpu") if causal else None
            kk, vv = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
            want = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), kk, vv, attn_mask=mask).transpose(1, 2)
            visible = causal_mask(seqlen_q, seqlen_k, "cpu").any(1) if causal else slice(None)
            torch.testing.assert_close(out[:, visible], want[:, visible], rtol=0, atol=1e-12)
            assert lse.shape == (2, 4, seqlen_q) and lse.dtype == torch.float64


def test_reference_empty_rows_and_lowp_path():
    q, k, v = qkv(seqlen_q=9, seqlen_k=4)
    for upcast in (True, False):
        out, lse = attention_ref(q, k, v, causal=True, upcast=upcast)
        assert out.dtype == (torch.float32 if upcast else torch.bfloat16)
        assert lse.dtype == torch.float32
        assert (out[:, :5] == 0).all() and torch.isneginf(lse[:, :, :5]).all()
        assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 5:]).all()
    out, lse = attention_ref(*qkv(seqlen_k=0))
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_visible_mask_brute_force():
    for seqlen_q, seqlen_k in [(5, 9), (9, 5), (7, 7)]:
        d = seqlen_k - seqlen_q
        for causal in (False, True):
            for left, right in [(-1, -1), (0, 0), (2, -1), (-1, 1), (3, 2), (-1, 0)]:
                got = visible_mask(seqlen_q, seqlen_k, "cpu", causal, (left, right))
                for i in range(seqlen_q):
                    for j in range(seqlen_k):
                        want = ((not causal or j <= i + d) and (left < 0 or j >= i + d - left)
                                and (right < 0 or j <= i + d + right))
                        assert bool(got[i, j]) == want, (seqlen_q, seqlen_k, causal, left, right, i, j)
    assert torch.equal(visible_mask(6, 8, "cpu", True), causal_mask(6, 8, "cpu"))


def test_reference_softcap_and_window():
    q, k, v = (x.double() for x in qkv(seqlen_q=6, seqlen_k=8))
    out, lse = attention_ref(q, k, v, softcap=2.0, window_size=(1, 1),
                             compute_dtype=torch.float64)
    kk, vv = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
    scores = q.transpose(1, 2) @ kk.transpose(-1, -2) / 8.0  # head_dim 64
    scores = 2.0 * torch.tanh(scores / 2.0)
    scores = scores.masked_fill(~visible_mask(6, 8, "cpu", window_size=(1, 1)), float("-inf"))
    want = (torch.softmax(scores, -1) @ vv).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=0, atol=1e-12)


def test_reference_sinks():
    # Written out: out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(sink)).
    q, k, v = (x.double() for x in qkv(seqlen_q=6, seqlen_k=8))
    sinks = torch.tensor([0.5, -1.0, 3.0, -float("inf")], dtype=torch.float64)
    for causal in (False, True):
        out, lse = attention_ref(q, k, v, causal=causal, sinks=sinks, compute_dtype=torch.float64)
        kk, vv = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
        weights = torch.exp(q.transpose(1, 2) @ kk.transpose(-1, -2) / 8.0)
        if causal:
            weights = weights * causal_mask(6, 8, "cpu")
        denominator = weights.sum(-1, keepdim=True) + torch.exp(sinks).view(1, 4, 1, 1)
        torch.testing.assert_close(out, (weights / denominator @ vv).transpose(1, 2),
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(lse, torch.log(denominator.squeeze(-1)), rtol=0, atol=1e-12)
    # A row that sees no key puts all its weight on the sink: out 0, lse = sink.
    out, lse = attention_ref(*qkv(seqlen_q=9, seqlen_k=4), causal=True, sinks=sinks.float())
    assert (out[:, :5] == 0).all()
    assert torch.equal(lse[:, :, :5], sinks.float().view(1, 4, 1).expand(2, 4, 5))
    lowp, _ = attention_ref(*qkv(seqlen_q=9, seqlen_k=4), causal=True, upcast=False,
                            sinks=sinks.float())
    assert lowp.dtype == torch.bfloat16 and torch.isfinite(lowp).all()


def test_sinks_are_checked():
    q, k, v = qkv(device="meta")  # 4 query heads
    for sinks, pattern in [
        (torch.zeros(3, device="meta"), r"sinks: expected a contiguous float32 tensor of shape "
                                         r"\(4,\) \(one logit per query head\); got torch.float32 \(3,\)"),
        (torch.zeros(4, 1, device="meta"), r"sinks: expected .* got torch.float32 \(4, 1\)"),
        (torch.zeros(4), r"sinks: must be on q's device \(meta\); got cpu"),
        ([0.0] * 4, r"sinks: expected a tensor of shape \(heads_q,\) or None; got list"),
    ]:
        with pytest.raises(flash3.Flash3InvalidArgument, match=pattern):
            flash3.flash_attn_func(q, k, v, sinks=sinks)
    # Any float dtype and strides: flash_attn_func converts them to contiguous fp32.
    sinks = torch.zeros(8, dtype=torch.bfloat16, device="meta")[::2]
    assert flash3.flash_attn_func(q, k, v, sinks=sinks).shape == q.shape
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"sinks: expected a contiguous float32"):
        torch.ops.flash3.fwd(q, k, v, None, False, sinks=sinks)


def test_meta_backward_gives_sink_gradient_shapes():
    q, k, v = qkv(device="meta")
    out, lse = torch.ops.flash3.fwd(q, k, v, None, False)
    grads = torch.ops.flash3.bwd(out, q, k, v, out, lse, None, False, False)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (0,)]
    sinks = torch.zeros(4, device="meta")
    dsinks = torch.ops.flash3.bwd(out, q, k, v, out, lse, None, False, False, sinks=sinks)[3]
    assert dsinks.shape == (4,) and dsinks.dtype == torch.float32


@pytest.mark.parametrize("window_size, pattern", [
    (5, r"window_size: expected a pair \(left, right\); got 5"),
    ((1, 2, 3), r"window_size: expected a pair"),
    ((1.5, 0), r"window_size: expected two ints \(-1: unbounded\); got \(1.5, 0\)"),
    ((True, 0), r"window_size: expected two ints"),
])
def test_window_size_must_be_a_pair_of_ints(window_size, pattern):
    q, k, v = qkv()
    with pytest.raises(flash3.Flash3InvalidArgument, match=pattern):
        flash3.flash_attn_func(q, k, v, window_size=window_size)


def test_fast_path_probes_exist():
    # If torch renames them, flash_attn_func silently falls back to the op
    # (~15-20 us slower per call); this makes that visible.
    assert ops._probes is not None


def _reference_forward(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                       sinks=None, want_lse=True, alibi_slopes=None):
    out, lse = attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal,
                             window_size=(window_left, window_right), softcap=softcap, sinks=sinks,
                             alibi_slopes=alibi_slopes)
    return out.to(q.dtype), lse


def test_autograd_registration_on_cpu(monkeypatch):
    # The kernels replaced by the reference (the backward by gradients
    # computed beforehand: an op's implementation runs below autograd): what
    # runs is the op's autograd glue, which the GPU tests otherwise reach only
    # through the real kernels.
    q, k, v = (x.float().requires_grad_() for x in qkv())
    dout = torch.randn(q.shape)
    mask = dict(causal=True, window_size=(3, 0), softcap=5.0)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    attention_ref(*leaves, **mask)[0].backward(dout)
    calls = []

    def backward(*args):
        calls.append(args)
        sinks = args[-2]
        return (*(x.grad for x in leaves), ops._empty_dsinks(q, sinks).fill_(0.5))

    monkeypatch.setattr(ops, "_forward", _reference_forward)
    monkeypatch.setattr(ops, "_backward", backward)
    flash3.flash_attn_func(q, k, v, deterministic=True, **mask).backward(dout)
    (got_dout, *_, scale, causal, deterministic, left, right, softcap, sinks, alibi), = calls
    assert torch.equal(got_dout, dout) and (scale, causal, deterministic) == (None, True, True)
    assert (left, right, softcap, sinks, alibi) == (3, 0, 5.0, None, None)
    for got, want in zip((q, k, v), leaves):
        assert torch.equal(got.grad, want.grad)
    # Sinks in the model's dtype get their gradient back in it, through the fp32 copy.
    sinks = torch.randn(4, dtype=torch.bfloat16, requires_grad=True)
    flash3.flash_attn_func(q, k, v, sinks=sinks).sum().backward()
    assert sinks.grad.dtype == torch.bfloat16 and (sinks.grad == 0.5).all()
    # Frozen sinks: the backward is not asked for dsinks (it would cost time).
    calls.clear()
    flash3.flash_attn_func(q, k, v, sinks=sinks.detach()).sum().backward()
    assert calls[0][-2] is None
    # ALiBi's slopes reach the backward (which has no gradient for them).
    calls.clear()
    slopes = torch.rand(4)
    flash3.flash_attn_func(q, k, v, alibi_slopes=slopes).sum().backward()
    assert calls[0][-1] is slopes


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_reference_is_a_complex_rotation(interleaved):
    from flash3.reference import rotary_ref

    batch, seqlen, heads, head_dim, rotary_dim = 2, 5, 3, 64, 32
    x = torch.randn(batch, seqlen, heads, head_dim, dtype=torch.float64)
    angles = torch.arange(40, dtype=torch.float64)[:, None] * torch.rand(rotary_dim // 2, dtype=torch.float64)
    positions = torch.randint(0, 40, (batch, seqlen))
    got = rotary_ref(x, torch.cos(angles), torch.sin(angles), positions, interleaved)
    part = x[..., :rotary_dim]
    if interleaved:
        z = torch.complex(part[..., 0::2], part[..., 1::2])
    else:
        z = torch.complex(part[..., :rotary_dim // 2], part[..., rotary_dim // 2:])
    z = z * torch.exp(1j * angles[positions]).unsqueeze(2)
    if interleaved:
        expected = torch.stack([z.real, z.imag], dim=-1).flatten(-2)
    else:
        expected = torch.cat([z.real, z.imag], dim=-1)
    assert torch.allclose(got[..., :rotary_dim], expected, atol=1e-12)
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])
