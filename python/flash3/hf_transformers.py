"""flash3 as an attention implementation of Hugging Face transformers.

    import flash3.hf_transformers
    flash3.hf_transformers.register()          # once per process
    model = AutoModelForCausalLM.from_config(config, attn_implementation="f3_attention")

register() adds an attention function to `transformers.AttentionInterface`
and a mask function to `transformers.masking_utils.AttentionMaskInterface`
under the same name. Both are needed: transformers builds no mask at all for
a name without a mask function, so padding would silently be ignored.

What flash3 computes here is dense causal or full attention over the whole
key sequence (GQA/MQA included, seqlen_q != seqlen_k aligned bottom-right,
as in decoding with a dynamic cache), with sinks where the model has them
(gpt-oss's `s_aux`, with their gradient), and
transformers' sliding-window causal masks (Mistral, gpt-oss) as flash3's
window. Anything else a model may ask for raises `flash3.Flash3Unsupported`
naming it, instead of computing something else: padding masks, packed
sequences and other mask patterns, attention dropout, softcapping, a static
cache's padded keys.
"""

from . import _lib

# Not "flash3": transformers treats every name containing "flash" as a
# FlashAttention-2/3 kernel and routes it through its own flash code path.
NAME = "f3_attention"

# Keyword arguments that change what attention computes; transformers passes
# them only when a model uses the feature.
_REFUSED_KWARGS = ("softcap",)


def _unsupported(what):
    return _lib.Flash3Unsupported(_lib.Status.UNSUPPORTED,
                                  f"flash3 attention for transformers: {what} is not supported")


class SlidingWindow:
    """What the mask function returns for transformers' sliding-window causal
    mask over every key: query i sees key j iff i - size < j <= i. The
    attention function runs it as causal with window (size - 1, 0)."""

    def __init__(self, size):
        self.size = size

    def __repr__(self):
        return f"SlidingWindow({self.size})"


def _sliding_window_size(mask_function, local_size):
    """local_size if mask_function is the sliding-window causal pattern of
    that size, else None. transformers builds that pattern as a closure, so
    it is recognized by what it computes: on pairs at both edges of the
    window, where any other pattern (chunked, packed, custom) differs."""
    import torch

    if not isinstance(local_size, int) or local_size < 1:
        return None
    queries = torch.tensor([local_size + 7, 3 * local_size + 1]).repeat_interleave(7)
    offsets = torch.tensor([-local_size - 1, -local_size, -local_size + 1, -1, 0, 1, 2]).repeat(2)
    keys = queries + offsets
    zeros = torch.zeros_like(queries)
    try:
        got = torch.as_tensor(mask_function(zeros, zeros, queries, keys))
    except Exception:  # a pattern that indexes data (padding, packing) by position
        return None
    want = (keys > queries - local_size) & (keys <= queries)
    return local_size if got.shape == want.shape and torch.equal(got.bool(), want) else None


def flash3_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                          mask_function=None, attention_mask=None, local_size=None, **kwargs):
    """The mask function transformers calls for `attn_implementation=NAME`.

    Returns None when attention is plain causal (decoders) or full
    (encoders) over every key, which is what the kernel does without a mask,
    a SlidingWindow for the sliding-window causal pattern; else the 2-d
    padding mask, which the attention function refuses. Other mask patterns
    (packed sequences, chunked or custom masks) are refused here."""
    from transformers import masking_utils

    plain = (masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function)
    window = None if mask_function in plain else _sliding_window_size(mask_function, local_size)
    if mask_function not in plain and window is None:
        raise _unsupported(f"mask pattern {getattr(mask_function, '__name__', mask_function)!r} "
                           f"(only plain causal, bidirectional or sliding-window causal masks)")
    no_mask = None if window is None else SlidingWindow(window)
    if attention_mask is None:
        return no_mask
    attention_mask = attention_mask[:, -kv_length:]
    # Keys beyond the mask (a static cache) or padded ones: the kernel cannot skip them.
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return no_mask
    return attention_mask


def flash3_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                             scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: query (b, h_q, s_q, d),
    key/value (b, h_kv, s_k, d), returns (output (b, s_q, h_q, d), None)."""
    from . import ops

    window = attention_mask.size if isinstance(attention_mask, SlidingWindow) else None
    if attention_mask is not None and window is None:
        raise _unsupported("an attention mask with padding (or a static cache's unused keys)")
    if dropout:
        raise _unsupported(f"attention dropout {dropout}")
    for name in _REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise _unsupported(f"{name}={kwargs[name]!r}")
    # The window comes from the mask; the layer's own setting must agree with it.
    sliding_window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if sliding_window != window:
        mask = f"a sliding-window mask of {window}" if window else "no sliding-window mask"
        raise _unsupported(f"sliding_window={sliding_window!r} on {type(module).__name__} with {mask}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if window is not None and not causal:
        raise _unsupported(f"a non-causal sliding window ({window}) on {type(module).__name__}")
    # (b, h, s, d) -> (b, s, h, d) is a view; flash3 takes any strides with a contiguous last dim.
    out = ops.flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              softmax_scale=scaling, causal=bool(causal),
                              window_size=(-1, -1) if window is None else (window - 1, 0),
                              sinks=kwargs.get("s_aux"))
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
