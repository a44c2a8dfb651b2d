"""Forward numerics on the GPU, by the rule of DESIGN.md 3:

    max|out - ref| <= 2 * max|out_lowp - ref| + 1e-5

with ref the fp32 reference on the same inputs and out_lowp the reference
computed in the input dtype; likewise for LSE. NaN/Inf never pass; rows that
see no key must be exactly 0 with LSE -inf. Inputs are fresh random every
run; FLASH3_TEST_SEED=<n> replays the seed a failure message printed.

Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import itertools
import math

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3 import ops  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from attention_checks import (  # noqa: E402
    ALIBI_HEAD_DIMS, ALIBI_LENGTHS, ALIBI_MASKS, ALL_HEAD_DIMS, DTYPES, HEAD_DIM_PAIRS, HEAD_DIMS,
    MASKS, SINK_MASKS, _any_built, _built, _where, assert_rule, head_dim_id, make_alibi_slopes,
    make_qkv, make_sinks, mask_id, out_shape, require_built)

GQA_RATIOS = (1, 2, 8)
HEADS_KV = 2

# (batch, seqlen_q, seqlen_k): lengths that are multiples of no tile, both
# orders of unequal lengths, batch > 1. Small ones run the full product of
# dtype x head dim x causal x GQA ratio; large ones rotate the GQA ratio.
SMALL_LENGTHS = [
    (1, 1, 1), (2, 17, 17), (3, 1, 113), (2, 113, 1), (2, 113, 255), (1, 255, 113),
    (2, 113, 799), (1, 799, 113), (2, 128, 128), (1, 799, 799),
]
LARGE_LENGTHS = [
    (1, 1023, 1023), (1, 2049, 1023), (1, 1023, 2049), (2, 2049, 2049), (1, 4096, 4096),
    (2, 1, 4096), (1, 4096, 1), (1, 17, 4096), (1, 4096, 255), (1, 8191, 8191),
]


def check_against_reference(q, k, v, results, seed, causal=False, softmax_scale=None, **mask):
    """results: {label: (out, lse)}, all for the same inputs (the reference runs once).
    `mask`: window_size and softcap, as flash_attn_func takes them."""
    ref_out, ref_lse = attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal, **mask)
    lowp_out, lowp_lse = attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                       upcast=False, **mask)
    empty = torch.isneginf(ref_lse)  # rows that see no key
    visible = ~empty
    for label, (out, lse) in results.items():
        where = f"[{label}] {_where(seed)}"
        assert out.dtype == q.dtype and out.shape == out_shape(q, v) and out.is_contiguous(), where
        assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape and lse.is_contiguous(), where
        if empty.any():
            rows = empty.transpose(1, 2)  # (b, sq, h): out's row order
            assert (out[rows] == 0).all(), f"out: rows that see no key are not 0 {where}"
            assert torch.isneginf(lse[empty]).all(), f"lse: rows that see no key are not -inf {where}"
        assert_rule(f"out [{label}]", out.float(), ref_out, lowp_out.float(), seed)
        assert_rule(f"lse [{label}]", lse[visible], ref_lse[visible], lowp_lse[visible], seed)


def run_poisoned(q, k, v, causal=False, softmax_scale=None, with_lse=True, window_size=(-1, -1),
                 softcap=0.0, sinks=None, alibi_slopes=None):
    """The op's own launch path into NaN-filled buffers, so unwritten elements fail."""
    b, sq, hq, _ = q.shape
    out = torch.full(out_shape(q, v), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device=q.device)
    ops._launch(q, k, v, out, lse if with_lse else None, softmax_scale, causal,
                *ops._abi_window(window_size),
                softcap, sinks, alibi=ops._check_alibi(alibi_slopes, b, q))
    return out, lse


def check_both_paths(q, k, v, seed, causal=False, softmax_scale=None, **mask):
    """The public call, and the same launch into poisoned buffers."""
    results = {
        "flash_attn_func": flash3.flash_attn_func(q, k, v, softmax_scale=softmax_scale,
                                                  causal=causal, return_lse=True, **mask),
        "poisoned": run_poisoned(q, k, v, causal, softmax_scale, **mask),
    }
    check_against_reference(q, k, v, results, seed, causal, softmax_scale, **mask)


def _cases():
    small = itertools.product(DTYPES, ALL_HEAD_DIMS, (False, True), GQA_RATIOS, SMALL_LENGTHS)
    for dtype_name, head_dim, causal, ratio, lengths in small:
        yield dtype_name, head_dim, causal, ratio, lengths
    large = itertools.product(DTYPES, ALL_HEAD_DIMS, (False, True), LARGE_LENGTHS)
    for i, (dtype_name, head_dim, causal, lengths) in enumerate(large):
        yield dtype_name, head_dim, causal, GQA_RATIOS[i % len(GQA_RATIOS)], lengths


def _case_id(case):
    dtype_name, head_dim, causal, ratio, (b, sq, sk) = case
    return (f"{dtype_name}-d{head_dim_id(head_dim)}-{'causal' if causal else 'full'}-gqa{ratio}"
            f"-b{b}-{sq}x{sk}")


@pytest.mark.parametrize("case", list(_cases()), ids=_case_id)
def test_forward_matches_reference(case, seed):
    dtype_name, head_dim, causal, ratio, (batch, seqlen_q, seqlen_k) = case
    require_built(dtype_name, head_dim)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, HEADS_KV * ratio, HEADS_KV, head_dim,
                       DTYPES[dtype_name])
    check_both_paths(q, k, v, seed, causal=causal)


# Full attention over at most 2k keys runs a persistent grid (fwd_launch.cuh):
# with more tiles than twice the SMs every CTA walks several, so the Q
# barriers change phase and K / V stages carry over from tile to tile.
PERSISTENT_LENGTHS = [(3, 1000, 777), (64, 5, 300), (2, 2047, 2048)]
PERSISTENT_HEADS = (16, 4)


@pytest.mark.parametrize("lengths", PERSISTENT_LENGTHS, ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_persistent_grid(dtype_name, head_dim, lengths, seed):
    require_built(dtype_name, head_dim)
    batch, seqlen_q, seqlen_k = lengths
    heads_q, heads_kv = PERSISTENT_HEADS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert batch * heads_q * -(-seqlen_q // 128) > 2 * sms, "too few tiles to walk several"
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, DTYPES[dtype_name])
    check_both_paths(q, k, v, seed)
    check_both_paths(q, k, v, seed, softcap=5.0, sinks=make_sinks(heads_q, seqlen_k))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_noncontiguous_inputs(dtype_name, head_dim, seed):
    require_built(dtype_name, head_dim)
    dtype = DTYPES[dtype_name]
    b, s, hq, hkv, d = 2, 257, 8, 2, head_dim
    # q, k, v sliced out of one packed (b, s, hq + 2 hkv, d) projection.
    packed = torch.randn(b, s, hq + 2 * hkv, d, dtype=dtype, device="cuda")
    q, k, v = packed.split([hq, hkv, hkv], dim=2)
    check_both_paths(q, k, v, seed, causal=True)
    # (b, h, s, d) storage seen as (b, s, h, d): only the last dim is contiguous.
    q, k, v = (torch.randn(b, h, n, d, dtype=dtype, device="cuda").transpose(1, 2)
               for h, n in ((hq, 300), (hkv, 171), (hkv, 171)))
    check_both_paths(q, k, v, seed, causal=True)
    check_both_paths(q, k, v, seed, causal=False)
    # Padded rows: head stride d + 8 (still 16-byte aligned).
    q, k, v = (torch.randn(b, n, h, d + 8, dtype=dtype, device="cuda")[..., :d]
               for h, n in ((hq, 129), (hkv, 513), (hkv, 513)))
    check_both_paths(q, k, v, seed, causal=False)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("softmax_scale", [0.05, 0.3, 1.0])
def test_softmax_scale(dtype_name, head_dim, softmax_scale, seed):
    require_built(dtype_name, head_dim)
    q, k, v = make_qkv(2, 300, 555, 4, 2, head_dim, DTYPES[dtype_name])
    check_both_paths(q, k, v, seed, causal=True, softmax_scale=softmax_scale)
    check_both_paths(q, k, v, seed, causal=False, softmax_scale=softmax_scale)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_sharp_softmax(dtype_name, head_dim, seed):
    # Large score spread: the running max changes often across key tiles.
    require_built(dtype_name, head_dim)
    q, k, v = make_qkv(1, 1000, 1500, 4, 4, head_dim, DTYPES[dtype_name])
    q = q * 4
    check_both_paths(q, k, v, seed, causal=True)


MASK_LENGTHS = [(2, 300, 555), (1, 799, 113), (2, 1023, 1023), (1, 17, 4096), (1, 4096, 4096)]


@pytest.mark.parametrize("lengths", MASK_LENGTHS, ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("mask", MASKS, ids=mask_id)
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_window_and_softcap(dtype_name, head_dim, mask, lengths, seed):
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    batch, seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[dtype_name])
    check_both_paths(q, k, v, seed, causal=causal, window_size=window_size, softcap=softcap)


SINK_LENGTHS = [(2, 300, 555), (1, 799, 113), (1, 2049, 2049)]


@pytest.mark.parametrize("lengths", SINK_LENGTHS, ids=lambda s: "b{}-{}x{}".format(*s))
@pytest.mark.parametrize("mask", SINK_MASKS, ids=mask_id)
@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_sinks(dtype_name, head_dim, mask, lengths, seed):
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    batch, seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[dtype_name])
    check_both_paths(q, k, v, seed, causal=causal, window_size=window_size, softcap=softcap,
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
    slopes = make_alibi_slopes(4, batch if per_batch else None)
    check_both_paths(q, k, v, seed, causal=causal, window_size=window_size, alibi_slopes=slopes)


def test_alibi_is_checked(seed):
    # A test that passes without the bias would be no test: the output
    # without ALiBi must fail the rule against the reference with it.
    dtype_name, dtype, d = _any_built()
    q, k, v = make_qkv(1, 300, 300, 4, 2, d, dtype)
    slopes = make_alibi_slopes(4)
    ref, _ = attention_ref(q, k, v, alibi_slopes=slopes)
    lowp, _ = attention_ref(q, k, v, alibi_slopes=slopes, upcast=False)
    with pytest.raises(AssertionError):
        assert_rule("out", flash3.flash_attn_func(q, k, v).float(), ref, lowp.float(), seed)
    with pytest.raises(flash3.Flash3Unsupported, match="alibi_slopes: not supported with softcap"):
        flash3.flash_attn_func(q, k, v, softcap=5.0, alibi_slopes=slopes)
    if 256 in _built()[1]:
        big = [torch.randn(1, 8, 4 // i, 256, dtype=dtype, device="cuda") for i in (1, 2, 2)]
        with pytest.raises(flash3.Flash3Unsupported,
                           match="alibi_slopes: supported up to head_dim 192; got head_dim 256"):
            flash3.flash_attn_func(*big, alibi_slopes=slopes)


def test_sinks_edge_cases(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 300, 100, 4, 2, d, dtype)
    # All -inf: exactly the kernel without sinks.
    none = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    minus_inf = torch.full((4,), -math.inf, device="cuda")
    for got, want in zip(run_poisoned(q, k, v, causal=True, sinks=minus_inf), none):
        assert torch.equal(got, want)
    # Rows that see no key put all weight on the sink: out 0, lse = the sink.
    sinks = make_sinks(4, 100)
    out, lse = run_poisoned(q, k, v, causal=True, sinks=sinks)
    assert (out[:, :200] == 0).all()
    assert torch.equal(lse[:, :, :200], sinks.view(1, 4, 1).expand(2, 4, 200))
    # No keys at all: the same for every row (the empty-keys kernel).
    out, lse = run_poisoned(q, k[:, :0], v[:, :0], sinks=sinks)
    assert (out == 0).all() and torch.equal(lse, sinks.view(1, 4, 1).expand(2, 4, 300))
    # The model's dtype (bf16 sinks) is accepted and read as its fp32 value.
    got = flash3.flash_attn_func(q, k, v, causal=True, sinks=sinks.bfloat16())
    assert torch.equal(got, flash3.flash_attn_func(q, k, v, causal=True, sinks=sinks))


def test_window_spelled_as_causal_is_causal(seed):
    # (-1, 0) without causal is the causal mask; the kernel must agree exactly.
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 700, 900, 4, 2, d, dtype)
    causal = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    window = flash3.flash_attn_func(q, k, v, window_size=(-1, 0), return_lse=True)
    assert torch.equal(causal[0], window[0]) and torch.equal(causal[1], window[1])
    # Bounds past both sequences (2^40 is clamped to int32 for the ABI): full attention.
    check_both_paths(q, k, v, seed, window_size=(10**6, 2**40))


def test_return_forms(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 64, 96, 4, 2, d, dtype)
    out = flash3.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.device == q.device
    out2, lse = flash3.flash_attn_func(q, k, v, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (2, 4, 64)


def test_lse_optional_in_the_abi(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 200, 333, 4, 2, d, dtype)
    out, lse = run_poisoned(q, k, v, causal=True, with_lse=False)
    assert torch.isnan(lse).all()  # NULL lse: untouched
    ref_out, _ = attention_ref(q, k, v, causal=True)
    lowp_out, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_rule("out", out.float(), ref_out, lowp_out.float(), seed)


@pytest.mark.parametrize("shape", [(0, 16, 16), (2, 0, 16), (2, 16, 0), (2, 0, 0)],
                         ids=lambda s: "b{}-{}x{}".format(*s))
def test_zero_sized(shape, seed):
    _, dtype, d = _any_built()
    b, sq, sk = shape
    q, k, v = make_qkv(b, sq, sk, 4, 2, d, dtype)
    for out, lse in (flash3.flash_attn_func(q, k, v, return_lse=True), run_poisoned(q, k, v)):
        assert out.shape == q.shape and lse.shape == (b, 4, sq)
        # Vacuous for empty outputs; with seqlen_k == 0 every row sees no key.
        assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIM_PAIRS, ids=head_dim_id)
def test_head_dim_v_without_keys_and_refusals(dtype_name, head_dim, seed):
    # seqlen_k == 0 writes out's own head dim of zeros (poisoned: every
    # column); what only the KV-cache kernel does is refused by name.
    require_built(dtype_name, head_dim)
    dtype = DTYPES[dtype_name]
    q, k, v = make_qkv(2, 33, 0, 4, 2, head_dim, dtype)
    for out, lse in (flash3.flash_attn_func(q, k, v, return_lse=True), run_poisoned(q, k, v)):
        assert out.shape == out_shape(q, v) and (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = make_qkv(2, 1, 300, 8, 2, head_dim, dtype)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"v_cache: shape must equal k_cache's"):
        flash3.flash_attn_with_kvcache(q, k, v)


def test_causal_rows_without_keys(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 300, 100, 4, 2, d, dtype)
    out, lse = run_poisoned(q, k, v, causal=True)
    assert (out[:, :200] == 0).all() and torch.isneginf(lse[:, :, :200]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 200:]).all()
    check_against_reference(q, k, v, {"out": (out, lse)}, seed, causal=True)


def test_side_stream(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, d, dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    check_against_reference(q, k, v, {"out": (out, lse)}, seed, causal=True)


def test_cuda_graph_capture(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 512, 700, 8, 2, d, dtype)
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        flash3.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    for _ in range(2):  # new inputs in place, replay
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        check_against_reference(q, k, v, {"out": (out, lse)}, seed, causal=True)


def test_torch_compile_fullgraph(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 256, 384, 4, 2, d, dtype)

    @torch.compile(fullgraph=True)
    def attend(q, k, v):
        return flash3.flash_attn_func(q * 1.0, k, v, causal=True, return_lse=True)

    out, lse = attend(q, k, v)
    check_against_reference(q, k, v, {"out": (out, lse)}, seed, causal=True)


def test_fast_path_equals_the_op(seed):
    # flash_attn_func skips torch's dispatcher when nothing could intercept the
    # op (host overhead); both paths must run the same launch.
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 300, 400, 8, 2, d, dtype)
    assert ops._can_skip_dispatcher(q, k, v)
    fast = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    via_op = ops._fwd_op(q, k, v, None, True)
    assert torch.equal(fast[0], via_op[0]) and torch.equal(fast[1], via_op[1])
    # Without return_lse the fast path passes no LSE buffer; out must not change.
    assert torch.equal(flash3.flash_attn_func(q, k, v, causal=True), via_op[0])

    q.requires_grad_()
    assert not ops._can_skip_dispatcher(q, k, v)
    with torch.no_grad():
        assert ops._can_skip_dispatcher(q, k, v)


def test_dispatch_modes_see_the_op(seed):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 64, 64, 2, 2, d, dtype)
    with Record() as record:
        flash3.flash_attn_func(q, k, v)
    assert "flash3.fwd.default" in record.ops, record.ops


# ---- bad input that needs CUDA tensors ---------------------------------------


def test_bad_inputs_name_the_argument():
    dtype_name, dtype, d = _any_built()
    q, k, v = make_qkv(2, 64, 64, 4, 2, d, dtype)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    cases = [
        ((q, k.to(other), v), flash3.Flash3InvalidArgument, rf"k: dtype must equal q's \({dtype}\); got {other}"),
        ((q, k, v.to(other)), flash3.Flash3InvalidArgument, r"v: dtype must equal q's"),
        ((q.float(), k, v), flash3.Flash3InvalidArgument,
         r"q: dtype must be torch.float16 or torch.bfloat16; got torch.float32"),
        ((q, k[:1], v[:1]), flash3.Flash3InvalidArgument, r"k: batch must equal q's \(2\); got 1"),
        ((q, k.cpu(), v), flash3.Flash3InvalidArgument, r"k: must be on q's device \(cuda:0\); got cpu"),
        ((q.cpu(), k, v), flash3.Flash3InvalidArgument, r"q: must be a CUDA tensor; got device cpu"),
        # From the library:
        ((q[:, :, :3], k, v), flash3.Flash3InvalidArgument,
         r"num_heads_q \(3\) must be divisible by num_heads_kv \(2\)"),
        (tuple(torch.randn(2, 64, h, 48, dtype=dtype, device="cuda") for h in (4, 2, 2)),
         flash3.Flash3Unsupported, r"head_dim.*48"),
        ((q, k, v[..., :d // 2]), flash3.Flash3Unsupported,
         rf"head_dim_v: differs from head_dim only as \(head_dim, head_dim_v\) = \(192, 128\); "
         rf"got \({d}, {d // 2}\)"),
        ((q, k, v[:, :32]), flash3.Flash3InvalidArgument,
         r"v: shape must equal k's \(2, 64, 2, \d+\) but for the last \(head\) dim; got \(2, 32,"),
        ((torch.randn(2, 64, 4, 2 * d, dtype=dtype, device="cuda")[..., ::2], k, v),
         flash3.Flash3InvalidArgument, r"q: head_dim stride must be 1.*got 2"),
        ((_misaligned_like(q), k, v), flash3.Flash3InvalidArgument, r"q: data pointer must be 16-byte aligned"),
    ]
    for args, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            flash3.flash_attn_func(*args)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"softmax_scale.*got -0\.5"):
        flash3.flash_attn_func(q, k, v, softmax_scale=-0.5)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"window_left must be >= -1.*got -2"):
        flash3.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"window_right must be -1 or 0 with causal"):
        flash3.flash_attn_func(q, k, v, causal=True, window_size=(8, 8))
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"softcap must be finite and >= 0.*got -1"):
        flash3.flash_attn_func(q, k, v, softcap=-1.0)
    torch.cuda.synchronize()  # nothing was launched on bad input; the context is healthy


def _misaligned_like(x):
    """Same shape and strides as x, data pointer 2 bytes past a 16-byte boundary."""
    storage = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
    return storage[1:1 + x.numel()].view(x.shape).copy_(x)
