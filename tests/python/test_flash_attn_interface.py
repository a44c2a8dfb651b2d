"""flash3.flash_attn_interface keeps FA3's names, argument names and defaults,
and refuses (naming the argument) what flash3 does not implement. No GPU
needed; the GPU equality check is in test_torch_ops_gpu.py."""

import inspect

import pytest

torch = pytest.importorskip("torch")

import flash3  # noqa: E402
from flash3 import flash_attn_interface as fai  # noqa: E402

# FA3's hopper/flash_attn_interface.py, as of its 3.0 releases.
FA3_FLASH_ATTN_FUNC = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty), ("softmax_scale", None), ("causal", False), ("qv", None),
    ("q_descale", None), ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
    ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None),
    ("deterministic", False), ("sm_margin", 0), ("return_attn_probs", False),
]


FA3_FLASH_ATTN_VARLEN_FUNC = (
    [(name, inspect.Parameter.empty) for name in (
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")]
    + [("seqused_q", None), ("seqused_k", None)] + FA3_FLASH_ATTN_FUNC[3:])


def test_flash_attn_varlen_func_has_fa3s_signature():
    params = inspect.signature(fai.flash_attn_varlen_func).parameters
    assert [(p.name, p.default) for p in params.values()] == FA3_FLASH_ATTN_VARLEN_FUNC


def test_flash_attn_func_has_fa3s_signature():
    params = inspect.signature(fai.flash_attn_func).parameters
    assert [(p.name, p.default) for p in params.values()] == FA3_FLASH_ATTN_FUNC


def test_fa3_names_exist():
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
                 "flash_attn_combine", "get_scheduler_metadata"):
        assert callable(getattr(fai, name)), name


@pytest.mark.parametrize("argument, value", [
    ("attention_chunk", 512),
    ("q_descale", 1.0), ("qv", 1.0),
])
def test_unimplemented_arguments_are_refused_by_name(argument, value):
    import torch

    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(flash3.Flash3Unsupported, match=rf"^{argument}=.* is not supported"):
        fai.flash_attn_func(q, q, q, **{argument: value})
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(flash3.Flash3Unsupported, match=rf"^{argument}=.* is not supported"):
        fai.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, **{argument: value})


def test_unimplemented_functions_say_so():
    with pytest.raises(flash3.Flash3Unsupported, match="get_scheduler_metadata"):
        fai.get_scheduler_metadata(1, 1, 1)
    q = torch.empty(1, 1, 2, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(flash3.Flash3Unsupported, match="cu_seqlens_k_new other than cu_seqlens_q"):
        fai.flash_attn_with_kvcache(q[0], q, q, cu_seqlens_q=torch.empty(2, dtype=torch.int32),
                                    cu_seqlens_k_new=torch.empty(2, dtype=torch.int32))
    with pytest.raises(flash3.Flash3Unsupported, match="rotary_seqlens"):
        fai.flash_attn_with_kvcache(q, q, q, k=q, v=q, rotary_seqlens=q)


def test_kvcache_append_with_varlen_q_is_forwarded():
    # cu_seqlens_k_new = cu_seqlens_q: the new keys are packed like q.
    q = torch.empty(5, 2, 64, dtype=torch.bfloat16, device="meta")
    cache = torch.empty(2, 100, 1, 64, dtype=torch.bfloat16, device="meta")
    new = torch.empty(5, 1, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out = fai.flash_attn_with_kvcache(q, cache, cache.clone(), k=new, v=new,
                                      cache_seqlens=torch.empty(2, dtype=torch.int32, device="meta"),
                                      cu_seqlens_q=cu, cu_seqlens_k_new=cu, max_seqlen_q=4)
    assert out.shape == q.shape


def test_kvcache_append_is_forwarded():
    q = torch.empty(1, 1, 2, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(flash3.Flash3InvalidArgument, match="cache_seqlens: required with k and v"):
        fai.flash_attn_with_kvcache(q, q, q, k=q, v=q)
