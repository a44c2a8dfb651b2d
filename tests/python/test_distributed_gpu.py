"""flash3.distributed on one GPU: a group of one rank goes through the same
code path (strategy dispatch, autograd Function, flash3 backend) and must give
flash_attn_func's output, LSE and (deterministic) gradients bitwise.
Multi-GPU runs are the device issue's (issue 10).

Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402
from flash3.distributed import Flash3Backend, ring_attention  # noqa: E402

from attention_checks import _any_built, make_qkv  # noqa: E402


@pytest.mark.parametrize("strategy", ["ring", "all_to_all"])
@pytest.mark.parametrize("causal", [False, True])
def test_world_size_one_is_flash_attn_func_bitwise(group_of_one, strategy, causal, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 333, 333, 4, 2, d, dtype)
    dout = torch.randn_like(q)

    def run(attention):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = attention(*leaves)
        grads = torch.autograd.grad(out, leaves, dout)
        return (out, lse, *grads)

    want = run(lambda *x: flash3.flash_attn_func(*x, causal=causal, return_lse=True,
                                                 deterministic=True))
    got = run(lambda *x: ring_attention(*x, group_of_one, causal=causal, strategy=strategy,
                                        return_lse=True,
                                        backend=Flash3Backend(deterministic=True)))
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), f"{name} differs (seed {seed})"
