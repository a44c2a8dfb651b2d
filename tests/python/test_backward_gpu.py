"""Backward numerics on the GPU, by the rule of DESIGN.md 3 for dq, dk, dv:

    max|grad - ref| <= 2 * max|grad_lowp - ref| + 1e-5

with ref the gradient of the fp32 reference (torch autograd) and grad_lowp
the gradient of the reference computed in the input dtype. Plus: the
deterministic mode is bitwise reproducible, autograd through
flash_attn_func and torch.compile reach the same kernels.

Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import itertools

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from attention_checks import (  # noqa: E402
    ALIBI_HEAD_DIMS, ALIBI_LENGTHS, ALIBI_MASKS, ALL_HEAD_DIMS, DTYPES, HEAD_DIM_PAIRS, HEAD_DIMS,
    MASKS, SINK_MASKS, _any_built, head_dim_id, out_shape,
    _where, assert_rule, make_alibi_slopes, make_qkv, make_sinks, mask_id, require_built)

GQA_RATIOS = (1, 2, 8)
HEADS_KV = 2

# (batch, seqlen_q, seqlen_k): multiples of no tile (the backward's are 64
# queries x 128 or 64 keys), both orders of unequal lengths, batch > 1.
SMALL_LENGTHS = [
    (1, 1, 1), (2, 17, 17), (1, 113, 255), (2, 255, 113), (1, 128, 128), (2, 799, 799),
]
LARGE_LENGTHS = [(1, 1023, 2049), (1, 2049, 1023), (2, 2049, 2049), (1, 4096, 4096)]


def _leaves(tensors, sinks):
    """Gradient leaves for q, k, v (and sinks); `sinks` rides along in the list."""
    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    if sinks is not None:
        leaves.append(sinks.detach().clone().requires_grad_())
    return leaves


def reference_grads(q, k, v, dout, causal, softmax_scale=None, upcast=True, sinks=None, **mask):
    """[dq, dk, dv] (and dsinks with sinks) of the fp32 or input-dtype reference."""
    leaves = _leaves([x.float() if upcast else x for x in (q, k, v)], sinks)
    out, _ = attention_ref(*leaves[:3], softmax_scale=softmax_scale, causal=causal, upcast=upcast,
                           sinks=leaves[3] if sinks is not None else None, **mask)
    out.backward(dout.float() if upcast else dout)
    return [x.grad for x in leaves]


def flash3_grads(q, k, v, dout, causal, softmax_scale=None, deterministic=False, sinks=None,
                 **mask):
    leaves = _leaves((q, k, v), sinks)
    out = flash3.flash_attn_func(*leaves[:3], softmax_scale=softmax_scale, causal=causal,
                                 deterministic=deterministic,
                                 sinks=leaves[3] if sinks is not None else None, **mask)
    out.backward(dout)
    return [x.grad for x in leaves]


def check_grads(q, k, v, seed, causal, softmax_scale=None, dout=None, deterministic=False,
                **mask):
    """`mask`: window_size, softcap and sinks, as flash_attn_func takes them."""
    if dout is None:
        dout = torch.randn(out_shape(q, v), dtype=q.dtype, device=q.device)
    got = flash3_grads(q, k, v, dout, causal, softmax_scale, deterministic, **mask)
    ref = reference_grads(q, k, v, dout, causal, softmax_scale, **mask)
    lowp = reference_grads(q, k, v, dout, causal, softmax_scale, upcast=False, **mask)
    inputs = (q, k, v, mask.get("sinks"))
    for name, g, r, lo, x in zip(("dq", "dk", "dv", "dsinks"), got, ref, lowp, inputs):
        assert g.dtype == x.dtype and g.shape == x.shape, f"{name} {_where(seed)}"
        assert_rule(name, g.float(), r, lo.float(), seed)
    return got, ref, lowp


def _cases():
    for (dtype_name, head_dim, causal, ratio, lengths) in itertools.product(
            DTYPES, ALL_HEAD_DIMS, (False, True), GQA_RATIOS, SMALL_LENGTHS):
        yield dtype_name, head_dim, causal, ratio, lengths
    for i, (dtype_name, head_dim, causal, lengths) in enumerate(itertools.product(
            DTYPES, ALL_HEAD_DIMS, (False, True), LARGE_LENGTHS)):
        yield dtype_name, head_dim, causal, GQA_RATIOS[i % len(GQA_RATIOS)], lengths


def _case_id(case):
    dtype_name, head_dim, causal, ratio, (b, sq, sk) = case
    return (f"{dtype_name}-d{head_dim_id(head_dim)}-{'causal' if causal else 'full'}-gqa{ratio}"
            f"-b{b}-{sq}x{sk}")


@pytest.mark.parametrize("case", list(_cases()), ids=_case_id)
def test_backward_matches_reference(case, seed):
    dtype_name, head_dim, causal, ratio, (batch, seqlen_q, seqlen_k) = case
    require_built(dtype_name, head_dim)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, HEADS_KV * ratio, HEADS_KV, head_dim,
                       DTYPES[dtype_name])
    check_grads(q, k, v, seed, causal)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_noncontiguous_inputs_and_dout(head_dim, seed):
    require_built("bf16", head_dim)
    packed = torch.randn(2, 300, 3, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    q, k, v = packed.unbind(2)  # strided views of one (b, s, 3, h, d) buffer
    dout = torch.randn(2, 4, 300, head_dim, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    check_grads(q, k, v, seed, causal=True, dout=dout)


@pytest.mark.parametrize("softmax_scale", [0.05, 0.3])
def test_softmax_scale(softmax_scale, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 200, 333, 4, 2, d, dtype)
    check_grads(q, k, v, seed, causal=True, softmax_scale=softmax_scale)


def test_rule_detects_a_wrong_gradient(seed):
    # Negative control: gradients of a different problem (another softmax
    # scale) must fail the rule, or the comparisons above prove nothing.
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 200, 300, 2, 2, d, dtype)
    dout = torch.randn_like(q)
    wrong = flash3_grads(q, k, v, dout, causal=True, softmax_scale=1.1 / d ** 0.5)
    ref = reference_grads(q, k, v, dout, True)
    lowp = reference_grads(q, k, v, dout, True, upcast=False)
    for name, g, r, lo in zip(("dq", "dk", "dv"), wrong, ref, lowp):
        with pytest.raises(AssertionError):
            assert_rule(name, g.float(), r, lo.float(), seed)


def test_causal_rows_without_keys(seed):
    # seqlen_q > seqlen_k, causal: the first rows see no key (lse -inf); their
    # dq is 0 and they add nothing to dk, dv.
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 300, 100, 2, 2, d, dtype)
    check_grads(q, k, v, seed, causal=True)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(0, 50), (50, 0), (0, 0)])
def test_zero_length_gives_zero_grads(seqlen_q, seqlen_k, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, d, dtype)
    dq, dk, dv = flash3_grads(q, k, v, torch.randn_like(q), causal=False)
    for g, x in ((dq, q), (dk, k), (dv, v)):
        assert g.shape == x.shape and (g == 0).all()


def _deterministic_grads(q, k, v, dout, causal, runs, **mask):
    first = flash3_grads(q, k, v, dout, causal, deterministic=True, **mask)
    for run in range(runs - 1):
        again = flash3_grads(q, k, v, dout, causal, deterministic=True, **mask)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs on run {run + 2} of {runs}"
    return first


def test_deterministic_small_1000_runs(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 333, 555, 4, 2, d, dtype)
    dout = torch.randn_like(q)
    _deterministic_grads(q, k, v, dout, causal=False, runs=1000)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_large_20_runs(causal, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 4096, 4096, 8, 2, d, dtype)
    dout = torch.randn_like(q)
    grads = _deterministic_grads(q, k, v, dout, causal, runs=20)
    check_grads(q, k, v, seed, causal, dout=dout, deterministic=True)
    assert all(g.isfinite().all() for g in grads)


MASK_LENGTHS = [(1, 113, 255), (2, 255, 113), (2, 799, 799), (1, 1023, 2049)]


@pytest.mark.parametrize("lengths", MASK_LENGTHS, ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("mask", MASKS, ids=mask_id)
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_window_and_softcap(dtype_name, head_dim, mask, lengths, seed):
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    batch, seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[dtype_name])
    check_grads(q, k, v, seed, causal, window_size=window_size, softcap=softcap)


@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("window_size", [(512, 0), (300, 300), (-1, 64)], ids=str)
def test_deterministic_window_20_runs(head_dim, window_size, seed):
    # Windows make the dQ adds of a tile start at a key block other than 0:
    # the ordered adds must still all arrive (no hang) and repeat bitwise.
    require_built("bf16", head_dim)
    q, k, v = make_qkv(2, 4096, 4096, 8, 2, head_dim, torch.bfloat16)
    dout = torch.randn(out_shape(q, v), dtype=q.dtype, device=q.device)
    _deterministic_grads(q, k, v, dout, False, runs=20, window_size=window_size)
    check_grads(q, k, v, seed, False, dout=dout, deterministic=True, window_size=window_size)


@pytest.mark.parametrize("lengths", [(2, 255, 113), (1, 799, 799), (1, 1023, 2049)],
                         ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("mask", SINK_MASKS, ids=mask_id)
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_sinks(dtype_name, head_dim, mask, lengths, seed):
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    batch, seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[dtype_name])
    check_grads(q, k, v, seed, causal, window_size=window_size, softcap=softcap,
                sinks=make_sinks(4, seqlen_k))


@pytest.mark.parametrize("per_batch", [False, True], ids=["per-head", "per-batch"])
@pytest.mark.parametrize("lengths", ALIBI_LENGTHS, ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("mask", ALIBI_MASKS, ids=mask_id)
@pytest.mark.parametrize("head_dim", ALIBI_HEAD_DIMS + HEAD_DIM_PAIRS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_alibi(dtype_name, head_dim, mask, lengths, per_batch, seed):
    require_built(dtype_name, head_dim)
    causal, window_size, _ = mask
    batch, seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[dtype_name])
    check_grads(q, k, v, seed, causal, window_size=window_size,
                alibi_slopes=make_alibi_slopes(4, batch if per_batch else None))


def test_sink_gradient_is_checked_and_reproducible(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 1000, 1500, 4, 2, d, dtype)
    dout = torch.randn_like(q)
    sinks = make_sinks(4, 1500)
    got, ref, lowp = check_grads(q, k, v, seed, True, dout=dout, sinks=sinks)
    # Negative control: the gradient with the wrong sign (P_sink * D, not -P_sink * D) fails.
    with pytest.raises(AssertionError):
        assert_rule("dsinks", -got[3], ref[3], lowp[3], seed)
    # Bitwise the same on every run, in both modes (a fixed order of adds).
    for deterministic in (False, True):
        for _ in range(5):
            again = flash3_grads(q, k, v, dout, True, deterministic=deterministic, sinks=sinks)
            assert torch.equal(again[3], got[3])
    # Sinks the model keeps in bf16: the gradient comes back in bf16.
    dsinks = flash3_grads(q, k, v, dout, True, sinks=sinks.bfloat16())[3]
    assert dsinks.dtype == torch.bfloat16 and torch.equal(dsinks, got[3].bfloat16())


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(2, 0, 50), (2, 50, 0), (2, 0, 0), (0, 50, 50)])
def test_sink_gradient_of_empty_problems_is_zero(batch, seqlen_q, seqlen_k, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, d, dtype)
    grads = flash3_grads(q, k, v, torch.randn_like(q), False, sinks=make_sinks(4, seqlen_k))
    assert grads[3].shape == (4,) and (grads[3] == 0).all()
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and (g == 0).all()


def test_softcap_gradient_differs_from_none(seed):
    # Negative control for the softcap gradient: without d tanh the result
    # must fail the rule.
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 200, 300, 2, 2, d, dtype)
    q = q * 3
    dout = torch.randn_like(q)
    wrong = flash3_grads(q, k, v, dout, False)
    ref = reference_grads(q, k, v, dout, False, softcap=2.0)
    lowp = reference_grads(q, k, v, dout, False, upcast=False, softcap=2.0)
    with pytest.raises(AssertionError):
        assert_rule("dq", wrong[0].float(), ref[0], lowp[0].float(), seed)


def test_torch_compile_forward_and_backward(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 256, 256, 4, 2, d, dtype)
    dout = torch.randn_like(q)

    @torch.compile(fullgraph=True)
    def loss(q, k, v):
        return (flash3.flash_attn_func(q, k, v, causal=True) * dout).sum()

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    loss(*leaves).backward()
    eager = flash3_grads(q, k, v, dout, causal=True, deterministic=True)
    again = flash3_grads(q, k, v, dout, causal=True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, again))
    ref = reference_grads(q, k, v, dout, True)
    lowp = reference_grads(q, k, v, dout, True, upcast=False)
    for name, g, r, lo in zip(("dq", "dk", "dv"), [x.grad for x in leaves], ref, lowp):
        assert_rule(f"{name} [compiled]", g.float(), r, lo.float(), seed)


def test_cuda_graph_of_forward_and_backward(seed):
    # No host sync and no allocation outside torch's allocator: a training
    # step captures, and replays give the eager gradients (deterministic mode,
    # so equal bitwise).
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 300, 300, 4, 2, d, dtype)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    dout = torch.randn_like(q)

    def step():
        for x in leaves:
            x.grad = None
        out = flash3.flash_attn_func(*leaves, causal=True, deterministic=True)
        out.backward(dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    eager = flash3_grads(q, k, v, dout, causal=True, deterministic=True)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for name, x, e in zip(("dq", "dk", "dv"), leaves, eager):
            assert torch.equal(x.grad, e), f"{name}: graph replay differs from eager {_where(seed)}"


def test_bad_backward_inputs_name_the_argument():
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 64, 64, 2, 2, d, dtype)
    out, lse = flash3.flash_attn_func(q, k, v, return_lse=True)
    dout = torch.randn_like(out)
    bwd = torch.ops.flash3.bwd
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"lse: .*\(1, 2, 64\).*\(1, 2, 32\)"):
        bwd(dout, q, k, v, out, lse[:, :, :32].contiguous(), None, False, False)
    with pytest.raises(flash3.Flash3InvalidArgument, match="dout: dtype"):
        bwd(dout.float(), q, k, v, out, lse, None, False, False)
    with pytest.raises(flash3.Flash3InvalidArgument, match="out: shape"):
        bwd(dout, q, k, v, out[:, :32], lse, None, False, False)
