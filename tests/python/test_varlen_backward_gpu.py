"""Varlen backward numerics on the GPU: gradients of packed sequences of
different lengths (0 included) against the fp32 reference run on each
sequence alone, by the rule of DESIGN.md 3. The reference's packed leaves
collect each sequence's gradient in its rows, so rows in no sequence must
come back zero. Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import itertools

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from attention_checks import (  # noqa: E402
    ALIBI_HEAD_DIMS, ALIBI_MASKS, ALL_HEAD_DIMS, DTYPES, HEAD_DIM_PAIRS, MASKS, SINK_MASKS,
    _any_built, _where, assert_rule, head_dim_id, make_alibi_slopes, make_sinks, mask_id, out_shape,
    require_built)
from test_varlen_gpu import GQA_RATIOS, HEADS_KV, LONG, SHORT, pack, spans_of  # noqa: E402


def _leaves(tensors, sinks):
    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    if sinks is not None:
        leaves.append(sinks.detach().clone().requires_grad_())
    return leaves


def reference_grads(q, k, v, dout, spans, upcast, sinks=None, **mask):
    """[dq, dk, dv] (and dsinks) of attention_ref on each sequence alone."""
    leaves = _leaves([x.float() if upcast else x for x in (q, k, v)], sinks)
    lq, lk, lv = leaves[:3]
    loss = 0
    for (q0, q1), (k0, k1) in spans:
        if q1 == q0:
            continue
        out, _ = attention_ref(lq[None, q0:q1], lk[None, k0:k1], lv[None, k0:k1], upcast=upcast,
                               sinks=leaves[3] if sinks is not None else None, **mask)
        grad = dout[None, q0:q1].float() if upcast else dout[None, q0:q1]
        loss = loss + (out * grad).sum()
    if isinstance(loss, torch.Tensor):
        loss.backward()
    return [torch.zeros_like(x) if x.grad is None else x.grad for x in leaves]


def flash3_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, sinks=None, used=None,
                 deterministic=False, **mask):
    leaves = _leaves((q, k, v), sinks)
    out = flash3.flash_attn_varlen_func(*leaves[:3], cu_q, cu_k, max_q, max_k,
                                        sinks=leaves[3] if sinks is not None else None,
                                        deterministic=deterministic, **(used or {}), **mask)
    out.backward(dout)
    return [x.grad for x in leaves]


def check_grads(lengths, q, k, v, cu_q, cu_k, seed, seqused=None, **mask):
    spans = spans_of(lengths, seqused)
    max_q = max([q1 - q0 for (q0, q1), _ in spans] + [0])
    max_k = max([k1 - k0 for _, (k0, k1) in spans] + [0])
    used = None
    if seqused is not None:
        used = dict(seqused_q=torch.tensor(seqused[0], dtype=torch.int32, device="cuda"),
                    seqused_k=torch.tensor(seqused[1], dtype=torch.int32, device="cuda"))
    dout = torch.randn(out_shape(q, v), dtype=q.dtype, device=q.device)
    got = flash3_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, used=used, **mask)
    ref = reference_grads(q, k, v, dout, spans, True, **mask)
    lowp = reference_grads(q, k, v, dout, spans, False, **mask)
    inputs = (q, k, v, mask.get("sinks"))
    for name, g, r, lo, x in zip(("dq", "dk", "dv", "dsinks"), got, ref, lowp, inputs):
        assert g.dtype == x.dtype and g.shape == x.shape, f"{name} {_where(seed)}"
        assert_rule(name, g.float(), r, lo.float(), seed)
    return got


def _cases():
    for dtype_name, head_dim, causal, ratio in itertools.product(DTYPES, ALL_HEAD_DIMS,
                                                                 (False, True), GQA_RATIOS):
        yield dtype_name, head_dim, causal, ratio, "short"
    for i, (dtype_name, head_dim, causal) in enumerate(
            itertools.product(DTYPES, ALL_HEAD_DIMS, (False, True))):
        yield dtype_name, head_dim, causal, GQA_RATIOS[i % len(GQA_RATIOS)], "long"


def _case_id(case):
    dtype_name, head_dim, causal, ratio, which = case
    return f"{dtype_name}-d{head_dim_id(head_dim)}-{'causal' if causal else 'full'}-gqa{ratio}-{which}"


@pytest.mark.parametrize("case", list(_cases()), ids=_case_id)
def test_varlen_backward_matches_reference(case, seed):
    dtype_name, head_dim, causal, ratio, which = case
    require_built(dtype_name, head_dim)
    lengths = SHORT if which == "short" else LONG
    q, k, v, cu_q, cu_k = pack(lengths, HEADS_KV * ratio, HEADS_KV, head_dim, DTYPES[dtype_name])
    check_grads(lengths, q, k, v, cu_q, cu_k, seed, causal=causal)


@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("mask", MASKS, ids=mask_id)
def test_varlen_backward_windows_and_softcap(mask, head_dim, seed):
    dtype_name, dtype, _ = _any_built()
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    check_grads(SHORT, q, k, v, cu_q, cu_k, seed, causal=causal, window_size=window_size,
                softcap=softcap)


@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("mask", SINK_MASKS, ids=mask_id)
def test_varlen_backward_sinks(mask, head_dim, seed):
    dtype_name, dtype, _ = _any_built()
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    check_grads(SHORT, q, k, v, cu_q, cu_k, seed, causal=causal, window_size=window_size,
                softcap=softcap, sinks=make_sinks(4, 255))


@pytest.mark.parametrize("head_dim", ALIBI_HEAD_DIMS + HEAD_DIM_PAIRS, ids=head_dim_id)
@pytest.mark.parametrize("mask", ALIBI_MASKS, ids=mask_id)
def test_varlen_alibi(mask, head_dim, seed):
    # Forward and backward (the forward through the gradients' reference;
    # out itself below): distances from each sequence's own corner.
    dtype_name, dtype, _ = _any_built()
    require_built(dtype_name, head_dim)
    causal, window_size, _ = mask
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    slopes = make_alibi_slopes(4)
    check_grads(SHORT, q, k, v, cu_q, cu_k, seed, causal=causal, window_size=window_size,
                alibi_slopes=slopes)
    spans = spans_of(SHORT, None)
    max_q = max(q1 - q0 for (q0, q1), _ in spans)
    max_k = max(k1 - k0 for _, (k0, k1) in spans)
    out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                        window_size=window_size, alibi_slopes=slopes)
    for (q0, q1), (k0, k1) in spans:
        if q1 == q0:
            continue
        args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        kwargs = dict(causal=causal, window_size=window_size, alibi_slopes=slopes)
        ref, _ = attention_ref(*args, **kwargs)
        lowp, _ = attention_ref(*args, upcast=False, **kwargs)
        assert_rule(f"out[{q0}:{q1}]", out[None, q0:q1].float(), ref, lowp.float(), seed)


@pytest.mark.parametrize("causal", (False, True))
def test_varlen_backward_seqused(causal, seed):
    """Rows of a span past seqused get no gradient (zero), and keys there
    none either."""
    dtype_name, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    used_q = [max(0, sq - 7) for sq, _ in SHORT]
    used_k = [sk // 2 for _, sk in SHORT]
    check_grads(SHORT, q, k, v, cu_q, cu_k, seed, seqused=(used_q, used_k), causal=causal)


@pytest.mark.parametrize("lengths", [[(5, 0), (130, 0)], [(0, 7), (0, 3)], [(0, 0)]],
                         ids=["no-keys", "no-queries", "nothing"])
def test_varlen_backward_of_empty_batches(lengths, seed):
    """Every row without keys (dq = 0, dk, dv empty), no query at all (dk =
    dv = 0), or neither: zero gradients, no hang, no NaN."""
    dtype_name, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(lengths, 4, 2, head_dim, dtype)
    check_grads(lengths, q, k, v, cu_q, cu_k, seed, causal=True, sinks=make_sinks(4, 1))


@pytest.mark.parametrize("causal", (False, True))
def test_varlen_backward_deterministic_20_runs(causal, seed):
    dtype_name, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(LONG, 8, 2, head_dim, dtype)
    dout = torch.randn_like(q)
    max_q, max_k = max(sq for sq, _ in LONG), max(sk for _, sk in LONG)
    first = flash3_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, deterministic=True,
                         causal=causal)
    for run in range(20):
        again = flash3_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, deterministic=True,
                             causal=causal)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs in run {run + 1} {_where(seed)}"


def test_varlen_equal_lengths_match_the_fixed_length_backward(seed):
    """Equal lengths packed: the same gradients as flash_attn_func on the
    batch, to the rule (different kernels, so not the same bits)."""
    dtype_name, dtype, head_dim = _any_built()
    q, k, v = (torch.randn(3, 300, 4, head_dim, dtype=dtype, device="cuda") for _ in range(3))
    cu = torch.arange(0, 901, 300, dtype=torch.int32, device="cuda")
    dout = torch.randn_like(q)
    fixed = _leaves((q, k, v), None)
    flash3.flash_attn_func(*fixed, causal=True).backward(dout)
    packed = flash3_grads(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), dout.flatten(0, 1),
                          cu, cu, 300, 300, causal=True)
    lengths = [(300, 300)] * 3
    spans = spans_of(lengths)
    flat = [x.flatten(0, 1) for x in (q, k, v, dout)]
    ref = reference_grads(*flat, spans, True, causal=True)
    lowp = reference_grads(*flat, spans, False, causal=True)
    for name, f, p, r, lo in zip(("dq", "dk", "dv"), fixed, packed, ref, lowp):
        assert_rule(f"{name} [fixed]", f.grad.flatten(0, 1).float(), r, lo.float(), seed)
        assert_rule(f"{name} [varlen]", p.float(), r, lo.float(), seed)


def test_varlen_backward_opcheck(seed):
    _, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    torch.library.opcheck(torch.ops.flash3.fwd_varlen.default,
                          (q, k, v, cu_q, cu_k, 799, 801, None, True),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


def test_varlen_backward_under_torch_compile(seed):
    dtype_name, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    dout = torch.randn_like(q)

    def loss(q, k, v):
        out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 799, 801, causal=True)
        return (out.float() * dout.float()).sum()

    leaves = _leaves((q, k, v), None)
    torch.compile(loss, fullgraph=True)(*leaves).backward()
    spans = spans_of(SHORT)
    ref = reference_grads(q, k, v, dout, spans, True, causal=True)
    lowp = reference_grads(q, k, v, dout, spans, False, causal=True)
    for name, g, r, lo in zip(("dq", "dk", "dv"), (x.grad for x in leaves), ref, lowp):
        assert_rule(f"{name} [compiled]", g.float(), r, lo.float(), seed)


def test_bad_varlen_backward_inputs_name_the_argument():
    _, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    out, lse = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 799, 801, return_lse=True)
    op = torch.ops.flash3.bwd_varlen.default
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"lse: expected the forward's LSE"):
        op(out, q, k, v, out, lse.t(), cu_q, cu_k, 799, 801, None, False, False)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"dout: shape must be q's with v's head dim"):
        op(out[1:], q, k, v, out, lse, cu_q, cu_k, 799, 801, None, False, False)
