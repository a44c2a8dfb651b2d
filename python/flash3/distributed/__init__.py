"""Context-parallel attention over the ranks of a torch.distributed group.

    out = flash3.distributed.ring_attention(q, k, v, group, causal=True)

q, k, v are this rank's shards of the sequence (dim 1) in the layout of
`layout.py` ("zigzag" by default, which balances causal work; use
`shard_sequence` / `unshard_sequence` to go between full tensors and
shards). The result is this rank's shard of attention over the whole
sequence, differentiable in q, k, v. Works with NCCL on GPUs (flash3 kernels)
and with any backend for which a `ReferenceBackend` is passed (gloo on CPUs).
"""

import torch
import torch.distributed as dist

from .all_to_all import all_to_all_backward, all_to_all_forward
from .backends import Flash3Backend, ReferenceBackend
from .layout import check_layout, shard_sequence, unshard_sequence
from .merge import merge_into
from .ring import ring_backward, ring_forward

STRATEGIES = ("ring", "all_to_all")


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, softmax_scale, strategy, layout, backend):
        ctx.group, ctx.causal, ctx.softmax_scale = group, causal, softmax_scale
        ctx.strategy, ctx.layout, ctx.backend = strategy, layout, backend
        if strategy == "ring":
            out, lse = ring_forward(q, k, v, group, causal, softmax_scale, layout, backend)
            ctx.save_for_backward(q, k, v, out, lse)
        else:
            out, lse, ctx.all_to_all_saved = all_to_all_forward(q, k, v, group, causal,
                                                                softmax_scale, layout, backend)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        dout = dout.contiguous()
        if ctx.strategy == "ring":
            q, k, v, out, lse = ctx.saved_tensors
            grads = ring_backward(dout, q, k, v, out, lse, ctx.group, ctx.causal,
                                  ctx.softmax_scale, ctx.layout, ctx.backend)
        else:
            grads = all_to_all_backward(dout, ctx.all_to_all_saved, ctx.causal,
                                        ctx.softmax_scale, ctx.backend)
            del ctx.all_to_all_saved
        return (*grads, None, None, None, None, None, None)


def _check(q, k, v, group, strategy, layout):
    check_layout(layout)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}; got {strategy!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected (batch, seqlen, heads, head_dim); "
                             f"got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"v: shape must equal k's {tuple(k.shape)}; got {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"k: batch and head_dim must equal q's ({q.shape[0]}, {q.shape[3]}); "
                         f"got ({k.shape[0]}, {k.shape[3]})")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"k: the local sequence length must equal q's ({q.shape[1]}): context "
                         f"parallelism shards one sequence; got {k.shape[1]}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"k: heads_q ({q.shape[2]}) must be a multiple of heads_kv "
                         f"({k.shape[2]})")
    world_size = dist.get_world_size(group)
    if layout == "zigzag" and world_size > 1 and q.shape[1] % 2:
        raise ValueError(f"q: the zigzag layout holds two equal chunks per rank; the local "
                         f"sequence length must be even, got {q.shape[1]}")


def ring_attention(q, k, v, group=None, causal=False, softmax_scale=None, strategy="ring",
                   layout="zigzag", return_lse=False, backend=None):
    """This rank's shard of softmax(q k^T * scale) v over the whole sequence.

    q: (batch, seqlen_local, heads_q, head_dim); k, v: (batch, seqlen_local,
    heads_kv, head_dim): this rank's shards (layout.py; every rank holds the
    same number of tokens). group: the process group (None: the default one).
    strategy: "ring" (K/V blocks circulate, P2P overlapped with compute;
    any head count) or "all_to_all" (Ulysses: heads_q divisible by the group
    size). causal: over global positions. backend: the local attention
    (backends.py); default flash3's kernels.
    Returns out (q's dtype), or (out, lse) with lse (batch, heads_q,
    seqlen_local) float32.
    """
    group = dist.group.WORLD if group is None else group
    _check(q, k, v, group, strategy, layout)
    backend = Flash3Backend() if backend is None else backend
    out, lse = _ContextParallelAttention.apply(q, k, v, group, bool(causal), softmax_scale,
                                               strategy, layout, backend)
    return (out, lse.contiguous()) if return_lse else out


__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "merge_into",
           "Flash3Backend", "ReferenceBackend", "STRATEGIES"]
