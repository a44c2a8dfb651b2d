"""flash_attn_varlen_func's torch-side checks and its fake (meta)
registration; no GPU needed. The library's own rules for varlen are in
tests/cpp/validate_test.cpp."""

import pytest

torch = pytest.importorskip("torch")

import flash3  # noqa: E402
from flash3 import varlen  # noqa: E402


def packed(total_q=12, total_k=20, heads_q=4, heads_kv=2, head_dim=64, device="meta",
           dtype=torch.bfloat16):
    q = torch.empty(total_q, heads_q, head_dim, dtype=dtype, device=device)
    k = torch.empty(total_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.empty(total_k, heads_kv, head_dim, dtype=dtype, device=device)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 15, 20], dtype=torch.int32, device=device)
    return q, k, v, cu_q, cu_k


def test_exported():
    assert flash3.flash_attn_varlen_func is varlen.flash_attn_varlen_func


def test_meta_gives_packed_out_and_lse_per_head():
    q, k, v, cu_q, cu_k = packed()
    out, lse = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 15, causal=True,
                                             return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (4, 12) and lse.dtype == torch.float32


def test_cpu_is_rejected():
    q, k, v, cu_q, cu_k = packed(device="cpu")
    with pytest.raises(flash3.Flash3InvalidArgument, match="q: must be a CUDA tensor; got device cpu"):
        flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 15)


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "q": a["q"][None]}, r"q: must be 3-d \(total_tokens, heads, headdim\) with varlen"),
    (lambda a: {**a, "v": a["v"][:-1]}, r"v: shape must equal k's \(20, 2, 64\)"),
    (lambda a: {**a, "k": a["k"][..., :32]}, r"k: head_dim must equal q's \(64\); got 32"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()},
     r"cu_seqlens_q: expected a contiguous int32 tensor of shape \(3,\) \(batch = 2 from cu_seqlens_q\)"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:2]},
     r"cu_seqlens_k: expected a contiguous int32 tensor of shape \(3,\)"),
    (lambda a: {**a, "cu_seqlens_q": torch.empty(0, dtype=torch.int32, device="meta")},
     r"cu_seqlens_q: expected a 1-d int32 tensor of batch \+ 1 offsets"),
    (lambda a: {**a, "seqused_k": torch.empty(3, dtype=torch.int32, device="meta")},
     r"seqused_k: expected a contiguous int32 tensor of shape \(2,\)"),
    (lambda a: {**a, "max_seqlen_q": -1}, r"max_seqlen_q: expected an int >= 0"),
    (lambda a: {**a, "max_seqlen_k": 2.5}, r"max_seqlen_k: expected an int >= 0"),
    (lambda a: {**a, "sinks": torch.empty(3, device="meta")}, r"sinks: expected a contiguous float32 tensor of shape \(4,\)"),
])
def test_bad_arguments_are_named(change, message):
    q, k, v, cu_q, cu_k = packed()
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7,
                max_seqlen_k=15)
    with pytest.raises(flash3.Flash3InvalidArgument, match=message):
        flash3.flash_attn_varlen_func(**change(args))


def test_gradients_flow_through_the_op():
    """Inputs that require grad take the op (its autograd), whose meta
    backward gives gradients shaped like the inputs."""
    q, k, v, cu_q, cu_k = packed()
    q.requires_grad_()
    k.requires_grad_()
    out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 15, causal=True)
    assert out.requires_grad
    dq, dk = torch.autograd.grad(out, (q, k), torch.empty_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape
