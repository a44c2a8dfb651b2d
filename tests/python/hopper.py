"""The module-level gate of the GPU test files: `torch = require_hopper()`
skips the whole module unless torch sees a Hopper (sm_90) GPU."""

import pytest


def require_hopper():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"flash3 needs sm_90; found {torch.cuda.get_device_name()}",
                    allow_module_level=True)
    return torch
