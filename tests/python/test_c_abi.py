"""The C ABI through ctypes, without torch and without a GPU.

Every bad-argument case is rejected by validation, which runs before any CUDA
call, so fake (never dereferenced) device addresses are safe here. Each case
changes exactly one thing in an otherwise valid call: a test that sent valid
parameters with fake pointers would launch a kernel on them on a GPU machine.
"""

import ctypes
import math
import re

import pytest

from flash3 import _lib
from flash3._version import __version__

if _lib.find_library() is None:
    pytest.skip("libflash3.so not found (set FLASH3_LIBRARY or build into build/)",
                allow_module_level=True)

FAKE_Q, FAKE_K, FAKE_V, FAKE_OUT, FAKE_LSE = 0x100000, 0x200000, 0x300000, 0x400000, 0x500000


def _built():
    """A (dtype, head_dim) this library was built with, from flash3_build_info()."""
    info = _lib.build_info()
    dtypes = re.search(r"dtypes=([\w,]+)", info).group(1).split(",")
    head_dims = re.search(r"head_dims=([\d,]+)", info).group(1).split(",")
    dtype = {"bf16": _lib.DType.BFLOAT16, "fp16": _lib.DType.FLOAT16}[dtypes[0]]
    return dtype, int(head_dims[0])


def _set_tensor(t, data, seqlen, heads, head_dim):
    t.data = data
    t.stride[:] = (seqlen * heads * head_dim, heads * head_dim, head_dim, 1)


def valid_params(batch=2, seqlen_q=128, seqlen_k=256, num_heads_q=8, num_heads_kv=2):
    dtype, head_dim = _built()
    p = _lib.params_init()
    _set_tensor(p.q, FAKE_Q, seqlen_q, num_heads_q, head_dim)
    _set_tensor(p.k, FAKE_K, seqlen_k, num_heads_kv, head_dim)
    _set_tensor(p.v, FAKE_V, seqlen_k, num_heads_kv, head_dim)
    _set_tensor(p.out, FAKE_OUT, seqlen_q, num_heads_q, head_dim)
    p.lse = ctypes.cast(FAKE_LSE, ctypes.POINTER(ctypes.c_float))
    p.dtype = dtype
    p.batch, p.seqlen_q, p.seqlen_k = batch, seqlen_q, seqlen_k
    p.num_heads_q, p.num_heads_kv, p.head_dim = num_heads_q, num_heads_kv, head_dim
    return p


def call(params):
    status = _lib.library().flash3_fwd(ctypes.addressof(params), None)
    return _lib.Status(status), _lib.last_error()


def test_version_matches_package():
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", _lib.version())
    assert _lib.version() == __version__


def test_abi_version():
    assert _lib.abi_version() == _lib.ABI_VERSION == 10


def test_build_info_lists_configurations():
    info = _lib.build_info()
    assert re.search(r"dtypes=(bf16|fp16)(,(bf16|fp16|e4m3))*\b", info), info
    assert re.search(r"head_dims=\d+(,\d+)*\b", info), info
    assert "arch=sm_90a" in info, info


def test_struct_layout_matches_header():
    # 8 (struct_size) + 4 tensors * 40 + 8 (lse) + 12 * 4 (scalars) = 224, padded to 8;
    # each version's fields start where the previous version's struct ended.
    assert ctypes.sizeof(_lib.Tensor) == 40
    assert ctypes.sizeof(_lib.FwdParams) == 584
    assert _lib.FwdParams.head_dim_v.offset == 576
    assert _lib.FwdParams.alibi_slopes.offset == 560
    assert _lib.FwdParams.k_new.offset == 440
    assert ctypes.sizeof(_lib.BwdParams) == 488
    assert _lib.BwdParams.head_dim_v.offset == 480
    assert _lib.BwdParams.alibi_slopes.offset == 464
    assert _lib.BwdParams.cu_seqlens_q.offset == 424
    assert _lib.FwdParams.sinks.offset == 232
    assert _lib.FwdParams.cu_seqlens_q.offset == 240
    assert _lib.FwdParams.q_scale.offset == 280
    assert _lib.BwdParams.sinks.offset == 408
    assert _lib.FwdParams.lse.offset == 168
    assert _lib.FwdParams.causal.offset == 208
    assert _lib.FwdParams.window_left.offset == 216
    assert _lib.BwdParams.window_left.offset == 392


def test_params_init_sets_defaults():
    p = _lib.FwdParams()
    ctypes.memset(ctypes.addressof(p), 0xAB, ctypes.sizeof(p))
    _lib.library().flash3_fwd_params_init(ctypes.byref(p))
    assert p.struct_size == ctypes.sizeof(_lib.FwdParams)
    raw = ctypes.string_at(ctypes.addressof(p) + 8, _lib.FwdParams.causal.offset + 4 - 8)
    assert raw == bytes(len(raw))
    assert (p.window_left, p.window_right, p.softcap, p.sinks) == (-1, -1, 0.0, None)
    # The Python constructors use the same defaults.
    assert bytes(_lib.FwdParams()) == bytes(p)
    b = _lib.BwdParams()
    _lib.library().flash3_bwd_params_init(ctypes.byref(b))
    assert bytes(_lib.BwdParams()) == bytes(b)


def test_packer_fills_the_same_bytes_as_ctypes_fields():
    # The fast path (FwdLauncher) packs with struct; it must equal field stores.
    by_fields = valid_params()
    by_fields.softmax_scale, by_fields.causal = 0.125, 1
    by_fields.window_left, by_fields.window_right, by_fields.softcap = 100, 0, 30.0
    by_fields.sinks = 0x7F0000001000
    by_fields.cu_seqlens_q, by_fields.cu_seqlens_k = 0x7F0000002000, 0x7F0000003000
    by_fields.seqused_q, by_fields.seqused_k = 0x7F0000004000, 0x7F0000005000
    by_fields.total_q, by_fields.total_k = 1234, 5678
    packed = _lib.FwdParams()
    p = by_fields
    tensors = [(t.data, tuple(t.stride)) for t in (p.q, p.k, p.v, p.out)]
    _lib._FWD_PACKER.pack_into(
        packed, 0, p.struct_size, *(x for data, s in tensors for x in (data, *s)),
        ctypes.cast(p.lse, ctypes.c_void_p).value, p.dtype, p.batch, p.seqlen_q, p.seqlen_k,
        p.num_heads_q, p.num_heads_kv, p.head_dim, p.softmax_scale, p.causal,
        p.window_left, p.window_right, p.softcap, p.sinks, p.cu_seqlens_q, p.cu_seqlens_k,
        p.seqused_q, p.seqused_k, p.total_q, p.total_k)
    assert bytes(packed) == bytes(by_fields)


def _null_q(p):
    p.q.data = None


def _struct_size(p):
    p.struct_size = 8


def _head_dim_48(p):
    p.head_dim = 48
    for t in (p.q, p.k, p.v, p.out):
        t.stride[2] = 48


def _heads_not_divisible(p):
    p.num_heads_q, p.num_heads_kv = 12, 5


def _q_last_stride(p):
    p.q.stride[3] = 2


def _q_misaligned(p):
    p.q.data = 0x1002


def _dtype_7(p):
    p.dtype = 7


def _batch_negative(p):
    p.batch = -1


def _k_heads_stride_not_16_bytes(p):
    p.k.stride[2] = p.head_dim + 1


def _v_negative_stride(p):
    p.v.stride[1] = -p.v.stride[1]


def _out_null(p):
    p.out.data = None


def _scale_nan(p):
    p.softmax_scale = math.nan


def _window_left_negative(p):
    p.window_left = -5


def _causal_window_right(p):
    p.causal, p.window_right = 1, 3


def _softcap_negative(p):
    p.softcap = -2.0


def _lse_misaligned(p):
    p.lse = ctypes.cast(FAKE_LSE + 2, ctypes.POINTER(ctypes.c_float))


INVALID, UNSUPPORTED = _lib.Status.INVALID_ARGUMENT, _lib.Status.UNSUPPORTED

# (break one thing, expected status, substrings the message must contain:
#  the argument's name and the value given)
BAD_CASES = {
    "null_q": (_null_q, INVALID, ["q", "NULL"]),
    "struct_size": (_struct_size, INVALID, ["struct_size", "8"]),
    "head_dim_48": (_head_dim_48, UNSUPPORTED, ["head_dim", "48"]),
    "heads_not_divisible": (_heads_not_divisible, INVALID, ["num_heads_q", "num_heads_kv", "12", "5"]),
    "q_stride3": (_q_last_stride, INVALID, ["q", "stride", "2"]),
    "q_misaligned": (_q_misaligned, INVALID, ["q", "aligned", "0x1002"]),
    "dtype_7": (_dtype_7, INVALID, ["dtype", "7"]),
    "batch_negative": (_batch_negative, INVALID, ["batch", "-1"]),
    "k_stride_alignment": (_k_heads_stride_not_16_bytes, INVALID, ["k", "stride"]),
    "v_negative_stride": (_v_negative_stride, INVALID, ["v", "stride"]),
    "out_null": (_out_null, INVALID, ["out", "NULL"]),
    "scale_nan": (_scale_nan, INVALID, ["softmax_scale", "nan"]),
    "lse_misaligned": (_lse_misaligned, INVALID, ["lse", "aligned"]),
    "window_left": (_window_left_negative, INVALID, ["window_left", "-5"]),
    "causal_window_right": (_causal_window_right, INVALID, ["window_right", "causal", "3"]),
    "softcap": (_softcap_negative, INVALID, ["softcap", "-2"]),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_argument_is_rejected_with_a_message(case):
    breaker, status, needles = BAD_CASES[case]
    p = valid_params()
    breaker(p)
    got_status, message = call(p)
    assert got_status == status, message
    for needle in needles:
        assert needle.lower() in message.lower(), f"{needle!r} not in {message!r}"


def test_k_stride_message_names_the_value():
    p = valid_params()
    _k_heads_stride_not_16_bytes(p)
    _, message = call(p)
    assert str(p.head_dim + 1) in message, message


def test_null_params_pointer():
    status = _lib.Status(_lib.library().flash3_fwd(None, None))
    assert status == INVALID
    assert "params" in _lib.last_error()


def test_raise_for_status_maps_to_exception_classes():
    p = valid_params()
    _q_misaligned(p)
    with pytest.raises(_lib.Flash3InvalidArgument) as info:
        _lib.fwd(p)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert info.value.status == INVALID and "0x1002" in str(info.value)

    p = valid_params()
    _head_dim_48(p)
    with pytest.raises(_lib.Flash3Unsupported) as info:
        _lib.fwd(p)
    assert info.value.status == UNSUPPORTED and "48" in info.value.message


def _launcher_fields(q_data, batch, head_dim, dtype):
    s = (128 * 8 * head_dim, 8 * head_dim, head_dim, 1)
    return (q_data, *s, FAKE_K, *s, FAKE_V, *s, FAKE_OUT, *s, 0, dtype,
            batch, 128, 128, 8, 8, head_dim, 0.0, 0, -1, -1, 0.0, 0, 0, 0, 0, 0, 0, 0)


def test_launcher_reports_errors():
    launcher = _lib.FwdLauncher()
    dtype, head_dim = _built()
    with pytest.raises(_lib.Flash3InvalidArgument, match="0x1002"):
        launcher(None, _launcher_fields(0x1002, 1, head_dim, dtype))
    with pytest.raises(_lib.Flash3InvalidArgument, match=r"int32.*2147483648"):
        launcher(None, _launcher_fields(FAKE_Q, 2**31, head_dim, dtype))
