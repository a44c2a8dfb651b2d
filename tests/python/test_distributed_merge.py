"""The log-sum-exp merge, the layouts and the reference backend of
flash3.distributed, on the CPU (no process group needed)."""

import pytest

torch = pytest.importorskip("torch")

from flash3.distributed import ReferenceBackend, merge_into  # noqa: E402
from flash3.distributed.layout import global_order, shard_sequence, unshard_sequence  # noqa: E402
from flash3.distributed.merge import empty_partial  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402


def _qkv(seqlen_q=12, seqlen_k=20, heads_q=4, heads_kv=2, head_dim=8, batch=2):
    return (torch.randn(batch, seqlen_q, heads_q, head_dim),
            torch.randn(batch, seqlen_k, heads_kv, head_dim),
            torch.randn(batch, seqlen_k, heads_kv, head_dim))


@pytest.mark.parametrize("splits", [(20,), (7, 13), (1, 5, 6, 8)])
def test_merge_over_key_splits_equals_attention_over_all_keys(splits, seed):
    q, k, v = _qkv()
    want_out, want_lse = attention_ref(q, k, v)
    out, lse = empty_partial(q)
    for keys in torch.arange(k.shape[1]).split(list(splits)):
        merge_into(out, lse, *attention_ref(q, k[:, keys], v[:, keys]))
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


def test_merge_is_stable_at_large_logits(seed):
    # Scores around 1e4: exp of them overflows fp32, differences do not. At
    # that magnitude fp32 itself is off by ~1e-3 relative in exp(lse_i - lse),
    # so the merge is judged against fp64 by the error fp32 attention over all
    # keys has (the DESIGN.md rule, fp32 in the role of the low precision).
    q, k, v = _qkv()
    q = q * 3e3
    want_out, want_lse = attention_ref(q.double(), k.double(), v.double(),
                                       compute_dtype=torch.float64)
    fp32_out, fp32_lse = attention_ref(q, k, v)
    out, lse = empty_partial(q)
    for keys in (slice(0, 9), slice(9, None)):
        merge_into(out, lse, *attention_ref(q, k[:, keys], v[:, keys]))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    for got, fp32, want in ((out, fp32_out, want_out), (lse, fp32_lse, want_lse)):
        err = (got.double() - want).abs().max().item()
        base = (fp32.double() - want).abs().max().item()
        assert err <= 2 * base + 1e-5, f"merge error {err:.3e}, fp32 attention's {base:.3e}"


def test_merge_of_rows_that_saw_no_key():
    q, k, v = _qkv()
    out, lse = empty_partial(q)
    empty_out, empty_lse = empty_partial(q)
    merge_into(out, lse, empty_out, empty_lse)
    assert (out == 0).all() and torch.isneginf(lse).all()
    # A block where only some rows saw keys: the others keep 0 / -inf.
    block_out, block_lse = attention_ref(q, k, v)
    block_out[:, 3:] = 0
    block_lse[:, :, 3:] = float("-inf")
    merge_into(out, lse, block_out, block_lse)
    torch.testing.assert_close(out[:, :3], block_out[:, :3])
    assert (out[:, 3:] == 0).all() and torch.isneginf(lse[:, :, 3:]).all()


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_and_unshard_are_inverse(layout, world_size):
    x = torch.randn(2, 24, 3, 4)
    shards = [shard_sequence(x, r, world_size, layout) for r in range(world_size)]
    assert all(s.shape[1] == 24 // world_size for s in shards)
    assert torch.equal(unshard_sequence(shards, layout), x)
    positions = torch.arange(24).view(1, 24, 1, 1).float()
    gathered = torch.cat([shard_sequence(positions, r, world_size, layout)
                          for r in range(world_size)], dim=1)
    assert torch.equal(gathered.view(-1).long(), global_order(layout, world_size, 24))


def test_zigzag_layout_balances_causal_work():
    world_size, seqlen = 4, 64
    visible = torch.ones(seqlen, seqlen).tril()
    order = global_order("zigzag", world_size, seqlen).view(world_size, -1)
    work = [visible[rows].sum().item() for rows in order]
    assert work == [work[0]] * world_size
    assert order[0].tolist()[:8] == list(range(8)) and order[0].tolist()[8:] == list(range(56, 64))


def test_sharding_a_length_the_layout_cannot_split_names_it():
    with pytest.raises(ValueError, match="multiple of 8 for the zigzag layout over 4 ranks"):
        shard_sequence(torch.zeros(1, 12, 1, 1), 0, 4, "zigzag")
    with pytest.raises(ValueError, match="layout: expected one of"):
        shard_sequence(torch.zeros(1, 12, 1, 1), 0, 4, "striped")


@pytest.mark.parametrize("causal", [False, True])
def test_reference_backend_backward_matches_autograd(causal, seed):
    q, k, v = (t.requires_grad_() for t in _qkv(seqlen_q=12, seqlen_k=12))
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.3)
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = ReferenceBackend().backward(dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                      lse.detach(), causal, 0.3)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
