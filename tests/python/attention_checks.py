"""Helpers the GPU numerics tests share: built-configuration queries, random
inputs, and the DESIGN.md 3 tolerance rule. The `seed` fixture is in conftest.py."""

import math
import re

import pytest
import torch

from flash3 import _lib

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIMS = (64, 96, 128, 192, 256)  # the 16-bit kernels (validate.hpp)
# (head_dim, head_dim_v) pairs with V's head dim apart (validate.hpp kHeadDimPairs).
HEAD_DIM_PAIRS = ((192, 128),)
# A test parametrized over both takes an int or a pair as `head_dim`.
ALL_HEAD_DIMS = HEAD_DIMS + HEAD_DIM_PAIRS


def split_head_dim(head_dim):
    """(q's and k's head dim, v's) of an entry of ALL_HEAD_DIMS."""
    return head_dim if isinstance(head_dim, tuple) else (head_dim, head_dim)


def head_dim_id(head_dim):
    d, dv = split_head_dim(head_dim)
    return f"{d}" if d == dv else f"{d}x{dv}"


def _built():
    info = _lib.build_info()
    dtypes = set(re.search(r"dtypes=([\w,]+)", info).group(1).split(","))
    head_dims = {int(x) for x in re.search(r"head_dims=([\d,]+)", info).group(1).split(",")}
    pairs = re.search(r"head_dim_pairs=([\dx,]*)", info).group(1)
    head_dims |= {tuple(int(d) for d in pair.split("x")) for pair in pairs.split(",") if pair}
    return dtypes, head_dims, info


def require_built(dtype_name, head_dim):
    dtypes, head_dims, info = _built()
    if dtype_name not in dtypes or head_dim not in head_dims:
        pytest.skip(f"{dtype_name} head_dim {head_dim} not built into this library ({info})")


def _where(seed):
    return f"(seed {seed}; rerun with FLASH3_TEST_SEED={seed})"


def make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype):
    """`head_dim`: an int, or a (head_dim, head_dim_v) pair."""
    d, dv = split_head_dim(head_dim)
    q = torch.randn(batch, seqlen_q, heads_q, d, dtype=dtype, device="cuda")
    k = torch.randn(batch, seqlen_k, heads_kv, d, dtype=dtype, device="cuda")
    v = torch.randn(batch, seqlen_k, heads_kv, dv, dtype=dtype, device="cuda")
    return q, k, v


def out_shape(q, v):
    """out's (and dout's) shape: q's with v's head dim."""
    return (*q.shape[:-1], v.shape[-1])


def _max_abs(x):
    return float(x.abs().max()) if x.numel() else 0.0


def assert_rule(name, got, ref, lowp, seed):
    """The DESIGN.md 3 rule on finite entries of ref."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    bad = (~torch.isfinite(got)).sum().item()
    assert bad == 0, f"{name}: {bad} non-finite values of {got.numel()} {_where(seed)}"
    err = _max_abs(got.double() - ref.double())
    base = _max_abs(lowp.double() - ref.double())
    assert err <= 2 * base + 1e-5, (
        f"{name}: max|flash3 - ref| = {err:.3e} > 2 * max|lowp - ref| + 1e-5 = "
        f"{2 * base + 1e-5:.3e} {_where(seed)}")


# (causal, window_size, softcap) for the window and softcap tests: windows on
# either side and both, the diagonal alone, softcap with and without masks.
# With the tests' lengths, some rows see no key (sq > sk, narrow windows).
MASKS = [
    (False, (64, 64), 0.0), (True, (100, -1), 0.0), (True, (0, 0), 0.0), (False, (0, 0), 0.0),
    (False, (255, 3), 0.0), (False, (-1, 130), 0.0), (False, (-1, -1), 2.0),
    (True, (-1, -1), 30.0), (True, (200, 0), 5.0), (False, (40, 7), 2.0),
]


# (causal, window_size, softcap) for the sinks tests: none, with rows that see
# no key (lse = the sink there), with a window and softcap (the sink joins
# after the cap).
SINK_MASKS = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (40, 7), 2.0)]


# Masks ALiBi is tested with (no softcap: not supported together).
ALIBI_MASKS = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (100, -1), 0.0),
               (False, (255, 3), 0.0)]
ALIBI_LENGTHS = [(2, 255, 113), (1, 799, 799), (1, 1023, 2049)]  # (batch, seqlen_q, seqlen_k)
ALIBI_HEAD_DIMS = (64, 96, 128, 192)  # 256 refuses it (flash3.hpp)


def make_alibi_slopes(heads, batch=None):
    """ALiBi's slopes 2^(-8 (h + 1) / heads), (heads,) fp32; with `batch`,
    (batch, heads) with each entry's slopes scaled differently."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
    if batch is None:
        return slopes
    return slopes * torch.linspace(0.5, 2.0, batch, device="cuda")[:, None]


def make_sinks(heads, seqlen_k):
    """(heads,) fp32 sink logits near a row's log-sum-exp (about log seqlen_k
    for the N(0, 1) scores of make_qkv), so the sink takes a real share of the
    softmax; head 0's sink lies far above every score (almost all weight on
    it: must not overflow) and the last head's is -inf (no sink). Rounded to
    bf16 so that the low-precision reference holds the same values."""
    sinks = math.log(max(seqlen_k, 1)) + 2 * torch.randn(heads, device="cuda")
    sinks[0] = 40.0
    sinks[-1] = -math.inf
    return sinks.bfloat16().float()


def mask_id(mask):
    causal, (left, right), softcap = mask
    return f"{'causal' if causal else 'full'}-w{left}_{right}-cap{softcap:g}"


def _any_built():
    dtypes, head_dims, _ = _built()
    dtype_name = "bf16" if "bf16" in dtypes else sorted(dtypes)[0]
    return dtype_name, DTYPES[dtype_name], min(d for d in head_dims if isinstance(d, int))
