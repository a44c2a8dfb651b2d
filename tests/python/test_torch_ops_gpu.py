"""The custom ops under torch's own checkers: torch.library.opcheck (schema,
fake tensor, autograd registration, AOT dispatch) for flash3::fwd and
flash3::bwd, and torch.export of a module that calls flash_attn_func.

Skips unless a Hopper (sm_90) GPU is visible to torch.
"""

import pytest

from hopper import require_hopper

torch = require_hopper()

import flash3  # noqa: E402

from attention_checks import _any_built, make_qkv  # noqa: E402


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_fwd(causal, seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 97, 130, 4, 2, d, dtype)
    for x in (q, k, v):
        x.requires_grad_()
    torch.library.opcheck(torch.ops.flash3.fwd.default, (q, k, v, None, causal, False))


def test_opcheck_bwd(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 97, 130, 4, 2, d, dtype)
    out, lse = torch.ops.flash3.fwd(q, k, v, None, True, True)
    dout = torch.randn_like(out)
    # Deterministic, so that opcheck's repeated runs compare equal.
    torch.library.opcheck(torch.ops.flash3.bwd.default, (dout, q, k, v, out, lse, None, True, True))


def test_export_forward(seed):
    _, dtype, d = _any_built()
    q, k, v = make_qkv(1, 64, 64, 2, 2, d, dtype)

    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return flash3.flash_attn_func(q, k, v, causal=True)

    exported = torch.export.export(Attend(), (q, k, v))
    assert "flash3.fwd" in str(exported.graph)
    assert torch.equal(exported.module()(q, k, v), Attend()(q, k, v))


def test_fa3_interface_is_flash_attn_func(seed):
    from flash3 import flash_attn_interface

    _, dtype, d = _any_built()
    q, k, v = make_qkv(2, 200, 300, 4, 2, d, dtype)
    want_out, want_lse = flash3.flash_attn_func(q, k, v, causal=True, return_lse=True)
    out, lse = flash_attn_interface.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                                    num_splits=4, pack_gqa=True, sm_margin=8)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert torch.equal(flash_attn_interface.flash_attn_func(q, k, v, causal=True), want_out)
