"""A Llama-style transformers model (random weights from a config, no
downloads) with flash3 as its attention implementation, against the same
weights with SDPA: logits, one training step's gradients, and a decoding
step with a KV cache, under the DESIGN.md 3 rule (fp32 SDPA is the
reference, bf16 SDPA the low-precision baseline)."""

import pytest

from hopper import require_hopper

torch = require_hopper()
pytest.importorskip("transformers")

import flash3.hf_transformers as hf  # noqa: E402

from attention_checks import assert_rule, require_built  # noqa: E402
from hf_models import llama_variants, logits_and_grads, tiny_llama_config  # noqa: E402

REF, LOWP, FLASH3 = (torch.float32, "sdpa"), (torch.bfloat16, "sdpa"), (torch.bfloat16, hf.NAME)


@pytest.fixture
def models(seed):
    require_built("bf16", 64)
    return llama_variants(tiny_llama_config(), [REF, LOWP, FLASH3], "cuda", seed)


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
