"""Llama-style and gpt-oss-style transformers models (random weights from a
config, no downloads) with flash3 as their attention implementation, against
the same weights with transformers' own attention (SDPA for Llama, eager for
gpt-oss, whose sinks SDPA lacks): logits, one training step's gradients (the
sinks' included), and a decoding step with a KV cache, under the DESIGN.md 3
rule (fp32 is the reference, bf16 the low-precision baseline)."""

import pytest

from hopper import require_hopper

torch = require_hopper()
pytest.importorskip("transformers")

import flash3.hf_transformers as hf  # noqa: E402

from attention_checks import assert_rule, require_built  # noqa: E402
from hf_models import (  # noqa: E402
    logits_and_grads, model_variants, tiny_gpt_oss_config, tiny_llama_config)

REF, LOWP, FLASH3 = "ref", "lowp", "flash3"


@pytest.fixture(params=["llama", "gpt_oss"])
def models(request, seed):
    """{REF: fp32 with transformers' attention, LOWP: the same in bf16, FLASH3: bf16 with flash3}.
    gpt-oss: sinks on both layers, a sliding window of 64 (< the tests' lengths) on one."""
    require_built("bf16", 64)
    if request.param == "llama":
        config, baseline = tiny_llama_config(), "sdpa"
    else:
        config = tiny_gpt_oss_config(sliding_window=64,
                                     layer_types=["sliding_attention", "full_attention"])
        baseline = "eager"
    variants = {REF: (torch.float32, baseline), LOWP: (torch.bfloat16, baseline),
                FLASH3: (torch.bfloat16, hf.NAME)}
    built = model_variants(config, list(variants.values()), "cuda", seed)
    return {name: built[variant] for name, variant in variants.items()}


def test_logits_and_training_gradients(models, seed):
    input_ids = torch.randint(0, 512, (2, 301), device="cuda")
    results = {variant: logits_and_grads(model, input_ids, input_ids)
               for variant, model in models.items()}
    (ref_logits, ref_grads), (lowp_logits, lowp_grads) = results[REF], results[LOWP]
    logits, grads = results[FLASH3]
    assert_rule("logits", logits, ref_logits, lowp_logits, seed)
    assert len(grads) == len(ref_grads)
    for name, grad in grads.items():
        assert grad is not None, name
        assert_rule(f"grad {name}", grad, ref_grads[name], lowp_grads[name], seed)


@torch.no_grad()
def test_decoding_step_with_kv_cache(models, seed):
    # Prefill, then one token against the cache: seqlen_q (1) != seqlen_k.
    input_ids = torch.randint(0, 512, (3, 129), device="cuda")
    logits = {}
    for variant, model in models.items():
        model.eval()
        past = model(input_ids=input_ids[:, :-1], use_cache=True).past_key_values
        logits[variant] = model(input_ids=input_ids[:, -1:], past_key_values=past).logits
    assert_rule("decode logits", logits[FLASH3], logits[REF], logits[LOWP], seed)

