"""flash3: exact attention for NVIDIA Hopper (FlashAttention-3 style).

Importing flash3 needs neither torch nor the shared library; the torch
entry points load on first use, so `import flash3` stays cheap and works in
torch-free environments (C ABI tests, `python -m flash3.info`).
"""

from ._lib import (
    Flash3CudaError,
    Flash3Error,
    Flash3InvalidArgument,
    Flash3LibraryNotFound,
    Flash3Unsupported,
)
from ._version import __version__

# Public names that need torch, resolved lazily (PEP 562).
_TORCH_ATTRIBUTES = {
    "flash_attn_func": "ops",
    "flash_attn_varlen_func": "varlen",
    "attention_ref": "reference",
    "fp8_attention": "fp8",
    "quantize_fp8": "fp8",
    "fp8_forward": "fp8",
    "flash_attn_fp8": "fp8",
    "flash_attn_with_kvcache": "kvcache",
    "flash_attn_combine": "kvcache",
}


def __getattr__(name):
    module_name = _TORCH_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'flash3' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(list(globals()) + list(_TORCH_ATTRIBUTES))


__all__ = [
    "__version__",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "attention_ref",
    "fp8_attention",
    "quantize_fp8",
    "fp8_forward",
    "flash_attn_fp8",
    "Flash3Error",
    "Flash3InvalidArgument",
    "Flash3Unsupported",
    "Flash3CudaError",
    "Flash3LibraryNotFound",
]
