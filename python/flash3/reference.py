"""The one reference attention for all flash3 tests and checks (DESIGN.md 1, 3).

Layout as everywhere in flash3: (batch, seqlen, heads, headdim). Written for
clarity, not speed: it materializes the (batch, heads, seqlen_q, seqlen_k)
score matrix.
"""

import contextlib
import math

import torch


def causal_mask(seqlen_q, seqlen_k, device):
    """Bool (seqlen_q, seqlen_k), True where query i may see key j: the
    bottom-right aligned causal mask, j <= i + seqlen_k - seqlen_q."""
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return j <= i + (seqlen_k - seqlen_q)


def visible_mask(seqlen_q, seqlen_k, device, causal=False, window_size=(-1, -1)):
    """Bool (seqlen_q, seqlen_k), True where query i may see key j under
    causal and a (left, right) window, both aligned bottom-right: with d =
    seqlen_k - seqlen_q, j >= i + d - left unless left == -1, j <= i + d +
    right unless right == -1, and j <= i + d with causal."""
    left, right = window_size
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    diagonal = i + (seqlen_k - seqlen_q)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        visible &= j <= diagonal
    if left >= 0:
        visible &= j >= diagonal - left
    if right >= 0:
        visible &= j <= diagonal + right
    return visible


@contextlib.contextmanager
def _ieee_fp32_matmul():
    # TF32 (10-bit mantissa) would make an "fp32" reference less accurate than
    # the bf16 kernel it judges; force full fp32 matmuls while the reference runs.
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _repeat_kv(x, num_heads_q):
    # Query head h uses key/value head h // (num_heads_q // num_heads_kv).
    num_heads_kv = x.shape[2]
    if num_heads_q % num_heads_kv:
        raise ValueError(
            f"num_heads_q ({num_heads_q}) must be a multiple of num_heads_kv ({num_heads_kv})"
        )
    return x.repeat_interleave(num_heads_q // num_heads_kv, dim=2)


def attention_ref(q, k, v, softmax_scale=None, causal=False, upcast=True,
                  compute_dtype=torch.float32, window_size=(-1, -1), softcap=0.0, sinks=None,
                  alibi_slopes=None):
    """Reference attention. Returns (out, lse).
    Scores s = softmax_scale * q.k; softcap > 0 replaces them by softcap *
    tanh(s / softcap); then causal and window_size mask them (visible_mask).
    sinks: optional (hq,) logits, one per query head, that join every row's
    softmax as one more score with a zero value vector (gpt-oss): the lse
    includes them, the output is the attention over the keys alone.
    alibi_slopes: optional (hq,) or (b, hq) slopes; score (i, j) gains
    -slope * |i + sk - sq - j| after softcap (FA2's ALiBi).

    q: (b, sq, hq, d); k, v: (b, sk, hkv, d) with hq % hkv == 0.
    upcast=True: computed in `compute_dtype` (float32, or float64 where
    cheap); out is returned in compute_dtype, lse (b, hq, sq) too.
    upcast=False: computed in the inputs' dtype the way a plain PyTorch
    program would (bf16/fp16 matmuls, softmax on low-precision scores), to
    calibrate the rounding error a correct kernel may have (DESIGN.md 3);
    out in the input dtype, lse converted to float32 from the low-precision
    logsumexp.
    Rows that see no key (causal with sq > sk, a window, or sk == 0): out 0,
    lse -inf (the sink's logit with sinks).
    """
    batch, seqlen_q, num_heads_q, head_dim = q.shape
    seqlen_k = k.shape[1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    dtype = compute_dtype if upcast else q.dtype
    # (b, h, s, d) so that matmul batches over (b, h).
    qh = q.to(dtype).transpose(1, 2)
    kh = _repeat_kv(k.to(dtype), num_heads_q).transpose(1, 2)
    vh = _repeat_kv(v.to(dtype), num_heads_q).transpose(1, 2)

    with _ieee_fp32_matmul():
        scores = torch.matmul(qh, kh.transpose(-2, -1)) * softmax_scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(dtype).reshape(-1, num_heads_q, 1, 1)
            rows = torch.arange(seqlen_q, device=q.device).view(-1, 1)
            cols = torch.arange(seqlen_k, device=q.device).view(1, -1)
            distance = (rows + seqlen_k - seqlen_q - cols).abs().to(dtype)
            scores = scores - slopes * distance
        if causal or tuple(window_size) != (-1, -1):
            visible = visible_mask(seqlen_q, seqlen_k, q.device, causal, window_size)
            scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink_column = sinks.to(dtype).view(1, num_heads_q, 1, 1)
            scores = torch.cat([scores, sink_column.expand(batch, -1, seqlen_q, 1)], dim=-1)
        # A row with every score -inf (no key, no sink) has lse -inf and P = 0.
        # Its logsumexp and softmax are computed on zeros instead: on the -inf
        # row itself their gradient is NaN, and 0 * NaN would reach the inputs
        # (a -inf sink's gradient, which is 0).
        row_empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
        finite_scores = scores.masked_fill(row_empty, 0.0)
        lse = torch.logsumexp(finite_scores, dim=-1).masked_fill(row_empty.squeeze(-1), -math.inf)
        if upcast:
            probs = torch.exp(finite_scores - lse.unsqueeze(-1).masked_fill(row_empty, 0.0))
        else:
            # What a plain program writes (softmax of the low-precision scores).
            probs = torch.softmax(finite_scores, dim=-1)
        probs = probs.masked_fill(row_empty, 0.0)
        if sinks is not None:
            probs = probs[..., :seqlen_k]
        out = torch.matmul(probs, vh)
    out = out.transpose(1, 2).contiguous()
    return out, (lse if upcast else lse.float())


def rotary_ref(x, cos, sin, positions, interleaved=True):
    """Rotary embedding, the reference for the KV cache's in-kernel append:
    x (batch, seqlen, heads, headdim); cos, sin (max_position, rotary_dim / 2);
    positions (batch, seqlen) integers. The first rotary_dim dims of each
    head rotate, the rest pass through. interleaved: pairs (0, 1), (2, 3), ...
    (GPT-J); otherwise (i, i + rotary_dim / 2) (GPT-NeoX). Computed in fp32
    (fp64 inputs in fp64), returned in x's dtype."""
    half = cos.shape[-1]
    rotary_dim = 2 * half
    compute = torch.promote_types(x.dtype, torch.float32)
    c = cos[positions].to(compute).unsqueeze(2)  # (batch, seqlen, 1, half)
    s = sin[positions].to(compute).unsqueeze(2)
    rotated = x[..., :rotary_dim].to(compute)
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated[..., :half], rotated[..., half:]
    new_first = first * c - second * s
    new_second = first * s + second * c
    if interleaved:
        rotated = torch.stack([new_first, new_second], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([new_first, new_second], dim=-1)
    return torch.cat([rotated.to(x.dtype), x[..., rotary_dim:]], dim=-1)
