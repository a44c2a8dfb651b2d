"""flash3 as the attention of a Hugging Face transformers model.

    PYTHONPATH=python python examples/transformers_llama.py

Builds a small Llama-style model from a config (random weights, nothing
downloaded), runs a training step and a short greedy generation with flash3
attention, and prints how far its logits are from the same model on SDPA.
Needs torch, transformers and a Hopper GPU.
"""

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import flash3.hf_transformers


def main():
    attn = flash3.hf_transformers.register()  # "f3_attention"
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                         head_dim=64, max_position_embeddings=8192)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation=attn,
                                          dtype=torch.bfloat16).cuda()
    reference = LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="sdpa",
                                              dtype=torch.bfloat16).cuda()
    reference.load_state_dict(model.state_dict())

    input_ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    print(f"training step with {attn}: loss {loss.item():.4f}")

    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        ours = model(input_ids=input_ids).logits.float()
        theirs = reference(input_ids=input_ids).logits.float()
    print(f"max |logits({attn}) - logits(sdpa)| = {(ours - theirs).abs().max().item():.3e} "
          f"(logits up to {theirs.abs().max().item():.2f}; both bf16)")

    prompt = input_ids[:1, :64]
    generated = model.generate(prompt, max_new_tokens=16, do_sample=False)
    print(f"greedy generation with a KV cache: {generated.shape[1] - prompt.shape[1]} new tokens")


if __name__ == "__main__":
    main()
