"""`python -m flash3.info`: what flash3 is installed, and what GPU it would run on.

Works without torch and without a GPU, so it is the first thing to run when
something does not load.
"""

import sys

from . import _lib
from ._version import __version__


def _gpu_lines():
    try:
        import torch
    except ImportError:
        return ["gpu: unknown (no torch)"]
    lines = [f"torch: {torch.__version__} (CUDA {torch.version.cuda})"]
    if not torch.cuda.is_available():
        return lines + ["gpu: no CUDA device found"]
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        hopper = "" if (props.major, props.minor) == (9, 0) else "  (flash3 needs sm_90)"
        lines.append(
            f"gpu {index}: {props.name}, sm_{props.major}{props.minor}, "
            f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB{hopper}"
        )
    return lines


def main():
    print(f"flash3 (python package): {__version__}")
    ok = True
    try:
        print(f"library: {_lib.library_path()}")
        print(f"library version: {_lib.version()}")
        print(f"ABI version: {_lib.abi_version()} (package expects {_lib.ABI_VERSION})")
        print(f"build: {_lib.build_info()}")
        if _lib.version() != __version__:
            print(f"warning: library version {_lib.version()} != package version {__version__}")
    except _lib.Flash3Error as e:
        print(f"library: {e}")
        ok = False
    for line in _gpu_lines():
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
