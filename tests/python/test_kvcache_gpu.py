"""KV-cache attention and split-KV on the GPU: flash_attn_with_kvcache over
plain and paged caches (per-batch lengths including 0 and the full cache,
left padding, a batch index, GQA, masks, sinks, num_splits 1 / 3 / chosen)
against the fp32 reference run on each batch entry's keys alone, by the rule
of DESIGN.md 3; flash_attn_combine against the merge in torch; and a decode
step captured in a CUDA graph. Skips unless a Hopper (sm_90) GPU is visible.
"""

import math

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from attention_checks import (DTYPES, HEAD_DIMS, _where, assert_rule,  # noqa: E402
                              make_alibi_slopes, make_sinks, require_built)

SPLITS = (1, 3, 0)
# (causal, window_size)
MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (100, 0)), (True, (37, -1))]


def entry_keys(cache, b, seqlens, leftpad, batch_idx, page_table):
    """Batch entry b's keys (1, n, heads_kv, d), as the cache holds them."""
    end = int(seqlens[b])
    start = 0 if leftpad is None else int(leftpad[b])
    if page_table is None:
        entry = b if batch_idx is None else int(batch_idx[b])
        return cache[entry, start:end].unsqueeze(0)
    page_size = cache.shape[1]
    keys = torch.arange(end, device=cache.device)
    pages = page_table[b, keys // page_size].long()
    return cache[pages, keys % page_size].unsqueeze(0)


def entry_rows(q, out, lse, b, cu_seqlens_q):
    """Batch entry b's q, out (1, n, heads, d) and lse (1, heads, n); with
    cu_seqlens_q, sequence b's rows of the packed q, out and lse."""
    if cu_seqlens_q is None:
        return q[b:b + 1], out[b:b + 1], lse[b:b + 1]
    rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
    return q[rows].unsqueeze(0), out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0)


def check(q, k_cache, v_cache, seqlens, out, lse, seed, leftpad=None, batch_idx=None,
          page_table=None, causal=False, window_size=(-1, -1), sinks=None, cu_seqlens_q=None,
          alibi_slopes=None):
    for b in range(seqlens.shape[0]):
        q_b, out_b, lse_b = entry_rows(q, out, lse, b, cu_seqlens_q)
        if q_b.shape[1] == 0:
            continue
        k = entry_keys(k_cache, b, seqlens, leftpad, batch_idx, page_table)
        v = entry_keys(v_cache, b, seqlens, leftpad, batch_idx, page_table)
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        kwargs = dict(causal=causal, window_size=window_size, sinks=sinks, alibi_slopes=slopes)
        ref, ref_lse = attention_ref(q_b, k, v, **kwargs)
        lowp, lowp_lse = attention_ref(q_b, k, v, upcast=False, **kwargs)
        assert_rule(f"out[{b}]", out_b, ref, lowp, seed)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse_b), finite), f"lse[{b}] -inf rows {_where(seed)}"
        assert_rule(f"lse[{b}]", lse_b[finite], ref_lse[finite], lowp_lse[finite], seed)


def random_cache(batch_cache, capacity, heads_kv, head_dim, dtype):
    # Finite everywhere, past each entry's length too (flash_attn_with_kvcache's rule).
    return (torch.randn(batch_cache, capacity, heads_kv, head_dim, dtype=dtype, device="cuda"),
            torch.randn(batch_cache, capacity, heads_kv, head_dim, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("seqlen_q, heads_q, heads_kv", [(1, 32, 8), (17, 4, 4), (130, 8, 1)])
def test_plain_cache(seed, dtype_name, head_dim, num_splits, mask, seqlen_q, heads_q, heads_kv):
    require_built(dtype_name, head_dim)
    dtype = DTYPES[dtype_name]
    causal, window_size = mask
    batch, capacity = 5, 1000
    k_cache, v_cache = random_cache(batch + 2, capacity, heads_kv, head_dim, dtype)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    seqlens = torch.tensor([capacity, 0, 1, 513, 777], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([0, 0, 0, 100, 776], dtype=torch.int32, device="cuda")
    batch_idx = torch.tensor([6, 0, 3, 2, 1], dtype=torch.int32, device="cuda")
    out, lse = flash3.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, cache_leftpad=leftpad,
        cache_batch_idx=batch_idx, causal=causal, window_size=window_size,
        num_splits=num_splits, return_lse=True)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, leftpad=leftpad, batch_idx=batch_idx,
          causal=causal, window_size=window_size)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
# 128 (d <= 128) and 80 (d 256) hold whole key blocks: one TMA box per block.
@pytest.mark.parametrize("page_size", [16, 48, 80, 128, 256])
@pytest.mark.parametrize("num_splits", SPLITS)
def test_paged_cache(seed, head_dim, page_size, num_splits):
    require_built("bf16", head_dim)
    batch, heads_q, heads_kv, capacity = 4, 16, 4, 1500
    pages_per_entry = math.ceil(capacity / page_size)
    num_pages = batch * pages_per_entry + 3
    k_cache, v_cache = random_cache(num_pages, page_size, heads_kv, head_dim, torch.bfloat16)
    page_table = torch.randperm(num_pages, device="cuda")[:batch * pages_per_entry]
    page_table = page_table.view(batch, pages_per_entry).to(torch.int32)
    q = torch.randn(batch, 3, heads_q, head_dim, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.tensor([1, page_size, 1499, 800], dtype=torch.int32, device="cuda")
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              page_table=page_table, causal=True,
                                              num_splits=num_splits, return_lse=True)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, page_table=page_table, causal=True)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("pack_gqa", [None, True, False])
@pytest.mark.parametrize("paged", [False, True])
def test_varlen_q(seed, head_dim, num_splits, mask, pack_gqa, paged):
    # Sequences of 1, 0, 7, 130 and 3 queries (speculative decoding, chunked
    # prefill) over caches of 1000, 0, 1, 513 and 999 keys; q, out and lse
    # packed.
    require_built("bf16", head_dim)
    causal, window_size = mask
    heads_q, heads_kv, capacity = 8, 2, 1000
    lengths = [1, 0, 7, 130, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    total_q = int(cu[-1])
    seqlens = torch.tensor([capacity, 0, 1, 513, 999], dtype=torch.int32, device="cuda")
    batch = len(lengths)
    page_table = None
    if paged:
        page_size = 16
        pages = math.ceil(capacity / page_size)
        k_cache, v_cache = random_cache(batch * pages + 1, page_size, heads_kv, head_dim,
                                        torch.bfloat16)
        page_table = torch.randperm(batch * pages + 1, device="cuda")[:batch * pages]
        page_table = page_table.view(batch, pages).to(torch.int32)
    else:
        k_cache, v_cache = random_cache(batch, capacity, heads_kv, head_dim, torch.bfloat16)
    q = torch.randn(total_q, heads_q, head_dim, dtype=torch.bfloat16, device="cuda")
    out, lse = flash3.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, page_table=page_table, cu_seqlens_q=cu,
        max_seqlen_q=max(lengths), causal=causal, window_size=window_size,
        num_splits=num_splits, pack_gqa=pack_gqa, return_lse=True)
    assert out.shape == q.shape and lse.shape == (heads_q, total_q)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, page_table=page_table, causal=causal,
          window_size=window_size, cu_seqlens_q=cu)


@pytest.mark.parametrize("pack_gqa", [True, False])
@pytest.mark.parametrize("seqlen_q", [1, 200])
def test_pack_gqa_forced(seed, pack_gqa, seqlen_q):
    # The automatic choice packs decode (seqlen_q 1) and not 200 queries;
    # forcing the other way must give the same attention.
    require_built("bf16", 128)
    batch, heads_q, heads_kv = 2, 16, 4
    k_cache, v_cache = random_cache(batch, 700, heads_kv, 128, torch.bfloat16)
    q = torch.randn(batch, seqlen_q, heads_q, 128, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.tensor([700, 301], dtype=torch.int32, device="cuda")
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              causal=True, pack_gqa=pack_gqa, return_lse=True)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, causal=True)


@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("varlen", [False, True])
def test_alibi(seed, num_splits, varlen):
    # Per-entry slopes; PackGQA's rows (decode) take their own head's slope.
    require_built("bf16", 128)
    batch, heads_q, heads_kv = 3, 8, 2
    k_cache, v_cache = random_cache(batch, 900, heads_kv, 128, torch.bfloat16)
    seqlens = torch.tensor([900, 0, 333], dtype=torch.int32, device="cuda")
    slopes = make_alibi_slopes(heads_q, batch)
    if varlen:
        q = torch.randn(1 + 0 + 40, heads_q, 128, dtype=torch.bfloat16, device="cuda")
        cu = torch.tensor([0, 1, 1, 41], dtype=torch.int32, device="cuda")
        extra = dict(cu_seqlens_q=cu, max_seqlen_q=40)
    else:
        q = torch.randn(batch, 1, heads_q, 128, dtype=torch.bfloat16, device="cuda")
        cu, extra = None, {}
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              causal=True, alibi_slopes=slopes,
                                              num_splits=num_splits, return_lse=True, **extra)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, causal=True, cu_seqlens_q=cu,
          alibi_slopes=slopes)


@pytest.mark.parametrize("num_splits", SPLITS)
def test_sinks_with_splits(seed, num_splits):
    require_built("bf16", 128)
    batch, heads_q, heads_kv = 3, 8, 2
    k_cache, v_cache = random_cache(batch, 2000, heads_kv, 128, torch.bfloat16)
    q = torch.randn(batch, 1, heads_q, 128, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.tensor([2000, 0, 333], dtype=torch.int32, device="cuda")
    sinks = make_sinks(heads_q, 1000)
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              sinks=sinks, num_splits=num_splits,
                                              return_lse=True)
    check(q, k_cache, v_cache, seqlens, out, lse, seed, sinks=sinks)


def test_splits_agree_with_no_split(seed):
    # The same problem split 1..7 ways and chosen: every result passes the rule
    # above; here they must also agree closely with each other.
    require_built("bf16", 128)
    k_cache, v_cache = random_cache(1, 8192, 8, 128, torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    whole = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=1).float()
    for splits in (2, 3, 7, 0):
        split = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=splits).float()
        assert (split - whole).abs().max().item() <= 2e-2, f"num_splits={splits} {_where(seed)}"


# Head dims 32-256 (2, 4, 8 values per lane); split counts below, at and past
# the kernel's splits in flight per head dim (32, 16, 8) and past 32.
@pytest.mark.parametrize("splits,head_dim", [(1, 32), (5, 96), (40, 64), (20, 128), (16, 128),
                                             (70, 256)])
def test_combine_matches_torch(seed, splits, head_dim):
    batch, seqlen, heads = 2, 3, 4
    out_partial = torch.randn(splits, batch, seqlen, heads, head_dim, device="cuda")
    lse_partial = 3 * torch.randn(splits, batch, seqlen, heads, device="cuda")
    for empty in {splits // 2, splits - 1} - ({0} if splits == 1 else set()):
        lse_partial[empty] = -math.inf  # a split that saw no key: its output must not be read
        out_partial[empty] = math.nan
    lse_partial[:, 0, 0, 0] = -math.inf  # a row no split saw a key of
    out, lse = flash3.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.float32,
                                         return_lse=True)
    ref_lse = torch.logsumexp(lse_partial, dim=0)  # (b, s, h)
    weights = torch.exp(lse_partial - ref_lse).nan_to_num(0.0)
    ref = (weights.unsqueeze(-1) * out_partial.nan_to_num(0.0)).sum(0)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5), _where(seed)
    assert torch.equal(lse.transpose(1, 2).isneginf(), ref_lse.isneginf())
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse.transpose(1, 2)[finite], ref_lse[finite], atol=1e-5)
    assert torch.all(out[0, 0, 0] == 0)


def test_cuda_graph_decode_step(seed):
    require_built("bf16", 128)
    k_cache, v_cache = random_cache(2, 4096, 8, 128, torch.bfloat16)
    q = torch.randn(2, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.tensor([100, 4000], dtype=torch.int32, device="cuda")

    def step():
        return flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                              causal=True, return_lse=True)

    step()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    q.copy_(torch.randn_like(q))
    seqlens.copy_(torch.tensor([4096, 7], dtype=torch.int32))
    out.fill_(math.nan)
    graph.replay()
    check(q, k_cache, v_cache, seqlens, out, lse, seed, causal=True)
