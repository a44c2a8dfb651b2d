"""flash3 as an attention implementation of Hugging Face transformers.

    import flash3.hf_transformers
    flash3.hf_transformers.register()          # once per process
    model = AutoModelForCausalLM.from_config(config, attn_implementation="f3_attention")

register() adds an attention function to `transformers.AttentionInterface`
and a mask function to `transformers.masking_utils.AttentionMaskInterface`
under the same name. Both are needed: transformers builds no mask at all for
a name without a mask function, so padding would silently be ignored.

What flash3 computes today is dense causal or full attention over the whole
key sequence (GQA/MQA included, seqlen_q != seqlen_k aligned bottom-right,
as in decoding with a dynamic cache). Anything else a model may ask for
raises `flash3.Flash3Unsupported` naming it, instead of computing something
else: padding masks, packed sequences and other mask patterns, attention
dropout, sliding windows, softcapping, sinks, a static cache's padded keys.
"""

from . import _lib

# Not "flash3": transformers treats every name containing "flash" as a
# FlashAttention-2/3 kernel and routes it through its own flash code path.
NAME = "f3_attention"

# Keyword arguments that change what attention computes; transformers passes
# them only when a model uses the feature.
_REFUSED_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks")


def _unsupported(what):
    return _lib.Flash3Unsupported(_lib.Status.UNSUPPORTED,
                                  f"flash3 attention for transformers: {what} is not supported")


def flash3_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                          mask_function=None, attention_mask=None, **kwargs):
    """The mask function transformers calls for `attn_implementation=NAME`.

    Returns None when attention is plain causal (decoders) or full
    (encoders) over every key, which is what the kernel does without a mask;
    else the 2-d padding mask, which the attention function refuses. Other
    mask patterns (sliding windows, packed sequences, chunked or custom
    masks) are refused here."""
    from transformers import masking_utils

    plain = (masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function)
    if mask_function not in plain:
        raise _unsupported(f"mask pattern {getattr(mask_function, '__name__', mask_function)!r} "
                           f"(only plain causal or bidirectional masks)")
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    # Keys beyond the mask (a static cache) or padded ones: the kernel cannot skip them.
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def flash3_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                             scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: query (b, h_q, s_q, d),
    key/value (b, h_kv, s_k, d), returns (output (b, s_q, h_q, d), None)."""
    from . import ops

    if attention_mask is not None:
        raise _unsupported("an attention mask with padding (or a static cache's unused keys)")
    if dropout:
        raise _unsupported(f"attention dropout {dropout}")
    for name in _REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise _unsupported(f"{name}={kwargs[name]!r}")
    if getattr(module, "sliding_window", None) is not None:
        raise _unsupported(f"sliding_window={module.sliding_window!r} on {type(module).__name__}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # (b, h, s, d) -> (b, s, h, d) is a view; flash3 takes any strides with a contiguous last dim.
    out = ops.flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              softmax_scale=scaling, causal=bool(causal))
    return out, None


def register(name=NAME):
    """Registers flash3's attention and mask functions with transformers
    under `name` (default NAME, "f3_attention"); returns the name for
    `attn_implementation=`. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, flash3_attention_forward)
    AttentionMaskInterface.register(name, flash3_attention_mask)
    return name
