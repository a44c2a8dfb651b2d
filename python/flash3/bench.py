"""`python -m flash3.bench`: forward (or, with --bwd, backward) TFLOP/s of
flash3 against torch SDPA's cuDNN and FlashAttention-2 backends (and, for
the forward, its math backend: plain eager PyTorch attention) on the
training shapes of DESIGN.md 4.

Every backend is timed in the same process on the same inputs, through the
call a user would make (flash3.flash_attn_func; F.scaled_dot_product_attention
on (b, h, s, d) views), so host overhead is included. The backward is timed
as torch.autograd.grad of one forward's output (retain_graph), so it
includes each backend's backward preprocessing; its FLOPs are 2.5 x the
forward's (DESIGN.md 4). Absolute numbers drift
between runs; the ratios within one run are what to compare.
"""

import argparse
import datetime
import itertools
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys

HIDDEN = 2048          # h = HIDDEN // d (d = 96: 21 heads, 192: 10)
TOKENS = 16384         # b * s
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_HDIMS = (64, 128, 256)
QUICK_SEQLENS = (1024, 8192)
BACKENDS = ("flash3", "cudnn", "fa2", "math")
# Math materializes the (s x s) scores; its backward would need several times
# that again and minutes at s = 16k, so it is timed in the forward only.
BWD_BACKENDS = tuple(name for name in BACKENDS if name != "math")
# --check: max |flash3 - SDPA| allowed. Both sides round to the output dtype
# (bf16 eps 2^-8, fp16 2^-11) and the outputs are O(1) for N(0, 1) inputs, so a
# few output ulps; anything wrong (masking, scaling, a missed tile) is far larger.
CHECK_TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}
WINDOW_SEQLEN = 32768  # --window's default (issue 6: a 4k window on s = 32k)
VARLEN_BATCH = 64           # --varlen: this many sequences (issue 6's batch)
VARLEN_LENGTHS = (128, 8192)  # drawn uniformly (inclusive), seed 0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m flash3.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--hdims", type=_hdim_list, default=None,
                   help="comma list, default 64,128,256; DxDV for v's head dim apart (192x128)")
    p.add_argument("--seqlens", type=_int_list, default=None,
                   help="comma list, default 512,...,16384 (batch = 16384 / seqlen)")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--json", default="bench.json", metavar="FILE", help="results (default bench.json)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="TFLOP/s vs seqlen plot")
    p.add_argument("--quick", action="store_true", help="few shapes, shorter timing")
    p.add_argument("--check", action="store_true",
                   help="compare flash3 with SDPA's output on each shape before timing")
    p.add_argument("--bwd", action="store_true",
                   help="time the backward (dq, dk, dv) instead of the forward")
    p.add_argument("--deterministic", action="store_true",
                   help="with --bwd: flash3's deterministic backward (bitwise reproducible dq)")
    p.add_argument("--backends", type=lambda t: tuple(x for x in t.split(",") if x), default=None,
                   help=f"comma list of {','.join(BACKENDS)} (default all; math only in the forward)")
    p.add_argument("--overhead", action="store_true",
                   help="only measure host overhead: us per call of a tiny attention (CUDA events, 1000 calls)")
    p.add_argument("--sinks", action="store_true",
                   help="flash3 with a learnable sink logit per head (with --bwd also its gradient); "
                        "the other backends have no sinks and run plain attention")
    p.add_argument("--window", type=int, default=None, metavar="LEFT",
                   help="only flash3's sliding window (LEFT, 0) with causal against full causal "
                        "and full attention (default seqlen 32768, batch 1; with --bwd the backward)")
    p.add_argument("--varlen", action="store_true",
                   help=f"only varlen: {VARLEN_BATCH} sequences of lengths uniform in "
                        f"[{VARLEN_LENGTHS[0]}, {VARLEN_LENGTHS[1]}] packed, against flash3 on a "
                        "fixed-length batch at the mean length and cuDNN on the batch padded "
                        "(default hdim 128)")
    args = p.parse_args(argv)
    if args.varlen and (args.window is not None or args.overhead or args.sinks or args.check):
        p.error("--varlen: not with --window, --overhead, --sinks or --check")
    if args.deterministic and not args.bwd:
        p.error("--deterministic: only with --bwd (it selects flash3's backward mode)")
    if args.sinks and (args.window is not None or args.overhead):
        p.error("--sinks: only for the training shapes (not with --window or --overhead)")
    if args.sinks and args.check:
        p.error("--sinks: not with --check (SDPA has no sinks to compare with)")
    for name in args.backends or ():
        if name not in BACKENDS:
            p.error(f"--backends: each must be one of {', '.join(BACKENDS)}; got {name!r}")
    if args.backends and "flash3" not in args.backends:
        p.error("--backends: must include flash3 (the ratios are flash3's)")
    pairs = [d for d in args.hdims or () if isinstance(d, tuple)]
    if pairs and (args.varlen or args.window is not None):
        p.error(f"--hdims: head-dim pairs ({pairs[0][0]}x{pairs[0][1]}) only for the training "
                "shapes (not with --varlen or --window)")
    if args.varlen:
        args.hdims = args.hdims or (128,)
        return args
    args.hdims = args.hdims or DEFAULT_HDIMS
    if args.window is not None:
        if args.window < 0:
            p.error(f"--window: must be >= 0; got {args.window}")
        args.seqlens = args.seqlens or (WINDOW_SEQLEN,)
        return args
    args.seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else DEFAULT_SEQLENS)
    for s in args.seqlens:
        if s <= 0 or TOKENS % s:
            p.error(f"--seqlens: each must divide {TOKENS} (batch = {TOKENS} / seqlen); got {s}")
    for d in args.hdims:
        for dim in d if isinstance(d, tuple) else (d,):
            if dim <= 0 or dim > HIDDEN:
                p.error(f"--hdims: each must be in [1, {HIDDEN}] (heads = {HIDDEN} // hdim); got {dim}")
    return args


def _int_list(text):
    return tuple(int(x) for x in text.split(",") if x)


def _hdim_list(text):
    """Head dims: ints, or (head_dim, head_dim_v) for "DxDV"."""
    return tuple(tuple(int(y) for y in x.split("x")) if "x" in x else int(x)
                 for x in text.split(",") if x)


def split_hdim(hdim):
    """(q's and k's head dim, v's) of an --hdims entry."""
    return hdim if isinstance(hdim, tuple) else (hdim, hdim)


def forward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, head_dim_v=None):
    # S = Q K^T costs 2 * sq * sk * head_dim, O = P V 2 * sq * sk * head_dim_v.
    dims = head_dim + (head_dim if head_dim_v is None else head_dim_v)
    flops = 2 * batch * heads * seqlen_q * seqlen_k * dims
    # Count only unmasked scores; the exact count for sq == sk is n(n+1)/2,
    # DESIGN.md rounds it to half.
    return flops // 2 if causal and seqlen_q == seqlen_k else flops


def training_shapes(hdims, seqlens, causal_modes):
    for hdim in hdims:
        head_dim, head_dim_v = split_hdim(hdim)
        for causal in causal_modes:
            for seqlen in seqlens:
                yield dict(head_dim=head_dim, head_dim_v=head_dim_v, causal=causal, seqlen=seqlen,
                           batch=TOKENS // seqlen, heads=HIDDEN // head_dim)


def hdim_label(shape):
    d, dv = shape["head_dim"], shape.get("head_dim_v", shape["head_dim"])
    return f"{d}" if d == dv else f"{d}x{dv}"


def _make_timer(torch, quick):
    """(name, time_ms(fn)) with the median of many runs after warm-up."""
    warmup_ms, rep_ms = (10, 40) if quick else (25, 100)
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return "triton.testing.do_bench median", lambda fn: do_bench(
            fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")

    def cuda_events(fn):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        once_ms = max(start.elapsed_time(end), 1e-3)
        for _ in range(max(1, int(warmup_ms / once_ms))):
            fn()
        times = []
        for _ in range(max(10, int(rep_ms / once_ms))):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    return "CUDA events median", cuda_events


def _backend_calls(torch, q, k, v, causal, deterministic=False, names=BACKENDS, sinks=None):
    """name -> (context manager factory, fn) for the public call of each backend
    in names; sinks (per-head logits) go to flash3 only."""
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash3

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA wants (b, h, s, d)
    sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
    calls = {
        "flash3": (contextlib.nullcontext,
                   lambda: flash3.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                                 sinks=sinks)),
        "cudnn": (lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION), sdpa),
        "fa2": (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), sdpa),
        "math": (lambda: sdpa_kernel(SDPBackend.MATH), sdpa),
    }
    return {name: calls[name] for name in names}


def _backward_call(torch, fwd, leaves):
    """Runs the forward once (in the caller's backend context) and returns a
    call that computes the gradients of its output again and again."""
    out = fwd()
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def _peak_training_step_mib(torch, fwd, leaves):
    """Peak memory of one forward + backward above what was allocated before
    (saved activations, gradients and each backend's workspaces)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = _backward_call(torch, fwd, leaves)()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del grads
    return peak / 2**20


def _sdpa_out_layout(out):
    return out.transpose(1, 2)  # back to (b, s, h, d)


class _ErrorLog:
    """Prints each backend's first failure once, so 'n/a' is explained without flooding."""

    def __init__(self):
        self.seen = set()

    def __call__(self, backend, error):
        if backend not in self.seen:
            self.seen.add(backend)
            print(f"note: {backend} failed ({type(error).__name__}: {error}); "
                  f"further failures show as n/a", file=sys.stderr, flush=True)


def _check(torch, calls, dtype_name, log):
    """max |flash3 - reference backend| and whether it passes, or None if not comparable."""
    try:
        context, fn = calls["flash3"]
        with context():
            got = fn().float()
    except Exception as e:  # noqa: BLE001 - report and continue
        log("flash3", e)
        return None
    for name in ("cudnn", "fa2"):
        try:
            context, fn = calls[name]
            with context():
                want = _sdpa_out_layout(fn()).float()
            break
        except Exception:  # noqa: BLE001 - try the next backend
            continue
    else:
        return None
    finite = bool(torch.isfinite(got).all())
    diff = float((got - want).abs().max()) if finite else math.inf
    return {"against": name, "max_abs_diff": diff,
            "ok": finite and diff <= CHECK_TOLERANCE[dtype_name]}


def _format_row(shape, tflops, check):
    cells = [f"{hdim_label(shape):>4}", f"{'yes' if shape['causal'] else 'no':>6}",
             f"{shape['seqlen']:>6}", f"{shape['batch']:>5}", f"{shape['heads']:>5}", "|"]
    for name in tflops:
        value = tflops[name]
        cells.append(f"{value:>7.1f}" if value is not None else f"{'n/a':>7}")
    ratio = (tflops["flash3"] / tflops["cudnn"]
             if tflops.get("flash3") and tflops.get("cudnn") else None)
    cells += ["|", f"{ratio:>11.3f}x" if ratio is not None else f"{'n/a':>12}"]
    if check is not None:
        cells.append(f"  {'ok' if check['ok'] else 'CHECK FAILED'} "
                     f"({check['max_abs_diff']:.1e} vs {check['against']})")
    return " ".join(cells)


def _header(names):
    return (f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'batch':>5} {'heads':>5} | "
            + " ".join(f"{name:>7}" for name in names) + f" | {'flash3/cudnn':>12}")


def _git_sha():
    # The GPU machine gets a copy of the working tree whose git metadata may
    # be stale; the caller can say what was built.
    if os.environ.get("FLASH3_GIT_SHA"):
        return os.environ["FLASH3_GIT_SHA"]
    root = pathlib.Path(__file__).resolve().parent.parent.parent
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _environment(torch, timer_name, dtype_name):
    import flash3
    from . import _lib

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        library = {"version": _lib.version(), "build_info": _lib.build_info(),
                   "path": str(_lib.library_path())}
    except _lib.Flash3Error as e:
        library = {"error": str(e)}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": _git_sha(),
        "device": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "flash3": flash3.__version__,
        "library": library,
        "dtype": dtype_name,
        "timer": timer_name,
        "flops": "2*b*h*sq*sk*(d + dv) (dv: v's head dim, d unless given), halved for causal with sq == sk",
    }


def measure_overhead(args, calls=1000, rounds=5):
    """Microseconds per call of a tiny attention (b = 1, h = 1, s = 128,
    d = 64), issue 8's method: CUDA events around a loop of `calls`
    back-to-back calls, best of `rounds`. The GPU work is a few us, so the
    host path of each public call sets the pace (DESIGN.md 4 quotes SDPA at
    33-40 us). Wall-clock time of the same loop is printed beside it."""
    import time

    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    q, k, v = (torch.randn(1, 128, 1, 64, dtype=dtype, device="cuda") for _ in range(3))
    print(f"host overhead, {args.dtype}, q, k, v (1, 128, 1, 64): us per call over {calls} calls "
          f"(CUDA events, wall clock), best of {rounds}", flush=True)
    log = _ErrorLog()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = {}
    for name, (context, fn) in _backend_calls(torch, q, k, v, False).items():
        try:
            best = None
            with context():
                for _ in range(100):
                    fn()
                for _ in range(rounds):
                    torch.cuda.synchronize()
                    wall = time.perf_counter()
                    start.record()
                    for _ in range(calls):
                        fn()
                    end.record()
                    end.synchronize()
                    wall = (time.perf_counter() - wall) / calls * 1e6
                    event = start.elapsed_time(end) / calls * 1e3
                    best = (event, wall) if best is None or event < best[0] else best
            results[name] = best
        except Exception as e:  # noqa: BLE001 - report and continue
            log(name, e)
            results[name] = None
        value = results[name]
        print(f"{name:>7}: {value[0]:8.1f} {value[1]:8.1f}" if value is not None
              else f"{name:>7}:      n/a", flush=True)
    return 0


def measure_window(args):
    """flash3 with a causal sliding window (args.window, 0) against full causal
    and full attention on the same inputs. A window skips whole key blocks, so
    its time should follow its work: each query sees about `window` keys,
    window / seqlen of full attention's (and twice that share of causal's)."""
    import torch

    import flash3

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer_name, time_ms = _make_timer(torch, args.quick)
    what = "backward" if args.bwd else "forward"
    print(f"flash3 sliding window {what}, {args.dtype}, {timer_name}: ms; window = "
          f"({args.window}, 0) with causal", flush=True)
    print(f"{'hdim':>4} {'seqlen':>6} {'batch':>5} {'heads':>5} | {'window':>8} {'causal':>8} "
          f"{'full':>8} | {'window / (w/s * full)':>21} {'window / (w/s * causal)':>23}", flush=True)
    results = []
    for d in args.hdims:
        for s in args.seqlens:
            b, h = max(1, TOKENS // s), HIDDEN // d
            q, k, v = (torch.randn(b, s, h, d, dtype=dtype, device="cuda", requires_grad=args.bwd)
                       for _ in range(3))
            masks = {"window": dict(causal=True, window_size=(args.window, -1)),
                     "causal": dict(causal=True), "full": dict(causal=False)}
            ms = {}
            for name, mask in masks.items():
                fn = lambda mask=mask, q=q, k=k, v=v: flash3.flash_attn_func(q, k, v, **mask)  # noqa: E731
                ms[name] = time_ms(_backward_call(torch, fn, (q, k, v)) if args.bwd else fn)
            share = min(args.window, s) / s
            vs_full, vs_causal = ms["window"] / (share * ms["full"]), ms["window"] / (share * ms["causal"])
            print(f"{d:>4} {s:>6} {b:>5} {h:>5} | {ms['window']:>8.3f} {ms['causal']:>8.3f} "
                  f"{ms['full']:>8.3f} | {vs_full:>20.3f}x {vs_causal:>22.3f}x", flush=True)
            results.append({"head_dim": d, "seqlen": s, "batch": b, "heads": h,
                            "window": args.window, "ms": ms})
            del q, k, v
    with open(args.json, "w") as f:
        json.dump({"environment": _environment(torch, timer_name, args.dtype),
                   "window": results}, f, indent=1)
    print(f"wrote {args.json}", flush=True)
    return 0


def varlen_lengths(count=VARLEN_BATCH, bounds=VARLEN_LENGTHS, seed=0):
    import random

    rng = random.Random(seed)
    return [rng.randint(*bounds) for _ in range(count)]


def measure_varlen(args):
    """flash3's varlen kernel on a packed batch of uneven lengths, against
    flash3 on a fixed-length batch of as many sequences at the mean length,
    and cuDNN (SDPA) on the batch padded to the longest length. TFLOP/s count
    each problem's own useful work; cuDNN's padded batch gets the varlen
    batch's FLOPs (the padding is its cost of not taking varlen)."""
    import torch

    import flash3

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer_name, time_ms = _make_timer(torch, args.quick)
    lengths = varlen_lengths()
    batch, longest = len(lengths), max(lengths)
    mean = round(sum(lengths) / batch)
    factor = 2.5 if args.bwd else 1.0
    what = "backward" if args.bwd else "forward"
    print(f"flash3 varlen {what}, {args.dtype}, {timer_name}: {batch} sequences, lengths "
          f"{VARLEN_LENGTHS[0]}..{VARLEN_LENGTHS[1]} (seed 0: mean {mean}, max {longest}, "
          f"{sum(lengths)} tokens); TFLOP/s", flush=True)
    print(f"{'hdim':>4} {'causal':>6} | {'varlen':>7} {'fixed':>7} {'cudnn':>7} | "
          f"{'varlen/fixed':>12} {'varlen/cudnn':>12}", flush=True)
    results = []
    causal_modes = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    for d in args.hdims:
        h = HIDDEN // d
        make = lambda *shape: torch.randn(*shape, h, d, dtype=dtype, device="cuda",  # noqa: E731
                                          requires_grad=args.bwd)
        for causal in causal_modes:
            useful = factor * sum(forward_flops(1, h, s, s, d, causal) for s in lengths)
            fixed_flops = factor * forward_flops(batch, h, mean, mean, d, causal)
            tflops = {}
            q, k, v = (make(sum(lengths)) for _ in range(3))
            fn = lambda: flash3.flash_attn_varlen_func(  # noqa: E731
                q, k, v, cu, cu, longest, longest, causal=causal)
            tflops["varlen"] = useful / time_ms(
                _backward_call(torch, fn, (q, k, v)) if args.bwd else fn) / 1e9
            del q, k, v, fn
            for name, seqlen, flops in (("fixed", mean, fixed_flops), ("cudnn", longest, useful)):
                q, k, v = (make(batch, seqlen) for _ in range(3))
                ctx, fn = _backend_calls(torch, q, k, v, causal, names=("flash3", "cudnn"))[
                    "flash3" if name == "fixed" else "cudnn"]
                try:
                    with ctx():
                        call = _backward_call(torch, fn, (q, k, v)) if args.bwd else fn
                        tflops[name] = flops / time_ms(call) / 1e9
                except RuntimeError as error:  # cuDNN unavailable for this shape
                    print(f"{name}: {str(error).splitlines()[0]}", file=sys.stderr, flush=True)
                    tflops[name] = None
                del q, k, v, fn
            ratio = lambda other: (f"{tflops['varlen'] / tflops[other]:>11.3f}x"  # noqa: E731
                                   if tflops.get(other) else f"{'n/a':>12}")
            cell = lambda x: f"{x:>7.1f}" if x else f"{'n/a':>7}"  # noqa: E731
            print(f"{d:>4} {'yes' if causal else 'no':>6} | {cell(tflops['varlen'])} "
                  f"{cell(tflops['fixed'])} {cell(tflops['cudnn'])} | {ratio('fixed')} "
                  f"{ratio('cudnn')}", flush=True)
            results.append({"head_dim": d, "causal": causal, "heads": h, "tflops": tflops})
    with open(args.json, "w") as f:
        json.dump({"environment": _environment(torch, timer_name, args.dtype),
                   "varlen": {"lengths": lengths, "pass": what, "results": results}}, f, indent=1)
    print(f"wrote {args.json}", flush=True)
    return 0


def run(args):
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer_name, time_ms = _make_timer(torch, args.quick)
    env = _environment(torch, timer_name, args.dtype)
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        print(f"warning: flash3 needs an NVIDIA Hopper GPU (sm_90); found {env['device']} "
              f"(sm_{major}{minor}): flash3 will show n/a", file=sys.stderr, flush=True)
    env["pass"] = ("deterministic backward" if args.deterministic else "backward") if args.bwd \
        else "forward"
    if args.sinks:
        env["pass"] += " (flash3 with sinks)"
    if args.bwd:
        env["flops"] = "2.5 x forward: 5*b*h*sq*sk*(d + dv), halved for causal with sq == sk"
    print(f"flash3 bench: {env['pass']}, {args.dtype}, {env['device']} ({env['capability']}), torch {env['torch']}, "
          f"cuDNN {env['cudnn']}, {timer_name}; TFLOP/s", flush=True)
    names = args.backends or (BWD_BACKENDS if args.bwd else BACKENDS)
    print(_header(names), flush=True)

    causal_modes = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    log = _ErrorLog()
    results, failed_checks = [], 0
    for shape in training_shapes(args.hdims, args.seqlens, causal_modes):
        b, s, h, d = shape["batch"], shape["seqlen"], shape["heads"], shape["head_dim"]
        q, k, v = (torch.randn(b, s, h, dim, dtype=dtype, device="cuda", requires_grad=args.bwd)
                   for dim in (d, d, shape["head_dim_v"]))
        sinks = (torch.randn(h, dtype=torch.float32, device="cuda", requires_grad=args.bwd)
                 if args.sinks else None)
        calls = _backend_calls(torch, q, k, v, shape["causal"], args.deterministic, names, sinks)
        check = _check(torch, calls, args.dtype, log) if args.check else None
        if check is not None and not check["ok"]:
            failed_checks += 1
        flops = forward_flops(b, h, s, s, d, shape["causal"], shape["head_dim_v"])
        if args.bwd:
            flops = flops * 5 // 2
        ms, tflops, peak_mib = {}, {}, {}
        for name, (context, fn) in calls.items():
            leaves = (q, k, v, sinks) if name == "flash3" and args.sinks else (q, k, v)
            try:
                with context():
                    timed = _backward_call(torch, fn, leaves) if args.bwd else fn
                    ms[name] = time_ms(timed)
                    del timed
                    if args.bwd:
                        peak_mib[name] = _peak_training_step_mib(torch, fn, leaves)
                tflops[name] = flops / (ms[name] * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001 - a backend may not support a shape
                log(name, e)
                ms[name] = tflops[name] = None
        print(_format_row(shape, tflops, check), flush=True)
        if args.bwd:
            print("      peak MiB of forward + backward above the inputs: " + ", ".join(
                f"{n} {v:.0f}" for n, v in peak_mib.items() if v is not None), flush=True)
        results.append({**shape, "flops": flops, "ms": ms, "tflops": tflops, "check": check,
                        **({"peak_mib": peak_mib} if args.bwd else {})})
        del q, k, v, sinks, calls

    with open(args.json, "w") as f:
        json.dump({"environment": env, "results": results}, f, indent=1)
    print(f"wrote {args.json}", flush=True)
    if args.plot:
        plot(results, args.plot, f"{env['pass']}, {env['device']}, {args.dtype}")
        print(f"wrote {args.plot}", flush=True)
    if failed_checks:
        print(f"{failed_checks} shape(s) failed --check", file=sys.stderr)
        return 1
    return 0


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hdims = sorted({hdim_label(r) for r in results}, key=lambda label: tuple(map(int, label.split("x"))))
    causals = sorted({r["causal"] for r in results})
    fig, axes = plt.subplots(len(hdims), len(causals), squeeze=False,
                             figsize=(5 * len(causals), 3.5 * len(hdims)))
    for i, d in enumerate(hdims):
        for j, causal in enumerate(causals):
            ax = axes[i][j]
            rows = sorted((r for r in results if hdim_label(r) == d and r["causal"] == causal),
                          key=lambda r: r["seqlen"])
            for name in BACKENDS:
                points = [(r["seqlen"], r["tflops"][name]) for r in rows
                          if r["tflops"].get(name) is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_title(f"hdim {d}, {'causal' if causal else 'not causal'}")
            ax.set_xlabel("seqlen (batch = 16384 / seqlen)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("flash3.bench needs torch (and an NVIDIA Hopper GPU); torch is not installed",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("flash3.bench needs an NVIDIA Hopper GPU; no CUDA device found", file=sys.stderr)
        return 2
    if args.overhead:
        return measure_overhead(args)
    if args.varlen:
        return measure_varlen(args)
    return measure_window(args) if args.window is not None else run(args)


if __name__ == "__main__":
    sys.exit(main())
