"""Small transformers models from configs with random weights (no
downloads): Llama-style, and gpt-oss-style with learnable sinks, built in
several (dtype, attention implementation) variants that share the same
weights, for the transformers integration tests."""

import copy

import torch

import flash3.hf_transformers


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    # head_dim 64, GQA (8 query heads over 2 KV heads), two layers.
    settings = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=4096, attention_dropout=0.0, tie_word_embeddings=False)
    settings.update(overrides)
    return LlamaConfig(**settings)


def tiny_gpt_oss_config(**overrides):
    from transformers import GptOssConfig

    # Sinks in every layer; full attention unless layer_types says otherwise;
    # one expert (no routing decisions that could flip between dtypes).
    settings = dict(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                    num_local_experts=1, num_experts_per_tok=1,
                    layer_types=["full_attention"] * 2, max_position_embeddings=4096,
                    tie_word_embeddings=False)
    settings.update(overrides)
    return GptOssConfig(**settings)


def model_variants(config, variants, device, seed):
    """{(dtype, attn_implementation): model} of the causal LM for `config`
    (Llama or gpt-oss), all with the weights of one random fp32
    initialization (seeded), in training mode."""
    from transformers import GptOssConfig, GptOssForCausalLM, LlamaForCausalLM

    model_class = GptOssForCausalLM if isinstance(config, GptOssConfig) else LlamaForCausalLM
    flash3.hf_transformers.register()
    torch.manual_seed(seed)
    weights = model_class(config).state_dict()
    models = {}
    for dtype, attn in variants:
        # A copy each: _from_config sets the implementation on the config it is given.
        model = model_class._from_config(copy.deepcopy(config), attn_implementation=attn,
                                         dtype=dtype)
        assert model.config._attn_implementation == attn
        model.load_state_dict(weights)
        models[(dtype, attn)] = model.to(device).train()
    return models


def logits_and_grads(model, input_ids, labels):
    """Logits of one forward and the parameter gradients of its loss."""
    model.zero_grad(set_to_none=True)
    result = model(input_ids=input_ids, labels=labels)
    result.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return result.logits, grads
