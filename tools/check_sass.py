#!/usr/bin/env python3
"""Checks the SASS of libflash3.so's attention kernels.

Every attention kernel (a function whose mangled name contains "fwd_kernel"
or "bwd_kernel", any case: the main forward and backward kernels, not the
small fill / preprocessing ones) must
  - use the tensor cores through WGMMA (HGMMA, or QGMMA for fp8),
  - load with TMA (UTMALDG),
  - not spill to local memory (no LDL / STL).
Prints one row per kernel; exits 1 on any failure or when no attention
kernel is found (an empty library must not pass).

cuobjdump comes from $CUOBJDUMP, PATH, or the PyPI package
nvidia-cuda-cuobjdump; it needs nvdisasm (PyPI: nvidia-cuda-nvdisasm).

    python tools/check_sass.py build/libflash3.so
    python tools/check_sass.py --self-test
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

FUNCTION_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
# "/*0a30*/   @!UP0 HGMMA.64x128x16.F32.BF16 ..." -> "HGMMA"
INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")

GMMA = ("HGMMA", "QGMMA")
TMA_LOAD = "UTMALDG"
SPILLS = ("LDL", "STL")


def pip_tool_dirs():
    """bin/ folders of the nvidia-* PyPI packages (nvidia/cu13/bin, ...)."""
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    try:
        import site
        roots.update(site.getsitepackages())
    except AttributeError:  # virtualenvs without getsitepackages
        pass
    dirs = []
    for root in sorted(roots):
        dirs += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "bin")), reverse=True)
        dirs += glob.glob(os.path.join(root, "nvidia", "cuda_cuobjdump", "bin"))
    return dirs


def find_cuobjdump():
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    for d in pip_tool_dirs():
        candidate = os.path.join(d, "cuobjdump")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def dump_sass(cuobjdump, library):
    env = dict(os.environ)
    # cuobjdump runs nvdisasm; the PyPI one sits next to it or in another nvidia/*/bin.
    extra = [os.path.dirname(cuobjdump)] + pip_tool_dirs()
    env["PATH"] = os.pathsep.join(extra + [env.get("PATH", "")])
    result = subprocess.run([cuobjdump, "--dump-sass", library], env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"check_sass: {cuobjdump} --dump-sass {library} failed:\n{result.stderr.strip()}")
    return result.stdout


def split_kernels(sass):
    """{mangled name: {opcode: count}} for every function in the dump."""
    kernels, current = {}, None
    for line in sass.splitlines():
        m = FUNCTION_RE.match(line)
        if m:
            current = kernels.setdefault(m.group(1), {})
            continue
        if line.startswith("Fatbin") or line.strip().startswith("code for"):
            current = None  # next cubin: instructions need a new Function header
            continue
        m = INSTRUCTION_RE.match(line)
        if m and current is not None:
            current[m.group(1)] = current.get(m.group(1), 0) + 1
    return kernels


ATTENTION_KERNEL_RE = re.compile(r"(fwd|bwd)_kernel", re.IGNORECASE)


def is_attention_kernel(name):
    return ATTENTION_KERNEL_RE.search(name) is not None


def check_kernel(counts):
    """List of problems (empty when the kernel passes)."""
    problems = []
    if not any(counts.get(op, 0) for op in GMMA):
        problems.append("no HGMMA/QGMMA")
    if not counts.get(TMA_LOAD, 0):
        problems.append("no UTMALDG")
    for op in SPILLS:
        if counts.get(op, 0):
            problems.append(f"{counts[op]} {op} (local-memory spill)")
    return problems


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def without_arguments(signature):
    """'void f<T>(Params<T>)' -> 'void f<T>': the parameter list only repeats the template."""
    if not signature.endswith(")"):
        return signature
    depth = 0
    for i in range(len(signature) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(signature[i], 0)
        if depth == 0:
            return signature[:i]
    return signature


def report(kernels, out=sys.stdout):
    """Prints the table; returns True when every attention kernel passes and there is one."""
    names = sorted(kernels)
    pretty = {n: without_arguments(p) for n, p in demangle(names).items()}
    checked = [n for n in names if is_attention_kernel(n)]
    width = min(100, max([len(pretty[n]) for n in names] + [6]))
    print(f"{'kernel':<{width}}  {'GMMA':>5} {'TMALD':>5} {'LDL':>4} {'STL':>4}  verdict", file=out)
    ok = bool(checked)
    for n in names:
        c = kernels[n]
        if is_attention_kernel(n):
            problems = check_kernel(c)
            verdict = "ok" if not problems else "FAIL: " + ", ".join(problems)
            ok = ok and not problems
        else:
            verdict = "not checked (not an attention kernel)"
        label = pretty[n] if len(pretty[n]) <= width else pretty[n][: width - 3] + "..."
        gmma = sum(c.get(op, 0) for op in GMMA)
        print(f"{label:<{width}}  {gmma:>5} {c.get(TMA_LOAD, 0):>5} {c.get('LDL', 0):>4} "
              f"{c.get('STL', 0):>4}  {verdict}", file=out)
    if not checked:
        print("FAIL: no attention kernel (name containing 'fwd_kernel' or 'bwd_kernel') in the SASS",
              file=out)
    print(f"check_sass: {len(checked)} attention kernel(s), {'PASS' if ok else 'FAIL'}", file=out)
    return ok


FAKE_SASS = """
Fatbin elf code:
================
arch = sm_90a
identifier = fwd_bf16_hdim128.cu

	code for sm_90a
		Function : _ZN6flash37kernels10fwd_kernelILi128EEEvv
	.headerflags	@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 UTMALDG.2D [UR8], [UR4] ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/             @!UP0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0040*/                   EXIT ;
		Function : _ZN6flash37kernels10bwd_kernelILi256EEEvv
        /*0000*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0010*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0020*/                   STL [R1+0x10], R4 ;
        /*0030*/                   LDL R4, [R1+0x10] ;
        /*0040*/                   LDL.64 R6, [R1+0x18] ;

Fatbin elf code:
================
	code for sm_90a
		Function : _ZN6flash37kernels17fwd_empty_keys_kernelEv
        /*0000*/                   STG.E [R2.64], RZ ;
		Function : _ZN6flash37kernels17fwd_kernel_scalarEv
        /*0000*/                   FFMA R0, R1, R2, R3 ;
		Function : _ZN6flash37kernels11copy_kernelEv
        /*0000*/                   STL [R1], R0 ;
"""


def self_test():
    import io
    kernels = split_kernels(FAKE_SASS)
    assert set(kernels) == {
        "_ZN6flash37kernels10fwd_kernelILi128EEEvv", "_ZN6flash37kernels10bwd_kernelILi256EEEvv",
        "_ZN6flash37kernels17fwd_empty_keys_kernelEv", "_ZN6flash37kernels17fwd_kernel_scalarEv",
        "_ZN6flash37kernels11copy_kernelEv"}, kernels
    good = kernels["_ZN6flash37kernels10fwd_kernelILi128EEEvv"]
    assert good == {"LDC": 1, "UTMALDG": 1, "HGMMA": 2, "EXIT": 1}, good  # predicated ones count
    assert check_kernel(good) == []
    assert check_kernel(kernels["_ZN6flash37kernels10bwd_kernelILi256EEEvv"]) == [
        "2 LDL (local-memory spill)", "1 STL (local-memory spill)"]
    assert check_kernel(kernels["_ZN6flash37kernels17fwd_kernel_scalarEv"]) == ["no HGMMA/QGMMA", "no UTMALDG"]
    assert check_kernel({"QGMMA": 4, "UTMALDG": 1}) == []  # fp8 kernels use QGMMA
    assert not is_attention_kernel("_ZN6flash37kernels17fwd_empty_keys_kernelEv")
    assert not is_attention_kernel("_ZN6flash37kernels11copy_kernelEv")
    assert not is_attention_kernel("_ZN6flash37kernels20bwd_row_stats_kernelIiEEvv")
    assert is_attention_kernel("_ZN6flash37kernels10fwd_kernelIiEEvv")
    assert without_arguments("void f<int>(P<(int)1>)") == "void f<int>"

    sink = io.StringIO()
    assert report({"_ZN6flash37kernels10fwd_kernelILi128EEEvv": good}, sink)
    assert not report(kernels, sink)  # one bad attention kernel fails the whole check
    assert not report({"_ZN6flash37kernels11copy_kernelEv": {}}, sink)  # no attention kernel
    assert not report({}, sink)
    assert not report(split_kernels(""), sink)
    assert "FAIL: 2 LDL (local-memory spill), 1 STL (local-memory spill)" in sink.getvalue()
    print("check_sass self-test: 1 passed, 0 failed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("library", nargs="?", default="build/libflash3.so")
    parser.add_argument("--self-test", action="store_true", help="test this script on fake SASS")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not os.path.exists(args.library):
        sys.exit(f"check_sass: {args.library} not found (build first)")
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        sys.exit("check_sass: cuobjdump not found; set $CUOBJDUMP or "
                 "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    return 0 if report(split_kernels(dump_sass(cuobjdump, args.library))) else 1


if __name__ == "__main__":
    sys.exit(main())
