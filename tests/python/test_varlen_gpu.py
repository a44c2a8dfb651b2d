"""Varlen forward numerics on the GPU: packed sequences of different lengths
(0 included) against the fp32 reference run on each sequence alone, by the
rule of DESIGN.md 3, on the public call and on the launch path into
NaN-poisoned buffers (so an unwritten row fails, and a row written outside
its sequence shows). Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import itertools

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3 import ops  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from attention_checks import (  # noqa: E402
    ALL_HEAD_DIMS, DTYPES, MASKS, SINK_MASKS, _any_built, _where, assert_rule,
    head_dim_id, make_sinks, mask_id, out_shape, require_built, split_head_dim)

GQA_RATIOS = (1, 2, 8)
HEADS_KV = 2

# (seqlen_q, seqlen_k) per sequence: lengths that are multiples of no tile,
# both orders of unequal lengths, sequences without queries or without keys
# between others, one longer than a tile row of CTAs.
SHORT = [(17, 17), (0, 5), (113, 255), (255, 113), (1, 1), (128, 128), (5, 0), (799, 801)]
LONG = [(2049, 2049), (1, 300), (1023, 4097), (0, 0), (3000, 1000)]


def pack(lengths, heads_q, heads_kv, head_dim, dtype):
    """Random packed q, k, v and int32 cu_seqlens for `lengths`; `head_dim`
    an int or a (head_dim, head_dim_v) pair."""
    d, dv = split_head_dim(head_dim)
    total_q = sum(sq for sq, _ in lengths)
    total_k = sum(sk for _, sk in lengths)
    q = torch.randn(total_q, heads_q, d, dtype=dtype, device="cuda")
    k = torch.randn(total_k, heads_kv, d, dtype=dtype, device="cuda")
    v = torch.randn(total_k, heads_kv, dv, dtype=dtype, device="cuda")
    cu_q, cu_k = ([0] + list(itertools.accumulate(n)) for n in zip(*lengths))
    as_int32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    return q, k, v, as_int32(cu_q), as_int32(cu_k)


def reference(q, k, v, spans, upcast, **kwargs):
    """attention_ref on each sequence alone; spans: ((q0, q1), (k0, k1)) per
    sequence. Returns packed out and (heads_q, total_q) lse; rows in no span
    are NaN."""
    out = torch.full(out_shape(q, v), float("nan"), dtype=torch.float32 if upcast else q.dtype,
                     device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
    for (q0, q1), (k0, k1) in spans:
        if q1 == q0:
            continue
        o, l = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], upcast=upcast,
                             **kwargs)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse


def spans_of(lengths, seqused=None):
    cu_q = [0] + list(itertools.accumulate(sq for sq, _ in lengths))
    cu_k = [0] + list(itertools.accumulate(sk for _, sk in lengths))
    used_q, used_k = seqused or ([sq for sq, _ in lengths], [sk for _, sk in lengths])
    return [((cu_q[b], cu_q[b] + used_q[b]), (cu_k[b], cu_k[b] + used_k[b]))
            for b in range(len(lengths))]


def run_poisoned(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, window_size=(-1, -1),
                 softcap=0.0, sinks=None, seqused_q=None, seqused_k=None):
    out = torch.full(out_shape(q, v), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
    ops._launch(q, k, v, out, lse, None, causal, *ops._abi_window(window_size), softcap, sinks,
                varlen=(cu_q, cu_k, seqused_q, seqused_k, max_q, max_k))
    return out, lse


def check(lengths, q, k, v, cu_q, cu_k, seed, seqused=None, **mask):
    """Both paths against the per-sequence reference; rows in no sequence must
    stay NaN in the poisoned buffers."""
    spans = spans_of(lengths, seqused)
    max_q = max(q1 - q0 for (q0, q1), _ in spans)
    max_k = max(k1 - k0 for _, (k0, k1) in spans)
    used = {}
    if seqused is not None:
        used = dict(seqused_q=torch.tensor(seqused[0], dtype=torch.int32, device="cuda"),
                    seqused_k=torch.tensor(seqused[1], dtype=torch.int32, device="cuda"))
    results = {
        "flash_attn_varlen_func": flash3.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True, **used, **mask),
        "poisoned": run_poisoned(q, k, v, cu_q, cu_k, max_q, max_k, **used, **mask),
    }
    ref_out, ref_lse = reference(q, k, v, spans, True, **mask)
    lowp_out, lowp_lse = reference(q, k, v, spans, False, **mask)
    in_sequence = ~torch.isnan(ref_lse[0])  # (total_q,)
    # (heads, rows) that see no key: out 0, lse exactly -inf or the sink.
    without_sinks = {name: value for name, value in mask.items() if name != "sinks"}
    empty = torch.isneginf(reference(q, k, v, spans, True, **without_sinks)[1][:, in_sequence])
    ref_out, lowp_out = ref_out[in_sequence], lowp_out[in_sequence].float()
    ref_lse, lowp_lse = ref_lse[:, in_sequence], lowp_lse[:, in_sequence]
    for label, (out, lse) in results.items():
        where = f"[{label}] {_where(seed)}"
        assert out.shape == out_shape(q, v) and out.dtype == q.dtype, where
        assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32, where
        if label == "poisoned":
            assert torch.isnan(out[~in_sequence]).all(), f"out: a row in no sequence was written {where}"
            assert torch.isnan(lse[:, ~in_sequence]).all(), f"lse: a row in no sequence was written {where}"
        out, lse = out[in_sequence], lse[:, in_sequence]
        assert (out[empty.T] == 0).all(), f"out: rows that see no key are not 0 {where}"
        assert torch.equal(lse[empty], ref_lse[empty]), f"lse: rows that see no key {where}"
        assert_rule(f"out [{label}]", out.float(), ref_out, lowp_out, seed)
        assert_rule(f"lse [{label}]", lse[~empty], ref_lse[~empty], lowp_lse[~empty], seed)


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
def test_varlen_matches_reference(case, seed):
    dtype_name, head_dim, causal, ratio, which = case
    require_built(dtype_name, head_dim)
    lengths = SHORT if which == "short" else LONG
    q, k, v, cu_q, cu_k = pack(lengths, HEADS_KV * ratio, HEADS_KV, head_dim, DTYPES[dtype_name])
    check(lengths, q, k, v, cu_q, cu_k, seed, causal=causal)


@pytest.mark.parametrize("head_dim", ALL_HEAD_DIMS, ids=head_dim_id)
@pytest.mark.parametrize("mask", MASKS, ids=mask_id)
def test_varlen_windows_and_softcap(mask, head_dim, seed):
    dtype_name, dtype, _ = _any_built()
    require_built(dtype_name, head_dim)
    causal, window_size, softcap = mask
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    check(SHORT, q, k, v, cu_q, cu_k, seed, causal=causal, window_size=window_size,
          softcap=softcap)


@pytest.mark.parametrize("mask", SINK_MASKS, ids=mask_id)
def test_varlen_sinks(mask, seed):
    dtype_name, dtype, head_dim = _any_built()
    causal, window_size, softcap = mask
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    check(SHORT, q, k, v, cu_q, cu_k, seed, causal=causal, window_size=window_size,
          softcap=softcap, sinks=make_sinks(4, 255))


@pytest.mark.parametrize("causal", (False, True))
def test_varlen_seqused(causal, seed):
    """seqused: only the first rows of each sequence's span are used; the rest
    of q's span stays unwritten and the rest of k's is not seen."""
    dtype_name, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    used_q = [max(0, sq - 7) for sq, _ in SHORT]
    used_k = [sk // 2 for _, sk in SHORT]
    check(SHORT, q, k, v, cu_q, cu_k, seed, seqused=(used_q, used_k), causal=causal)


def test_varlen_without_keys_and_without_queries(seed):
    dtype_name, dtype, head_dim = _any_built()
    lengths = [(5, 0), (130, 0)]  # total_k = 0: every row sees no key
    q, k, v, cu_q, cu_k = pack(lengths, 4, 2, head_dim, dtype)
    sinks = make_sinks(4, 1)
    out, lse = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 0, sinks=sinks,
                                             return_lse=True)
    assert (out == 0).all() and torch.equal(lse, sinks[:, None].expand_as(lse)), _where(seed)
    q, k, v, cu_q, cu_k = pack([(0, 7), (0, 3)], 4, 2, head_dim, dtype)  # total_q = 0: no-op
    out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 7)
    assert out.shape == (0, 4, head_dim)


def test_varlen_equals_fixed_length_batch(seed):
    """Equal lengths packed give what flash_attn_func gives on the batch: the
    same kernels' arithmetic, so the same bits."""
    dtype_name, dtype, head_dim = _any_built()
    q, k, v = (torch.randn(3, 300, 4, head_dim, dtype=dtype, device="cuda") for _ in range(3))
    cu = torch.arange(0, 901, 300, dtype=torch.int32, device="cuda")
    for causal in (False, True):
        fixed = flash3.flash_attn_func(q, k, v, causal=causal)
        packed = flash3.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                               cu, cu, 300, 300, causal=causal)
        assert torch.equal(packed.view_as(fixed), fixed), _where(seed)


def test_varlen_opcheck(seed):
    _, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    # Every row in a sequence (SHORT's spans cover q), so repeated runs compare equal.
    torch.library.opcheck(torch.ops.flash3.fwd_varlen.default,
                          (q, k, v, cu_q, cu_k, 799, 801, None, True))


def test_varlen_under_compile_and_cuda_graph(seed):
    _, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    attend = lambda q, k, v: flash3.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cu_q, cu_k, 799, 801, causal=True)
    with torch.no_grad():
        want = attend(q, k, v)
        compiled = torch.compile(attend, fullgraph=True)
        assert torch.equal(compiled(q, k, v), want), _where(seed)
        graph = torch.cuda.CUDAGraph()
        static_out = attend(q, k, v)  # warm-up outside capture
        with torch.cuda.graph(graph):
            static_out = attend(q, k, v)
        q.copy_(torch.randn_like(q))
        graph.replay()
        assert torch.equal(static_out, attend(q, k, v)), _where(seed)


def test_varlen_direct_launch_equals_the_op(seed):
    """flash_attn_varlen_func skips the dispatcher when nothing needs it: the
    same bits as the op, with and without lse."""
    _, dtype, head_dim = _any_built()
    q, k, v, cu_q, cu_k = pack(SHORT, 4, 2, head_dim, dtype)
    want_out, want_lse = torch.ops.flash3.fwd_varlen(q, k, v, cu_q, cu_k, 799, 801, None, True)
    out, lse = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 799, 801, causal=True,
                                             return_lse=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse), _where(seed)
    assert torch.equal(flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 799, 801, causal=True),
                       want_out), _where(seed)
