"""ctypes binding to the flash3 C ABI (include/flash3/flash3.h).

Deliberately torch-free: the C ABI tests and `python -m flash3.info` run
without torch, and the same libflash3.so serves any torch version.
"""

import ctypes
import enum
import os
import pathlib
import struct
import threading

# Must equal FLASH3_ABI_VERSION in flash3.h; the structs below mirror that version.
ABI_VERSION = 10

_LIBRARY_NAME = "libflash3.so"
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


class Status(enum.IntEnum):
    """flash3_status."""

    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    CUDA = 3
    INTERNAL = 4


class DType(enum.IntEnum):
    """flash3_dtype."""

    FLOAT16 = 0
    BFLOAT16 = 1
    FLOAT8_E4M3 = 2
    FLOAT32 = 3  # flash3_combine's output only


class Flash3Error(RuntimeError):
    """A flash3 call failed. `status` is the Status, `message` the library's text."""

    def __init__(self, status, message):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.message = message
        super().__init__(message)


class Flash3InvalidArgument(Flash3Error, ValueError):
    """The caller passed something wrong (FLASH3_ERROR_INVALID_ARGUMENT)."""


class Flash3Unsupported(Flash3Error):
    """Valid, but not built or not supported here (dtype, head dim, GPU)."""


class Flash3CudaError(Flash3Error):
    """A CUDA runtime call inside flash3 failed."""


class Flash3LibraryNotFound(Flash3Error, OSError):
    """libflash3.so could not be found or loaded."""


_ERROR_CLASSES = {
    Status.INVALID_ARGUMENT: Flash3InvalidArgument,
    Status.UNSUPPORTED: Flash3Unsupported,
    Status.CUDA: Flash3CudaError,
}


class Tensor(ctypes.Structure):
    """flash3_tensor: (batch, seqlen, heads, headdim), strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("stride", ctypes.c_int64 * 4),
    ]


class Fp8Scale(ctypes.Structure):
    """flash3_fp8_scale: fp32 scales indexed (batch, head, block), strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("stride", ctypes.c_int64 * 3),
    ]


class FwdParams(ctypes.Structure):
    """flash3_fwd_params, field for field (same order, same C types)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("lse", ctypes.POINTER(ctypes.c_float)),
        ("dtype", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("seqlen_q", ctypes.c_int32),
        ("seqlen_k", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("v1_padding", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_q", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int32),
        ("total_k", ctypes.c_int32),
        ("q_scale", Fp8Scale),
        ("k_scale", Fp8Scale),
        ("v_scale", Fp8Scale),
        ("kv_batch_idx", ctypes.c_void_p),
        ("leftpad_k", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p),
        ("page_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int32),
        ("cache_batch", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("v7_padding", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        # v8: append with rotary
        ("k_new", Tensor),
        ("v_new", Tensor),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("seqlen_new", ctypes.c_int32),
        ("rotary_dim", ctypes.c_int32),
        ("rotary_seqlen", ctypes.c_int32),
        ("rotary_interleaved", ctypes.c_int32),
        ("rotary_q_per_row", ctypes.c_int32),
        ("pack_gqa", ctypes.c_int32),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_slopes_batch_stride", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int32),
        ("v10_padding", ctypes.c_int32),
    ]

    def __init__(self, **fields):
        # The C defaults (flash3_fwd_params_init): windows unbounded.
        fields = {"window_left": -1, "window_right": -1, **fields}
        super().__init__(struct_size=ctypes.sizeof(FwdParams), **fields)


class CombineParams(ctypes.Structure):
    """flash3_combine_params, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("out_partial", ctypes.c_void_p),
        ("out_partial_stride", ctypes.c_int64 * 5),
        ("lse_partial", ctypes.c_void_p),
        ("lse_partial_stride", ctypes.c_int64 * 4),
        ("out", Tensor),
        ("out_dtype", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("lse", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("batch", ctypes.c_int32),
        ("seqlen", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
    ]

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(CombineParams), **fields)


class BwdParams(ctypes.Structure):
    """flash3_bwd_params, field for field (same order, same C types)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("dout", Tensor),
        ("lse", ctypes.c_void_p),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("dtype", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("seqlen_q", ctypes.c_int32),
        ("seqlen_k", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
        ("dsinks", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_q", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int32),
        ("total_k", ctypes.c_int32),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_slopes_batch_stride", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int32),
        ("v10_padding", ctypes.c_int32),
    ]

    def __init__(self, **fields):
        fields = {"window_left": -1, "window_right": -1, **fields}
        super().__init__(struct_size=ctypes.sizeof(BwdParams), **fields)


class QuantizeFp8Params(ctypes.Structure):
    """flash3_quantize_fp8_params, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("dtype", ctypes.c_int32),
        ("scaling", ctypes.c_int32),
        ("q_out", Tensor),
        ("k_out", Tensor),
        ("vt_out", Tensor),
        ("q_scale", ctypes.c_void_p),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
        ("batch", ctypes.c_int32),
        ("seqlen_q", ctypes.c_int32),
        ("seqlen_k", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("hadamard_signs", ctypes.c_void_p),
    ]

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(QuantizeFp8Params), **fields)


# The hot path fills FwdParams with one struct.pack_into call instead of ~30
# ctypes attribute stores (each a few hundred ns; nested-struct access also
# allocates a proxy object). Layout: struct_size, then q, k, v, out as
# (pointer, 4 x int64), then the lse pointer, the scalars, the sinks pointer, and
# varlen's four pointers and two totals. Native alignment ('@') reproduces the C
# layout; checked against FwdParams below. v1_padding is a pad ('4x'), not a value.
_FWD_PACKER = struct.Struct(
    "@Q" + "P4q" * 4 + "P" + "7i" + "f" + "i" + "4x" + "2i" + "f" + "P" + "4P" + "2i")


# The KV-cache fields, packed at kv_batch_idx's offset: the batch index,
# leftpad and page table pointers, the page table's row stride, page_size,
# cache_batch, num_splits, v7_padding (a pad), the workspace and its size;
# then append's k_new and v_new (data and 4 strides each), the rotary
# tables, seqlen_new, rotary_dim, rotary_seqlen, rotary_interleaved,
# rotary_q_per_row and pack_gqa.
_FWD_CACHE_PACKER = struct.Struct("@3Pq3i4xPQ" + "P4q" * 2 + "2P" + "6i")

# ALiBi's slopes pointer and batch stride, then head_dim_v (0: head_dim),
# packed on every call at alibi_slopes' offset.
_FWD_TAIL_PACKER = struct.Struct("@Pqi")
NO_ALIBI = (0, 0)


def _check_packer_layout():
    # calcsize has no tail padding; everything before it must line up exactly.
    for packer, first, last in ((_FWD_PACKER, None, FwdParams.total_k),
                                (_FWD_CACHE_PACKER, FwdParams.kv_batch_idx,
                                 FwdParams.pack_gqa),
                                (_FWD_TAIL_PACKER, FwdParams.alibi_slopes,
                                 FwdParams.head_dim_v)):
        start = 0 if first is None else first.offset
        if packer.size != last.offset + last.size - start:
            raise ImportError(
                f"flash3: internal layout mismatch: packer {packer.size} bytes, "
                f"flash3_fwd_params' fields span {last.offset + last.size - start}")


_check_packer_layout()


def find_library():
    """Path of libflash3.so, or None. Order: $FLASH3_LIBRARY, the package
    directory (where `pip install .` puts it), then <repo>/build/ for a
    source checkout used in place."""
    env = os.environ.get("FLASH3_LIBRARY")
    if env:
        return pathlib.Path(env)  # explicit choice: no silent fallback
    for candidate in (
        _PACKAGE_DIR / _LIBRARY_NAME,
        _PACKAGE_DIR.parent.parent / "build" / _LIBRARY_NAME,
    ):
        if candidate.is_file():
            return candidate
    return None


_lock = threading.Lock()
_lib = None
_lib_path = None


def _declare(lib):
    lib.flash3_fwd_params_init.argtypes = [ctypes.POINTER(FwdParams)]
    lib.flash3_fwd_params_init.restype = None
    # params passed as a plain address: cheaper per call than byref() checks.
    lib.flash3_fwd.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.flash3_fwd.restype = ctypes.c_int
    lib.flash3_bwd_params_init.argtypes = [ctypes.POINTER(BwdParams)]
    lib.flash3_bwd_params_init.restype = None
    lib.flash3_bwd_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    lib.flash3_bwd_workspace_size.restype = ctypes.c_int
    lib.flash3_bwd.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.flash3_bwd.restype = ctypes.c_int
    lib.flash3_quantize_fp8.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.flash3_quantize_fp8.restype = ctypes.c_int
    lib.flash3_fwd_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    lib.flash3_fwd_workspace_size.restype = ctypes.c_int
    lib.flash3_combine.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.flash3_combine.restype = ctypes.c_int
    lib.flash3_last_error.argtypes = []
    lib.flash3_last_error.restype = ctypes.c_char_p
    lib.flash3_abi_version.argtypes = []
    lib.flash3_abi_version.restype = ctypes.c_int
    lib.flash3_version.argtypes = []
    lib.flash3_version.restype = ctypes.c_char_p
    lib.flash3_build_info.argtypes = []
    lib.flash3_build_info.restype = ctypes.c_char_p


def library():
    """The loaded libflash3 (ctypes.CDLL), loaded once."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = find_library()
            if path is None:
                raise Flash3LibraryNotFound(
                    Status.INTERNAL,
                    f"flash3: {_LIBRARY_NAME} not found; set FLASH3_LIBRARY to its path, "
                    f"install the package (pip install .), or build it into "
                    f"{_PACKAGE_DIR.parent.parent / 'build'}",
                )
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise Flash3LibraryNotFound(
                    Status.INTERNAL, f"flash3: cannot load {path}: {e}"
                ) from e
            _declare(lib)
            abi = lib.flash3_abi_version()
            if abi != ABI_VERSION:
                raise Flash3LibraryNotFound(
                    Status.INTERNAL,
                    f"flash3: {path} has ABI version {abi}; this Python package "
                    f"expects {ABI_VERSION}",
                )
            _lib_path = path
            _lib = lib
    return _lib


def library_path():
    """Path of the loaded library (loads it if needed)."""
    library()
    return _lib_path


def last_error():
    return library().flash3_last_error().decode("utf-8", "replace")


def raise_for_status(status):
    """Raise the Flash3Error subclass for a non-OK status, with the library's message."""
    if status == Status.OK:
        return
    message = last_error()
    raise _ERROR_CLASSES.get(status, Flash3Error)(status, message)


def version():
    return library().flash3_version().decode()


def abi_version():
    return library().flash3_abi_version()


def build_info():
    return library().flash3_build_info().decode()


def params_init():
    """A FwdParams filled by the library's own flash3_fwd_params_init."""
    params = FwdParams()
    library().flash3_fwd_params_init(ctypes.byref(params))
    return params


def fwd(params, stream=None):
    """flash3_fwd on a FwdParams; raises Flash3Error on failure."""
    raise_for_status(library().flash3_fwd(ctypes.addressof(params), stream))


def quantize_fp8(params, stream=None):
    """flash3_quantize_fp8 on a QuantizeFp8Params; raises Flash3Error on failure."""
    raise_for_status(library().flash3_quantize_fp8(ctypes.addressof(params), stream))


def combine(params, stream=None):
    """flash3_combine on a CombineParams; raises Flash3Error on failure."""
    raise_for_status(library().flash3_combine(ctypes.addressof(params), stream))


def bwd_workspace_size(params):
    """Bytes of workspace flash3_bwd needs for a BwdParams' sizes."""
    size = ctypes.c_uint64(0)
    raise_for_status(
        library().flash3_bwd_workspace_size(ctypes.addressof(params), ctypes.byref(size)))
    return size.value


def bwd(params, stream=None):
    """flash3_bwd on a BwdParams; raises Flash3Error on failure."""
    raise_for_status(library().flash3_bwd(ctypes.addressof(params), stream))


class FwdLauncher:
    """Fast path for repeated flash3_fwd calls: one reusable FwdParams per
    thread, filled with a single struct.pack_into, and a cached C function.
    flash3_fwd reads params only during the call, so reuse is safe. An
    instance made with with_cache=True also packs the KV-cache fields (so
    they never leak from one call into a plain launcher's next)."""

    def __init__(self, with_cache=False):
        lib = library()
        self._fwd = lib.flash3_fwd
        self._workspace_size = lib.flash3_fwd_workspace_size
        self._local = threading.local()
        self._size = ctypes.sizeof(FwdParams)
        self._with_cache = with_cache

    def _params(self):
        """(FwdParams, its address) for this thread."""
        cached = getattr(self._local, "params", None)
        if cached is None:
            params = FwdParams()
            cached = self._local.params = (params, ctypes.addressof(params))
        return cached

    def _pack(self, fields, cache, alibi, head_dim_v):
        params, address = self._params()
        try:
            _FWD_PACKER.pack_into(params, 0, self._size, *fields)
            if self._with_cache:
                _FWD_CACHE_PACKER.pack_into(params, FwdParams.kv_batch_idx.offset, *cache)
            _FWD_TAIL_PACKER.pack_into(params, FwdParams.alibi_slopes.offset, *alibi, head_dim_v)
        except struct.error as e:
            # A size or stride that does not fit the ABI's int32/int64 fields.
            raise Flash3InvalidArgument(
                Status.INVALID_ARGUMENT,
                f"flash3: a size or stride does not fit the C ABI (sizes are int32, strides "
                f"int64): {e}; sizes (batch, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, "
                f"head_dim) = {tuple(fields[22:28])}",
            ) from None
        return address

    def __call__(self, stream, fields, cache=(), alibi=NO_ALIBI, head_dim_v=0):
        """`fields`: the values of FwdParams after struct_size, in order, with
        each tensor flattened to (data, stride0, stride1, stride2, stride3)
        and lse, sinks and varlen's arrays as addresses (0 for NULL); `cache`
        (with_cache only): the fields from kv_batch_idx to pack_gqa, the
        padding left out; `alibi`: (alibi_slopes address, its batch stride);
        `head_dim_v`: v's and out's head dim (0: q's)."""
        status = self._fwd(self._pack(fields, cache, alibi, head_dim_v), stream)
        if status:
            raise_for_status(status)

    def workspace_size(self, fields, cache=(), alibi=NO_ALIBI, head_dim_v=0):
        """flash3_fwd_workspace_size of the same fields (workspace ignored)."""
        size = ctypes.c_uint64(0)
        raise_for_status(self._workspace_size(self._pack(fields, cache, alibi, head_dim_v),
                                              ctypes.byref(size)))
        return size.value
