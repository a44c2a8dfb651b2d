"""Merging attention computed over disjoint key sets (the log-sum-exp rule).

If out_i, lse_i are attention of the same queries over key sets K_i, then over
the union: lse = log(sum_i exp(lse_i)) and out = sum_i exp(lse_i - lse) out_i.
Everything context parallelism combines goes through `merge_into`; it is
unit-tested on the CPU (tests/python/test_distributed_merge.py).
"""

import torch


def merge_into(out, lse, block_out, block_lse):
    """Folds one partial result into a running one, in place.

    out: (batch, seqlen, heads, head_dim) float32 running output; lse: (batch,
    heads, seqlen) float32 running log-sum-exp (natural log), -inf where no key
    has been seen yet. block_out / block_lse: the same for another key set, any
    floating dtype (converted to float32). Rows with -inf on both sides stay
    0 / -inf; no exp overflows whatever the magnitudes (only differences to
    the new maximum are exponentiated).
    """
    block_lse = block_lse.float()
    new_lse = torch.logaddexp(lse, block_lse)
    # A row that saw no key on either side has new_lse = -inf; its weights
    # would be exp(-inf - -inf) = nan. Give such rows weights 0.
    empty = torch.isneginf(new_lse)
    safe_lse = torch.where(empty, torch.zeros_like(new_lse), new_lse)
    keep = torch.exp(lse - safe_lse).masked_fill(empty, 0.0)
    take = torch.exp(block_lse - safe_lse).masked_fill(empty, 0.0)
    # (batch, heads, seqlen) weights -> (batch, seqlen, heads, 1) to scale out.
    out.mul_(keep.transpose(1, 2).unsqueeze(-1))
    out.add_(block_out.float() * take.transpose(1, 2).unsqueeze(-1))
    lse.copy_(new_lse)


def empty_partial(q):
    """The running (out, lse) of queries q before any key: 0 and -inf."""
    batch, seqlen, heads, head_dim = q.shape
    out = torch.zeros((batch, seqlen, heads, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((batch, heads, seqlen), float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse
