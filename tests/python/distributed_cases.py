"""Worker of the multi-process context-parallel tests (spawned by
test_distributed_gloo.py; a module of its own so spawned processes import it).

Every rank builds the same full inputs from the same seed, runs
flash3.distributed.ring_attention on its shard with the reference backend,
and compares its shard of out, lse and the gradients with single-process
reference attention (autograd through flash3.reference.attention_ref)."""

import torch
import torch.distributed as dist

from flash3.distributed import ReferenceBackend, ring_attention, shard_sequence
from flash3.reference import attention_ref

# (strategy, causal, layout, heads_q, heads_kv): GQA everywhere; for the
# all_to_all strategy at 4 ranks the 2 KV heads do not divide the group and
# take the repeated-KV path.
CASES = [
    (strategy, causal, layout, 4, 2)
    for strategy in ("ring", "all_to_all")
    for causal in (False, True)
    for layout in (("zigzag", "contiguous") if causal else ("zigzag",))
]
CASES.append(("ring", True, "zigzag", 3, 1))  # MQA, heads not divisible by the group

# fp32 rounding: the sharded computation adds the same terms in another order.
TOLERANCE = dict(rtol=1e-5, atol=2e-6)

def _check(rank, world_size, seed, strategy, causal, layout, heads_q, heads_kv):
    generator = torch.Generator().manual_seed(seed)
    batch, seqlen, head_dim = 2, 16 * world_size, 8

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    q = randn(batch, seqlen, heads_q, head_dim).requires_grad_()
    k = randn(batch, seqlen, heads_kv, head_dim).requires_grad_()
    v = randn(batch, seqlen, heads_kv, head_dim).requires_grad_()
    dout = randn(batch, seqlen, heads_q, head_dim)
    want_out, want_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.4)
    want_grads = torch.autograd.grad(want_out, (q, k, v), dout)

    def shard(x):
        return shard_sequence(x.detach(), rank, world_size, layout)

    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse = ring_attention(*local, causal=causal, softmax_scale=0.4, strategy=strategy,
                              layout=layout, return_lse=True, backend=ReferenceBackend())
    grads = torch.autograd.grad(out, local, shard(dout))
    what = f"rank {rank}/{world_size} {strategy} causal={causal} {layout} hq={heads_q} hkv={heads_kv}"
    torch.testing.assert_close(out, shard(want_out), **TOLERANCE, msg=lambda m: f"out, {what}: {m}")
    want_lse_shard = shard(want_lse.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(lse, want_lse_shard, **TOLERANCE, msg=lambda m: f"lse, {what}: {m}")
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        torch.testing.assert_close(g, shard(w), **TOLERANCE, msg=lambda m: f"{name}, {what}: {m}")

def _check_group_size_errors(world_size):
    ref = ReferenceBackend()
    q, k = torch.randn(1, 8, 3, 16), torch.randn(1, 8, 1, 16)
    try:
        ring_attention(q, k, k, strategy="all_to_all", backend=ref)
    except ValueError as e:
        assert f"heads_q (3) divisible by the group size ({world_size})" in str(e), e
    else:
        raise AssertionError("all_to_all with 3 heads did not raise")
    try:
        ring_attention(q[:, :7], k[:, :7], k[:, :7], causal=True, backend=ref)
    except ValueError as e:
        assert "local sequence length must be even, got 7" in str(e), e
    else:
        raise AssertionError("zigzag with an odd shard did not raise")


def run(rank, world_size, init_file, seed):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        for case in CASES:
            _check(rank, world_size, seed, *case)
        _check_group_size_errors(world_size)
    finally:
        dist.destroy_process_group()
