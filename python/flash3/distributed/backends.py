"""The local attention a context-parallel strategy runs on each rank.

A backend computes attention of local queries against one block of keys and
its gradients, given the final (merged) output and log-sum-exp:

    forward(q, k, v, causal, softmax_scale) -> (out, lse)
    backward(dout, q, k, v, out, lse, causal, softmax_scale) -> (dq, dk, dv)

with flash3's layouts (q, out: (b, s, h, d); lse: (b, h, s) float32). The
backward's out and lse are those of attention over all keys, so each block's
probabilities are already normalized globally and partial gradients add.

`Flash3Backend` runs the flash3 kernels (CUDA); `ReferenceBackend` is plain
PyTorch in float32 or float64 on any device, so the distributed logic runs and
is tested on CPUs with the same code path.
"""

import math

import torch

from ..reference import _ieee_fp32_matmul, attention_ref, causal_mask


class Flash3Backend:
    def __init__(self, deterministic=False):
        self.deterministic = deterministic

    def forward(self, q, k, v, causal, softmax_scale):
        return torch.ops.flash3.fwd.default(q, k, v, softmax_scale, causal, self.deterministic)

    def backward(self, dout, q, k, v, out, lse, causal, softmax_scale):
        dq, dk, dv, _ = torch.ops.flash3.bwd.default(dout, q, k, v, out, lse.contiguous(),
                                                     softmax_scale, causal, self.deterministic)
        return dq, dk, dv


class ReferenceBackend:
    """Exact attention in float32 (float64 for float64 inputs), O(s^2) memory."""

    @staticmethod
    def _compute_dtype(x):
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def forward(self, q, k, v, causal, softmax_scale):
        out, lse = attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                 compute_dtype=self._compute_dtype(q))
        return out.to(q.dtype), lse.float()

    def backward(self, dout, q, k, v, out, lse, causal, softmax_scale):
        with _ieee_fp32_matmul():
            return self._backward(dout, q, k, v, out, lse, causal, softmax_scale)

    def _backward(self, dout, q, k, v, out, lse, causal, softmax_scale):
        dtype = self._compute_dtype(q)
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        group = heads_q // heads_kv
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        # (b, h, s, d) in the compute dtype, K/V repeated over each group.
        qh, doh, oh = (t.to(dtype).transpose(1, 2) for t in (q, dout, out))
        kh, vh = (t.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2) for t in (k, v))
        scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(~causal_mask(seqlen_q, seqlen_k, q.device), float("-inf"))
        # exp(-inf - -inf) for rows that see no key: those rows have p = 0.
        row_lse = lse.to(dtype).unsqueeze(-1)
        p = torch.exp(scores - row_lse.masked_fill(torch.isneginf(row_lse), 0.0))
        p = p.masked_fill(torch.isneginf(scores), 0.0)
        dv = torch.matmul(p.transpose(-1, -2), doh)
        dp = torch.matmul(doh, vh.transpose(-1, -2))
        delta = (doh * oh).sum(-1, keepdim=True)
        ds = p * (dp - delta) * scale
        dq = torch.matmul(ds, kh)
        dk = torch.matmul(ds.transpose(-1, -2), qh)

        def per_kv_head(g):  # (b, hq, sk, d) -> (b, sk, hkv, d), summed over each group
            return g.transpose(1, 2).reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(3)

        return (dq.transpose(1, 2).to(q.dtype), per_kv_head(dk).to(k.dtype),
                per_kv_head(dv).to(v.dtype))
