"""flash_attn_with_kvcache and flash_attn_combine without a GPU: schemas,
fakes (meta tensors, torch.compile fullgraph) and the Python-side checks."""

import pytest

torch = pytest.importorskip("torch")

import flash3  # noqa: E402
from flash3 import kvcache  # noqa: E402

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_op_schemas():
    assert str(torch.ops.flash3.fwd_kvcache.default._schema) == (
        "flash3::fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
        "Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? page_table, "
        "float? softmax_scale, bool causal, SymInt window_left, SymInt window_right, "
        "float softcap, Tensor? sinks, SymInt num_splits, Tensor? cu_seqlens_q, "
        "SymInt max_seqlen_q, SymInt pack_gqa, Tensor? alibi_slopes) -> (Tensor, Tensor)")
    assert str(torch.ops.flash3.fwd_kvcache_append.default._schema) == (
        "flash3::fwd_kvcache_append(Tensor q, Tensor(a1!) k_cache, Tensor(a2!) v_cache, Tensor k, "
        "Tensor v, Tensor? rotary_cos, Tensor? rotary_sin, bool rotary_interleaved, "
        "Tensor? cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
        "Tensor? page_table, float? softmax_scale, bool causal, SymInt window_left, "
        "SymInt window_right, float softcap, Tensor? sinks, SymInt num_splits, SymInt pack_gqa, "
        "Tensor? alibi_slopes, Tensor? cu_seqlens_q, SymInt max_seqlen_q) -> (Tensor, Tensor)")
    assert str(torch.ops.flash3.combine.default._schema) == (
        "flash3::combine(Tensor out_partial, Tensor lse_partial, ScalarType out_dtype) "
        "-> (Tensor, Tensor)")


def test_fake_shapes_plain_and_paged():
    q = meta(3, 1, 32, 128)
    cache = meta(5, 4096, 8, 128)
    seqlens = meta(3, dtype=torch.int32)
    out, lse = flash3.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens,
                                              cache_batch_idx=seqlens, causal=True,
                                              return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == BF16 and lse.shape == (3, 32, 1)
    pages = meta(100, 16, 8, 128)
    table = meta(3, 20, dtype=torch.int32)
    assert flash3.flash_attn_with_kvcache(q, pages, pages, page_table=table,
                                          cache_seqlens=7).shape == q.shape


def test_checks_name_the_argument():
    q = meta(2, 1, 4, 64)
    cache = meta(2, 100, 2, 64)
    with pytest.raises(flash3.Flash3InvalidArgument, match="cache_seqlens: expected a contiguous int32"):
        flash3.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=meta(3, dtype=torch.int32))
    with pytest.raises(flash3.Flash3InvalidArgument, match="k_cache: batch must equal q's"):
        flash3.flash_attn_with_kvcache(q, cache[:1], cache[:1])
    with pytest.raises(flash3.Flash3InvalidArgument, match="page_table: expected an int32"):
        flash3.flash_attn_with_kvcache(q, cache, cache, page_table=meta(2, 3))
    with pytest.raises(flash3.Flash3InvalidArgument, match="v_cache: shape"):
        flash3.flash_attn_with_kvcache(q, cache, cache[:, :50])
    with pytest.raises(flash3.Flash3InvalidArgument, match="num_splits"):
        flash3.flash_attn_with_kvcache(q, cache, cache, num_splits=-1)
    with pytest.raises(flash3.Flash3InvalidArgument, match="rotary_cos, rotary_sin: rotary "
                       "embedding applies to appended keys"):
        flash3.flash_attn_with_kvcache(q, cache, cache, rotary_cos=q)
    with pytest.raises(flash3.Flash3InvalidArgument, match="pack_gqa: expected None"):
        flash3.flash_attn_with_kvcache(q, cache, cache, pack_gqa=1)


def test_varlen_q_checks_name_the_argument():
    q = meta(5, 4, 64)  # (total_q, heads, dim)
    cache = meta(2, 100, 2, 64)
    cu = meta(3, dtype=torch.int32)
    out, lse = flash3.flash_attn_with_kvcache(q, cache, cache, cu_seqlens_q=cu, max_seqlen_q=4,
                                              return_lse=True)
    assert out.shape == (5, 4, 64) and lse.shape == (4, 5)
    with pytest.raises(flash3.Flash3InvalidArgument, match="q: must be 3-d"):
        flash3.flash_attn_with_kvcache(meta(2, 1, 4, 64), cache, cache, cu_seqlens_q=cu,
                                       max_seqlen_q=1)
    with pytest.raises(flash3.Flash3InvalidArgument, match="max_seqlen_q: expected an int"):
        flash3.flash_attn_with_kvcache(q, cache, cache, cu_seqlens_q=cu)
    with pytest.raises(flash3.Flash3InvalidArgument, match="cu_seqlens_q: expected a contiguous int32"):
        flash3.flash_attn_with_kvcache(q, cache, cache, cu_seqlens_q=meta(3), max_seqlen_q=4)
    with pytest.raises(flash3.Flash3InvalidArgument, match="k_cache: batch must equal q's \\(3\\)"):
        flash3.flash_attn_with_kvcache(q, cache, cache, cu_seqlens_q=meta(4, dtype=torch.int32),
                                       max_seqlen_q=4)
    with pytest.raises(flash3.Flash3InvalidArgument, match="cache_seqlens: expected a contiguous "
                       "int32 tensor of shape \\(2,\\)"):
        flash3.flash_attn_with_kvcache(q, cache, cache, cu_seqlens_q=cu, max_seqlen_q=4,
                                       cache_seqlens=meta(5, dtype=torch.int32))
    # Append: k and v packed like q, one new key per query.
    seqlens = meta(2, dtype=torch.int32)
    new = meta(5, 2, 64)
    out = flash3.flash_attn_with_kvcache(q, cache, cache.clone(), k=new, v=new,
                                         cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=4)
    assert out.shape == q.shape
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"k: expected shape \(total_q, heads_kv, "
                       r"head_dim\) = \(5, 2, 64\); got \(2, 1, 2, 64\)"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=meta(2, 1, 2, 64), v=meta(2, 1, 2, 64),
                                       cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=4)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"v: expected shape \(total_q, heads_kv, "
                       r"head_dim\) = \(5, 2, 64\); got \(5, 4, 64\)"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=meta(5, 4, 64),
                                       cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=4)


def test_append_checks_name_the_argument():
    q = meta(2, 1, 4, 64)
    cache = meta(2, 100, 2, 64)
    new = meta(2, 1, 2, 64)
    seqlens = meta(2, dtype=torch.int32)
    table = meta(50, 16)
    with pytest.raises(flash3.Flash3InvalidArgument, match="k and v: give both"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, cache_seqlens=seqlens)
    with pytest.raises(flash3.Flash3InvalidArgument, match=r"v: expected shape \(batch, seqlen_new, "
                       r"heads_kv, head_dim\) = \(2, 1, 2, 64\); got \(2, 1, 4, 64\)"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=meta(2, 1, 4, 64),
                                       cache_seqlens=seqlens)
    with pytest.raises(flash3.Flash3InvalidArgument, match="v: dtype must equal q's"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=meta(2, 1, 2, 64, dtype=torch.float16),
                                       cache_seqlens=seqlens)
    with pytest.raises(flash3.Flash3InvalidArgument, match="cache_seqlens: required with k and v"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=new)
    with pytest.raises(flash3.Flash3InvalidArgument, match="rotary_cos and rotary_sin: give both"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=new, cache_seqlens=seqlens,
                                       rotary_cos=table)
    with pytest.raises(flash3.Flash3InvalidArgument, match="rotary_sin: expected shape"):
        flash3.flash_attn_with_kvcache(q, cache, cache, k=new, v=new, cache_seqlens=seqlens,
                                       rotary_cos=table, rotary_sin=meta(50, 8))


def test_combine_fake_and_checks():
    out_partial = meta(4, 2, 3, 8, 128, dtype=torch.float32)
    lse_partial = meta(4, 2, 3, 8, dtype=torch.float32)
    out, lse = flash3.flash_attn_combine(out_partial, lse_partial, out_dtype=BF16, return_lse=True)
    assert out.shape == (2, 3, 8, 128) and out.dtype == BF16 and lse.shape == (2, 8, 3)
    assert flash3.flash_attn_combine(out_partial, lse_partial).dtype == torch.float32
    with pytest.raises(flash3.Flash3InvalidArgument, match="lse_partial: expected"):
        flash3.flash_attn_combine(out_partial, lse_partial[:, :1])
    with pytest.raises(flash3.Flash3InvalidArgument, match="out_dtype"):
        flash3.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.int8)


def test_compile_fullgraph():
    @torch.compile(fullgraph=True, backend="aot_eager")
    def decode(q, k_cache, v_cache, seqlens):
        return kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               causal=True, return_lse=True)

    q, cache = meta(2, 1, 8, 128), meta(2, 512, 2, 128)
    out, lse = decode(q, cache, cache, meta(2, dtype=torch.int32))
    assert out.shape == q.shape and lse.shape == (2, 8, 1)


def test_compile_fullgraph_append():
    @torch.compile(fullgraph=True, backend="aot_eager")
    def decode(q, k_cache, v_cache, k, v, cos, sin, seqlens):
        return kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, rotary_cos=cos,
                                               rotary_sin=sin, cache_seqlens=seqlens, causal=True)

    q, cache, new = meta(2, 1, 8, 128), meta(2, 512, 2, 128), meta(2, 1, 2, 128)
    table = meta(512, 64)
    out = decode(q, cache, cache.clone(), new, new, table, table, meta(2, dtype=torch.int32))
    assert out.shape == q.shape


def test_compile_fullgraph_append_varlen_q():
    @torch.compile(fullgraph=True, backend="aot_eager")
    def prefill(q, k_cache, v_cache, k, v, seqlens, cu):
        return kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=seqlens,
                                               cu_seqlens_q=cu, max_seqlen_q=5, causal=True,
                                               return_lse=True)

    q, cache, new = meta(9, 8, 128), meta(2, 512, 2, 128), meta(9, 2, 128)
    out, lse = prefill(q, cache, cache.clone(), new, new, meta(2, dtype=torch.int32),
                       meta(3, dtype=torch.int32))
    assert out.shape == q.shape and lse.shape == (8, 9)


def test_compile_fullgraph_varlen_q():
    @torch.compile(fullgraph=True, backend="aot_eager")
    def verify(q, k_cache, v_cache, seqlens, cu):
        return kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               cu_seqlens_q=cu, max_seqlen_q=5, causal=True,
                                               pack_gqa=True, return_lse=True)

    q, cache = meta(9, 8, 128), meta(2, 512, 2, 128)
    out, lse = verify(q, cache, cache, meta(2, dtype=torch.int32), meta(3, dtype=torch.int32))
    assert out.shape == q.shape and lse.shape == (8, 9)
