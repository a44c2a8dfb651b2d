"""The FP8 custom ops without a GPU: their schemas, and their fakes giving
the right shapes and dtypes on meta tensors and under torch.compile
(fullgraph: no graph breaks anywhere in flash3.fp8)."""

import pytest

torch = pytest.importorskip("torch")

import flash3  # noqa: E402
from flash3 import fp8  # noqa: E402

E4M3 = torch.float8_e4m3fn


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_op_schemas():
    ops = torch.ops.flash3
    assert str(ops.quantize_fp8.default._schema) == (
        "flash3::quantize_fp8(Tensor q, Tensor k, Tensor v, str scaling, bool hadamard) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
    assert str(ops.fp8_vt.default._schema) == "flash3::fp8_vt(Tensor v) -> Tensor"
    assert str(ops.fwd_fp8.default._schema) == (
        "flash3::fwd_fp8(Tensor q, Tensor k, Tensor vt, Tensor q_scale, Tensor k_scale, "
        "Tensor v_scale, float? softmax_scale, bool causal, SymInt window_left, "
        "SymInt window_right, Tensor? sinks, bool want_lse) -> (Tensor, Tensor)")


@pytest.mark.parametrize("scaling", ["block", "tensor"])
def test_quantize_fake_shapes(scaling):
    q, k = meta(2, 300, 8, 64), meta(2, 129, 2, 64)
    inputs = fp8.quantize_fp8(q, k, k, scaling=scaling)
    expected = [((2, 300, 8, 64), E4M3), ((2, 129, 2, 64), E4M3), ((2, 2, 64, 256), E4M3),
                ((2, 8, 3), torch.float32), ((2, 2, 2), torch.float32), ((2, 2, 2), torch.float32)]
    assert [(tuple(t.shape), t.dtype) for t in inputs] == expected


def test_forward_fake_shapes_with_and_without_lse():
    q, k = meta(3, 17, 4, 128, dtype=torch.float16), meta(3, 1000, 4, 128, dtype=torch.float16)
    out, lse = fp8.fp8_attention(q, k, k, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == torch.float16  # back in q's dtype
    assert lse.shape == (3, 4, 17) and lse.dtype == torch.float32
    out = fp8.fp8_forward(fp8.quantize_fp8(q, k, k))
    assert out.shape == q.shape and out.dtype == torch.bfloat16


def test_fake_checks_name_the_argument():
    q = meta(1, 64, 2, 128)
    with pytest.raises(flash3.Flash3InvalidArgument, match="scaling"):
        fp8.quantize_fp8(q, q, q, scaling="row")
    with pytest.raises(flash3.Flash3InvalidArgument, match="v: shape"):
        fp8.quantize_fp8(q, q, q[:, :32])
    inputs = fp8.quantize_fp8(q, q, q)
    with pytest.raises(flash3.Flash3InvalidArgument, match="vt"):
        fp8.fp8_forward(inputs._replace(vt=inputs.vt[..., :64]))
    with pytest.raises(flash3.Flash3InvalidArgument, match="k_scale"):
        fp8.fp8_forward(inputs._replace(k_scale=meta(1, 3, 1, dtype=torch.float32)))
    with pytest.raises(flash3.Flash3InvalidArgument, match="v: dtype"):
        torch.ops.flash3.fp8_vt(q)


def test_compile_fullgraph_traces_both_paths():
    q, k = meta(2, 300, 8, 128), meta(2, 200, 2, 128)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def attend(q, k, v):
        return fp8.fp8_attention(q, k, v, causal=True, window_size=(64, 0), return_lse=True)

    out, lse = attend(q, k, k)
    assert out.shape == q.shape and lse.shape == (2, 8, 300)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def attend_fa3(q, k, v, descale):
        return fp8.flash_attn_fp8(q, k, v, q_descale=descale, v_descale=descale)

    e4m3_q, e4m3_k = meta(2, 300, 8, 128, dtype=E4M3), meta(2, 200, 2, 128, dtype=E4M3)
    out = attend_fa3(e4m3_q, e4m3_k, e4m3_k, meta(2, 2, dtype=torch.float32))
    assert out.shape == q.shape and out.dtype == torch.bfloat16
