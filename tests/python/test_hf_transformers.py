"""flash3.hf_transformers on the CPU: registration, the mask function, what
is refused, and the glue (layouts, GQA, scaling, causal) in a whole Llama
model with the kernel replaced by the fp32 reference attention. The GPU
comparison with the real kernel is in test_hf_transformers_gpu.py."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import flash3  # noqa: E402
import flash3.hf_transformers as hf  # noqa: E402
from flash3 import ops  # noqa: E402
from flash3.reference import attention_ref  # noqa: E402

from hf_models import (  # noqa: E402
    logits_and_grads, model_variants, tiny_gpt_oss_config, tiny_llama_config)


def test_register_adds_attention_and_mask_functions():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert hf.register() == "f3_attention"
    assert AttentionInterface._global_mapping[hf.NAME] is hf.flash3_attention_forward
    assert AttentionMaskInterface._global_mapping[hf.NAME] is hf.flash3_attention_mask


def test_mask_function_returns_none_without_padding_and_the_mask_with_it():
    from transformers.masking_utils import causal_mask_function

    full = torch.ones(2, 10, dtype=torch.bool)
    assert hf.flash3_attention_mask(2, 10, 10, mask_function=causal_mask_function,
                                    attention_mask=full) is None
    assert hf.flash3_attention_mask(2, 10, 10, mask_function=causal_mask_function) is None
    padded = full.clone()
    padded[1, :3] = False
    assert torch.equal(hf.flash3_attention_mask(2, 10, 10, mask_function=causal_mask_function,
                                                attention_mask=padded), padded)


def test_sliding_window_mask_is_recognized():
    from transformers.masking_utils import sliding_window_causal_mask_function as sliding

    window = hf.flash3_attention_mask(2, 10, 10, mask_function=sliding(4), local_size=4)
    assert isinstance(window, hf.SlidingWindow) and window.size == 4
    full = torch.ones(2, 10, dtype=torch.bool)
    assert hf.flash3_attention_mask(2, 10, 10, mask_function=sliding(4), attention_mask=full,
                                    local_size=4).size == 4
    padded = full.clone()
    padded[0, 0] = False
    assert torch.equal(hf.flash3_attention_mask(2, 10, 10, mask_function=sliding(4),
                                                attention_mask=padded, local_size=4), padded)
    # A window of another size than transformers says, or none said: not recognized.
    for local_size in (5, None):
        with pytest.raises(flash3.Flash3Unsupported, match="mask pattern 'and_mask'"):
            hf.flash3_attention_mask(1, 8, 8, mask_function=sliding(4), local_size=local_size)


def test_other_mask_patterns_are_refused():
    from transformers.masking_utils import (
        and_masks, causal_mask_function, chunked_overlay, padding_mask_function)

    chunked = and_masks(chunked_overlay(4, torch.zeros(1, dtype=torch.long)), causal_mask_function)
    packed = and_masks(causal_mask_function, padding_mask_function(torch.ones(1, 8, dtype=torch.bool)))
    for mask_function in (chunked, packed):
        with pytest.raises(flash3.Flash3Unsupported, match="mask pattern"):
            hf.flash3_attention_mask(1, 8, 8, mask_function=mask_function, local_size=4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool)), "attention mask with padding"),
    (dict(dropout=0.1), "dropout"),
    (dict(sliding_window=128), "sliding_window=128"),
    (dict(softcap=30.0), "softcap=30.0"),
])
def test_attention_refuses_what_it_cannot_compute(kwargs, match):
    q = torch.randn(1, 2, 4, 64)
    args = dict(attention_mask=None)
    args.update(kwargs)
    with pytest.raises(flash3.Flash3Unsupported, match=match):
        hf.flash3_attention_forward(torch.nn.Module(), q, q, q, **args)


def _reference_kernel(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                      sinks=None):
    # flash_attn_func's contract on (b, s, h, d) inputs, in fp32 on the CPU.
    return attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal,
                         window_size=window_size, sinks=sinks)[0].to(q.dtype)


@pytest.mark.parametrize("seqlen", [1, 37])
@pytest.mark.parametrize("model", ["llama", "gpt_oss"])
def test_model_with_flash3_equals_transformers(monkeypatch, seed, seqlen, model):
    # The kernel replaced by the reference: what is left is the integration's
    # own work, which must reproduce transformers' own attention (SDPA for
    # Llama, eager for gpt-oss) up to fp32 rounding, sinks' gradients included.
    monkeypatch.setattr(ops, "flash_attn_func", _reference_kernel)
    # gpt-oss: a sliding window (8 < seqlen 37) on one layer, sinks on both.
    config, baseline = ((tiny_llama_config(), "sdpa") if model == "llama" else
                        (tiny_gpt_oss_config(sliding_window=8,
                                             layer_types=["sliding_attention", "full_attention"]),
                         "eager"))
    models = model_variants(config, [(torch.float32, baseline), (torch.float32, hf.NAME)], "cpu",
                            seed)
    input_ids = torch.randint(0, config.vocab_size, (2, seqlen))
    want_logits, want_grads = logits_and_grads(models[(torch.float32, baseline)], input_ids,
                                               input_ids)
    logits, grads = logits_and_grads(models[(torch.float32, hf.NAME)], input_ids, input_ids)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_llama_padding_is_refused(seed):
    config = tiny_llama_config(num_hidden_layers=1)
    model = model_variants(config, [(torch.float32, hf.NAME)], "cpu", seed)[(torch.float32, hf.NAME)]
    input_ids = torch.randint(0, config.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :2] = 0
    with pytest.raises(flash3.Flash3Unsupported, match="padding"):
        model(input_ids=input_ids, attention_mask=mask)
