"""Ring attention: K/V blocks travel around the ranks of a group.

Each rank keeps its queries and, over W steps, sees every rank's K/V block:
at step s rank r holds the block of rank (r - s) mod W, computes attention of
its queries against it with the local backend while the block moves on to
rank r + 1 (torch.distributed P2P, posted before the computation so the
transfer overlaps it), and folds the partial result in with the log-sum-exp
rule (merge.py). The backward walks the same ring: dK/dV accumulators (fp32)
travel with their blocks and come home after W hops; dQ stays.

Which queries see which keys, for rank r holding block `src` (layout.py):
- not causal: all of them;
- causal, contiguous: src == r: the causal diagonal; src < r: all; src > r:
  none (the step is skipped, the block still passes);
- causal, zigzag (rank r holds chunks r and 2W-1-r): src == r: the causal
  mask on the local concatenation (which is exactly right: chunk r never sees
  chunk 2W-1-r, and the reverse sees it whole); src < r: all queries see the
  block's first chunk and none its second; src > r: the second query chunk
  sees the whole block, the first sees nothing.
"""

import torch
import torch.distributed as dist

from .merge import empty_partial, merge_into

# What one step computes: (query rows, key rows, causal), rows as slices of
# the local shard, or None when nothing is visible.
_ALL = slice(None)


def _step_work(causal, layout, rank, src, seqlen_local):
    if not causal:
        return _ALL, _ALL, False
    if src == rank:
        return _ALL, _ALL, True
    if layout == "contiguous":
        return (_ALL, _ALL, False) if src < rank else None
    half = seqlen_local // 2
    if src < rank:
        return _ALL, slice(0, half), False
    return slice(half, None), _ALL, False


class _Ring:
    """Neighbour exchange on a process group: send to rank + 1, receive from
    rank - 1 (group ranks), several tensors per exchange."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world_size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world_size)

    def start(self, tensors):
        """Posts the exchange; returns (received buffers, requests)."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return received, dist.batch_isend_irecv(ops)

    @staticmethod
    def finish(exchange):
        received, requests = exchange
        for request in requests:
            request.wait()
        return received


def ring_forward(q, k, v, group, causal, softmax_scale, layout, backend):
    """(out in q's dtype, lse float32) of q against the keys of every rank."""
    ring = _Ring(group)
    out, lse = empty_partial(q)
    exchange = None
    for step in range(ring.world_size):
        if step + 1 < ring.world_size:
            exchange = ring.start((k, v))
        src = (ring.rank - step) % ring.world_size
        work = _step_work(causal, layout, ring.rank, src, q.shape[1])
        if work is not None:
            rows, keys, step_causal = work
            block_out, block_lse = backend.forward(q[:, rows], k[:, keys], v[:, keys],
                                                   step_causal, softmax_scale)
            if ring.world_size == 1:  # nothing to merge: flash3's output as is
                return block_out, block_lse
            merge_into(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if step + 1 < ring.world_size:
            k, v = _Ring.finish(exchange)
    return out.to(q.dtype), lse


def ring_backward(dout, q, k, v, out, lse, group, causal, softmax_scale, layout, backend):
    ring = _Ring(group)
    dq = torch.zeros_like(q, dtype=torch.float32)
    kv_exchange = dkv_exchange = None
    for step in range(ring.world_size):
        if step + 1 < ring.world_size:
            kv_exchange = ring.start((k, v))
        src = (ring.rank - step) % ring.world_size
        dk_part = torch.zeros_like(k, dtype=torch.float32)
        dv_part = torch.zeros_like(v, dtype=torch.float32)
        work = _step_work(causal, layout, ring.rank, src, q.shape[1])
        if work is not None:
            rows, keys, step_causal = work
            dq_b, dk_b, dv_b = backend.backward(dout[:, rows], q[:, rows], k[:, keys], v[:, keys],
                                                out[:, rows], lse[:, :, rows], step_causal,
                                                softmax_scale)
            if ring.world_size == 1:
                return dq_b, dk_b, dv_b
            dq[:, rows] += dq_b.float()
            dk_part[:, keys] += dk_b.float()
            dv_part[:, keys] += dv_b.float()
        # The accumulators of block `src` arrive from rank - 1, which has just
        # added its share (at step 0 the block is this rank's own, fresh).
        if dkv_exchange is not None:
            dk_acc, dv_acc = _Ring.finish(dkv_exchange)
            dk_part += dk_acc
            dv_part += dv_acc
        dkv_exchange = ring.start((dk_part, dv_part))
        if step + 1 < ring.world_size:
            k, v = _Ring.finish(kv_exchange)
    # After W hops every block's accumulators are back with its owner.
    dk, dv = _Ring.finish(dkv_exchange)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
