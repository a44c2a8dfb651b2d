"""Head-parallel (Ulysses-style) context parallelism.

Ranks hold sequence shards of all heads. One all-to-all turns that into the
whole sequence of heads / W heads per rank; every rank runs ordinary
attention on its heads; a second all-to-all brings the output back to
sequence shards. Communication is a fixed 4 tensor-sized all-to-alls per
forward (q, k, v, out) instead of W - 1 K/V hops, but it needs heads_q
divisible by W. K/V heads that do not divide by W (GQA with few KV heads) are
repeated to one per query head first, and their gradients summed back.

The gathered sequence is in the order of the shards (layout.py); for causal
attention it is permuted to the true order before the kernel and back after.
"""

import torch
import torch.distributed as dist

from .layout import global_order


def _seq_to_heads(x, group, world_size):
    """(b, s/W, h, d) sequence shards -> (b, s, h/W, d): this rank's heads,
    every rank's tokens, shards concatenated in rank order."""
    b, s_local, h, d = x.shape
    # Split heads into W groups: group j goes to rank j.
    send = x.reshape(b, s_local, world_size, h // world_size, d).permute(2, 0, 1, 3, 4)
    received = torch.empty_like(send.contiguous())
    dist.all_to_all_single(received, send.contiguous(), group=group)
    # received[j] = rank j's tokens of my heads.
    return received.permute(1, 0, 2, 3, 4).reshape(b, world_size * s_local, h // world_size, d)


def _heads_to_seq(x, group, world_size):
    """The inverse of _seq_to_heads."""
    b, s, h_local, d = x.shape
    s_local = s // world_size
    send = x.reshape(b, world_size, s_local, h_local, d).permute(1, 0, 2, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # received[j] = my tokens of rank j's heads.
    return received.permute(1, 2, 0, 3, 4).reshape(b, s_local, world_size * h_local, d)


def _lse_heads_to_seq(lse, group, world_size):
    # (b, h/W, s) -> (b, h, s/W): as _heads_to_seq with a unit head dim.
    return _heads_to_seq(lse.transpose(1, 2).unsqueeze(-1), group, world_size).squeeze(-1).transpose(1, 2)


class _Plan:
    def __init__(self, q, k, group, causal, layout):
        self.group = group
        self.world_size = dist.get_world_size(group)
        heads_q, heads_kv = q.shape[2], k.shape[2]
        if heads_q % self.world_size:
            raise ValueError(f"q: the all_to_all strategy needs heads_q ({heads_q}) divisible by "
                             f"the group size ({self.world_size}); use strategy='ring'")
        self.kv_repeat = 1 if heads_kv % self.world_size == 0 else heads_q // heads_kv
        # Causal needs the tokens in their true order; full attention does not care.
        self.order = None
        if causal and self.world_size > 1:
            self.order = global_order(layout, self.world_size, q.shape[1] * self.world_size,
                                      device=q.device)
            self.inverse = torch.argsort(self.order)

    def gather(self, x):
        x = _seq_to_heads(x, self.group, self.world_size)
        # Position i of the true sequence is gathered token inverse[i].
        return x if self.order is None else x[:, self.inverse]

    def scatter(self, x):
        x = x if self.order is None else x[:, self.order]
        return _heads_to_seq(x, self.group, self.world_size)

    def scatter_lse(self, lse):
        lse = lse if self.order is None else lse[:, :, self.order]
        return _lse_heads_to_seq(lse.contiguous(), self.group, self.world_size)

    def expand_kv(self, x):
        return x if self.kv_repeat == 1 else x.repeat_interleave(self.kv_repeat, dim=2)

    def reduce_kv(self, g):
        if self.kv_repeat == 1:
            return g
        b, s, h, d = g.shape
        return g.reshape(b, s, h // self.kv_repeat, self.kv_repeat, d).sum(3)


def all_to_all_forward(q, k, v, group, causal, softmax_scale, layout, backend):
    """Returns (out, lse) in sequence shards, and what the backward needs."""
    plan = _Plan(q, k, group, causal, layout)
    if plan.world_size == 1:
        out, lse = backend.forward(q, k, v, causal, softmax_scale)
        return out, lse, (plan, q, k, v, out, lse)
    qh, kh, vh = plan.gather(q), plan.gather(plan.expand_kv(k)), plan.gather(plan.expand_kv(v))
    out_h, lse_h = backend.forward(qh, kh, vh, causal, softmax_scale)
    saved = (plan, qh, kh, vh, out_h, lse_h)
    return plan.scatter(out_h), plan.scatter_lse(lse_h), saved


def all_to_all_backward(dout, saved, causal, softmax_scale, backend):
    plan, qh, kh, vh, out_h, lse_h = saved
    if plan.world_size == 1:
        return backend.backward(dout, qh, kh, vh, out_h, lse_h, causal, softmax_scale)
    dq_h, dk_h, dv_h = backend.backward(plan.gather(dout), qh, kh, vh, out_h, lse_h, causal,
                                        softmax_scale)
    return (plan.scatter(dq_h), plan.reduce_kv(plan.scatter(dk_h)),
            plan.reduce_kv(plan.scatter(dv_h)))
