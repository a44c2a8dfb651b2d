"""Appending to the KV cache inside the attention kernel, on the GPU:
flash_attn_with_kvcache(k=, v=, rotary_cos=, rotary_sin=) over plain and
paged caches (odd cached lengths, 0, a full cache, an append that overflows
it, left padding, a batch index), interleaved and GPT-NeoX rotary of all or
part of the head dim, masks (a window that hides new keys from every query
included), GQA, num_splits 1 / 3 / chosen. Checks the cache rows the kernel
wrote against torch's rotation (1 ulp: the kernel rounds once from fp32),
that no other row changed, and the output against the fp32 reference over
the reference cache by the rule of DESIGN.md 3; and a decode step with
append captured in a CUDA graph. Skips unless a Hopper (sm_90) GPU is visible.
"""

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402

from attention_checks import DTYPES, HEAD_DIMS, require_built  # noqa: E402
from test_kvcache_gpu import check  # noqa: E402

SPLITS = (1, 3, 0)
# (rotary_dim as a fraction of head_dim (0: none), interleaved)
ROTARY = [(0, True), (1, True), (1, False), (0.5, False)]


def rotary_tables(seqlen, rotary_dim, dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    angles = torch.arange(seqlen, device="cuda").float()[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin, positions, interleaved):
    """x (n, heads, d) at positions (n,), its first 2 * cos.shape[1] dims
    rotated in fp32, as x's dtype."""
    if cos is None:
        return x
    dim = cos.shape[1] * 2
    c = cos[positions].float()[:, None, :]
    s = sin[positions].float()[:, None, :]
    r = x[..., :dim].float()
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
        rotated = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = r[..., :dim // 2], r[..., dim // 2:]
        rotated = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((rotated, x[..., dim:].float()), dim=-1).to(x.dtype)


def cache_rows(b, keys, batch_idx, page_table, page_size):
    """(entry, row) index tensors of batch entry b's keys in the cache."""
    if page_table is None:
        entry = b if batch_idx is None else int(batch_idx[b])
        return torch.full_like(keys, entry), keys
    return page_table[b, keys // page_size].long(), keys % page_size


def expected_cache(k_cache, v_cache, k, v, seqlens, cos, sin, interleaved, batch_idx, page_table):
    """The caches after the append, computed in torch: new key i of entry b
    (k[b], v[b]: (n_b, heads_kv, d), one per entry) at seqlens[b] + i,
    dropped past the capacity."""
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    page_size = k_cache.shape[1]
    capacity = page_size * (1 if page_table is None else page_table.shape[1])
    for b, (k_b, v_b) in enumerate(zip(k, v)):
        keys = int(seqlens[b]) + torch.arange(k_b.shape[0], device="cuda")
        kept = keys < capacity
        keys = keys[kept]
        entry, row = cache_rows(b, keys, batch_idx, page_table, page_size)
        k_ref[entry, row] = rotate(k_b[kept], cos, sin, keys, interleaved)
        v_ref[entry, row] = v_b[kept]
    return k_ref, v_ref


def assert_cache(name, got, ref, dtype):
    # Rotated values: torch rounds a*c, b*s and their sum, the kernel may fuse
    # them; one rounding to dtype from nearly the same fp32 value: <= 1 ulp.
    eps = torch.finfo(dtype).eps
    diff = (got.float() - ref.float()).abs()
    bound = eps * ref.float().abs()
    bad = (diff > bound).sum().item()
    assert bad == 0, f"{name}: {bad} values differ by more than 1 ulp; max diff {diff.max():.3e}"


def run_append(seed, dtype, head_dim, heads_q, heads_kv, seqlen_q, seqlen_new, cached, capacity,
               causal=False, window_size=(-1, -1), rotary=(0, True), num_splits=0,
               page_size=None, leftpad=None, batch_idx=None, q_lengths=None):
    """q_lengths: varlen q (seqlen_q, seqlen_new unused), sequence b's queries
    and new keys, k and v packed like q."""
    batch = len(cached)
    rotary_frac, interleaved = rotary
    if page_size is None:
        batch_cache = batch if batch_idx is None else int(max(batch_idx)) + 1
        k_cache = torch.randn(batch_cache, capacity, heads_kv, head_dim, dtype=dtype, device="cuda")
        page_table = None
    else:
        pages_per_entry = capacity // page_size
        num_pages = batch * pages_per_entry + 3
        k_cache = torch.randn(num_pages, page_size, heads_kv, head_dim, dtype=dtype, device="cuda")
        page_table = torch.randperm(num_pages, device="cuda")[:batch * pages_per_entry].view(
            batch, pages_per_entry).to(torch.int32)
    v_cache = torch.randn_like(k_cache)
    varlen = None
    if q_lengths is None:
        q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
        k = torch.randn(batch, seqlen_new, heads_kv, head_dim, dtype=dtype, device="cuda")
        entries = list(range(batch))  # indexes of q, k and v giving (n_b, heads, d)
        new_keys = torch.full((batch,), seqlen_new, dtype=torch.int32, device="cuda")
    else:
        cu = [0, *torch.tensor(q_lengths).cumsum(0).tolist()]
        varlen = dict(cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                      max_seqlen_q=max(q_lengths))
        q = torch.randn(cu[-1], heads_q, head_dim, dtype=dtype, device="cuda")
        k = torch.randn(cu[-1], heads_kv, head_dim, dtype=dtype, device="cuda")
        entries = [slice(cu[b], cu[b + 1]) for b in range(batch)]
        new_keys = torch.tensor(q_lengths, dtype=torch.int32, device="cuda")
    v = torch.randn_like(k)
    seqlens = torch.tensor(cached, dtype=torch.int32, device="cuda")
    cos = sin = None
    if rotary_frac:
        cos, sin = rotary_tables(capacity, int(head_dim * rotary_frac), dtype)
    k_ref, v_ref = expected_cache(k_cache, v_cache, [k[e] for e in entries],
                                  [v[e] for e in entries], seqlens, cos, sin, interleaved,
                                  batch_idx, page_table)
    out, lse = flash3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        cache_leftpad=leftpad, cache_batch_idx=batch_idx, page_table=page_table, causal=causal,
        window_size=window_size, rotary_interleaved=interleaved, num_splits=num_splits,
        return_lse=True, **(varlen or {}))
    assert_cache("k_cache", k_cache, k_ref, dtype)
    assert torch.equal(v_cache, v_ref), "v_cache: the appended values are copied exactly"
    # q as the kernel feeds it: rotated, rounded to dtype.
    if cos is not None:
        per_row = causal or window_size != (-1, -1)
        q_rot = torch.empty_like(q)
        for b in range(batch):
            n = q[entries[b]].shape[0]
            positions = int(seqlens[b]) + (torch.arange(n, device="cuda") if per_row
                                           else torch.zeros(n, dtype=torch.long, device="cuda"))
            q_rot[entries[b]] = rotate(q[entries[b]], cos, sin, positions.clamp(max=capacity - 1),
                                       interleaved)
        q = q_rot
    used = (seqlens + new_keys).clamp(max=capacity)
    check(q, k_ref, v_ref, used, out, lse, seed, leftpad=leftpad, batch_idx=batch_idx,
          page_table=page_table, causal=causal, window_size=window_size,
          cu_seqlens_q=None if varlen is None else varlen["cu_seqlens_q"])


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("rotary", ROTARY, ids=str)
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_new", [(1, 1), (5, 5), (1, 3)])
def test_append_decode(seed, dtype_name, rotary, num_splits, causal, seqlen_q, seqlen_new):
    require_built(dtype_name, 128)
    # Cached lengths: empty, odd, a block boundary, the cache filled exactly,
    # and one whose append runs past the capacity (the excess is dropped).
    run_append(seed, DTYPES[dtype_name], 128, 32, 8, seqlen_q, seqlen_new,
               cached=[0, 77, 256, 1000 - seqlen_new, 999], capacity=1000, causal=causal,
               rotary=rotary, num_splits=num_splits)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("rotary", ROTARY[1:3], ids=str)
@pytest.mark.parametrize("num_splits", SPLITS)
def test_append_paged(seed, head_dim, page_size, rotary, num_splits):
    require_built("bf16", head_dim)
    run_append(seed, torch.bfloat16, head_dim, 16, 4, 2, 2, cached=[0, 255, 511, 1022],
               capacity=1024 if page_size != 48 else 1056, causal=True, rotary=rotary,
               num_splits=num_splits, page_size=page_size)


@pytest.mark.parametrize("num_splits", SPLITS)
def test_append_leftpad_batch_idx(seed, num_splits):
    require_built("bf16", 128)
    leftpad = torch.tensor([0, 30, 499], dtype=torch.int32, device="cuda")
    batch_idx = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda")
    run_append(seed, torch.bfloat16, 128, 8, 8, 3, 3, cached=[10, 300, 500], capacity=700,
               causal=True, rotary=(1, True), num_splits=num_splits, leftpad=leftpad,
               batch_idx=batch_idx)


@pytest.mark.parametrize("window_size", [(2, 0), (40, 0)])
@pytest.mark.parametrize("num_splits", SPLITS)
def test_append_window(seed, window_size, num_splits):
    # (2, 0) with one query and 6 new keys: the first new keys are in no
    # query's window, and must still land in the cache.
    require_built("bf16", 128)
    run_append(seed, torch.bfloat16, 128, 32, 8, 1, 6, cached=[0, 129, 700], capacity=800,
               causal=True, window_size=window_size, rotary=(1, False), num_splits=num_splits)


def test_append_long_chunk(seed):
    # A prefill chunk: many new keys, several query blocks writing them.
    require_built("bf16", 128)
    run_append(seed, torch.bfloat16, 128, 8, 2, 300, 300, cached=[0, 1000], capacity=2048,
               causal=True, rotary=(1, False))


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", ROTARY[:3], ids=str)
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("causal", [False, True])
def test_append_varlen_q(seed, paged, rotary, num_splits, causal):
    # Chunked prefill and speculative decoding in one batch: sequences of 1,
    # 0, 7, 130 and 3 queries each bring as many new keys (k, v packed like
    # q) onto caches of 0, 5, 129, 600 and 1022 keys; the last one's append
    # runs past the capacity (1024), and the empty sequence appends nothing.
    require_built("bf16", 128)
    run_append(seed, torch.bfloat16, 128, 16, 4, None, None, cached=[0, 5, 129, 600, 1022],
               capacity=1024, causal=causal, rotary=rotary, num_splits=num_splits,
               page_size=16 if paged else None, q_lengths=[1, 0, 7, 130, 3])


def test_append_decode_step_in_cuda_graph(seed):
    require_built("bf16", 128)
    dtype = torch.bfloat16
    batch, capacity, heads_kv, head_dim = 2, 512, 8, 128
    k_cache = torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    cos, sin = rotary_tables(capacity, head_dim, dtype)
    q = torch.randn(batch, 1, 32, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(batch, 1, heads_kv, head_dim, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    seqlens = torch.tensor([5, 300], dtype=torch.int32, device="cuda")

    def step():
        out = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, rotary_cos=cos,
                                             rotary_sin=sin, cache_seqlens=seqlens, causal=True,
                                             rotary_interleaved=False)
        seqlens.add_(1)
        return out

    k_graph, v_graph = k_cache.clone(), v_cache.clone()
    eager = [step().clone() for _ in range(3)]
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    k_cache.copy_(k_graph)
    v_cache.copy_(v_graph)
    seqlens.copy_(torch.tensor([5, 300], dtype=torch.int32))
    step()  # warm-up outside the capture
    k_cache.copy_(k_graph)
    v_cache.copy_(v_graph)
    seqlens.copy_(torch.tensor([5, 300], dtype=torch.int32))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    k_cache.copy_(k_graph)
    v_cache.copy_(v_graph)
    seqlens.copy_(torch.tensor([5, 300], dtype=torch.int32))
    for i in range(3):
        graph.replay()
        assert torch.equal(out, eager[i]), f"replay {i} differs from the eager step"
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)
