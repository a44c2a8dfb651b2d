"""`python -m flash3.bench_decode`: decoding over a KV cache (issue 7).

In one process: q_len 1, head_dim 128, 32 query / 8 KV heads, bf16, for
seqlen_k x batch; effective bandwidth = bytes of K and V read per second.
Rows: flash3 (split-KV chosen), flash3 appending the step's new key and
value with rotary inside the kernel (the last cache slot, so the same keys
are read), flash3 paged with page sizes 16 and 256,
torch SDPA's cuDNN backend (GQA through enable_gqa; where that backend
refuses it, K and V repeated to 32 heads, still counted as the 8-head
bytes), and a device copy of the same bytes (read + write) as the ceiling.
"""

import argparse
import json

from .bench import _environment, _make_timer

SEQLENS = (4096, 16384, 65536, 131072)
BATCHES = (1, 8, 64)
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
MAX_CACHE_BYTES = 40 << 30  # skip points whose K + V exceed this (paged copies double it)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m flash3.bench_decode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlens", type=lambda t: tuple(int(x) for x in t.split(",")), default=SEQLENS)
    p.add_argument("--batches", type=lambda t: tuple(int(x) for x in t.split(",")), default=BATCHES)
    p.add_argument("--json", default="bench_decode.json", metavar="FILE")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--splits", type=lambda t: tuple(int(x) for x in t.split(",")), default=(),
                   metavar="N,N,...",
                   help="also time flash3 (unpaged) at each of these num_splits, to tune the "
                        "num_splits=0 heuristic (src/host/split_kv.cpp)")
    p.add_argument("--profile", action="store_true",
                   help="also list each call's GPU kernels and their mean durations (torch.profiler)")
    return p.parse_args(argv)


def _paged(torch, cache, page_size):
    """The cache as pages in a shuffled order, and its page table."""
    batch, seqlen, heads, dim = cache.shape
    per_entry = seqlen // page_size
    order = torch.randperm(batch * per_entry, device=cache.device)
    pages = torch.empty_like(cache.view(batch * per_entry, page_size, heads, dim))
    pages[order] = cache.view(batch * per_entry, page_size, heads, dim)
    return pages, order.view(batch, per_entry).to(torch.int32)


def _cudnn_call(torch, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

    def gqa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(qh, kh, vh, enable_gqa=True)

    try:
        gqa()
        return gqa, "enable_gqa"
    except RuntimeError:
        group = q.shape[2] // k.shape[2]
        kr, vr = (t.repeat_interleave(group, dim=1) for t in (kh, vh))

        def repeated():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(qh, kr, vr)

        repeated()
        return repeated, "K/V repeated to the query heads"


def _kernel_times(torch, fn, calls=20):
    """[(kernel name, mean us per call)] of fn's GPU work, and the mean span
    from the first kernel's start to the last one's end per call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    totals = {}
    for e in kernels:
        totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us() / calls
    per_call = len(kernels) // calls
    spans = [kernels[i + per_call - 1].time_range.end - kernels[i].time_range.start
             for i in range(0, per_call * calls, per_call)] if per_call else [0]
    return sorted(totals.items(), key=lambda kv: -kv[1]), sum(spans) / len(spans)


def _host_us(torch, fn, calls=100):
    """Host time per call while the GPU keeps up (no sync inside the loop)."""
    import time

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _print_profile(torch, label, fn):
    times, span = _kernel_times(torch, fn)
    print(f"  {label}: {span:.1f} us from first kernel start to last kernel end, "
          f"{_host_us(torch, fn):.1f} us host per call", flush=True)
    for name, us in times:
        print(f"    {us:8.1f} us  {name[:110]}", flush=True)


def run(args):
    import torch

    import flash3

    timer_name, timer = _make_timer(torch, args.quick)
    results = {"environment": _environment(torch, timer_name, "bf16"), "points": []}
    print(f"{'batch':>5} {'seqlen_k':>8} {'GB':>6}  TB/s: flash3  append  paged16 paged256  cudnn "
          "  copy   ratio")
    for seqlen in args.seqlens:
        for batch in args.batches:
            kv_bytes = 2 * batch * seqlen * HEADS_KV * HEAD_DIM * 2
            if kv_bytes > MAX_CACHE_BYTES:
                continue
            q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(batch, seqlen, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            v = torch.randn_like(k)
            seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
            row = {"batch": batch, "seqlen_k": seqlen, "kv_bytes": kv_bytes}

            def bandwidth(fn, bytes_moved=kv_bytes):
                return bytes_moved / timer(fn) / 1e9  # ms -> TB/s

            row["flash3"] = bandwidth(lambda: flash3.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=seqlens))
            new_k = torch.randn(batch, 1, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            angles = torch.rand(seqlen, HEAD_DIM // 2, device="cuda")
            cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
            cached = seqlens - 1
            row["append"] = bandwidth(lambda: flash3.flash_attn_with_kvcache(
                q, k, v, k=new_k, v=new_k, rotary_cos=cos, rotary_sin=sin,
                cache_seqlens=cached, causal=True))
            for page_size in (16, 256):
                k_pages, table = _paged(torch, k, page_size)
                v_pages, _ = _paged(torch, v, page_size)
                v_pages.copy_(k_pages)  # values do not matter for the timing
                row[f"paged{page_size}"] = bandwidth(lambda: flash3.flash_attn_with_kvcache(
                    q, k_pages, v_pages, cache_seqlens=seqlens, page_table=table))
                del k_pages, v_pages
            cudnn, how = _cudnn_call(torch, q, k, v)
            row["cudnn"], row["cudnn_gqa"] = bandwidth(cudnn), how
            flat = k.view(-1)
            copy_to = torch.empty_like(flat)
            row["copy"] = bandwidth(lambda: copy_to.copy_(flat), 2 * flat.numel() * 2)
            row["ratio_to_cudnn"] = row["flash3"] / row["cudnn"]
            if args.splits:
                row["by_splits"] = {n: bandwidth(lambda n=n: flash3.flash_attn_with_kvcache(
                    q, k, v, cache_seqlens=seqlens, num_splits=n)) for n in args.splits}
                best = max(row["by_splits"], key=row["by_splits"].get)
                print("  TB/s by num_splits: " + "  ".join(
                    f"{n}: {tb:.2f}" for n, tb in row["by_splits"].items()) +
                    f"  (best {best}; chosen {row['flash3']:.2f})", flush=True)
            if args.profile:
                _print_profile(torch, "flash3", lambda: flash3.flash_attn_with_kvcache(
                    q, k, v, cache_seqlens=seqlens))
                _print_profile(torch, "cudnn", cudnn)
            results["points"].append(row)
            print(f"{batch:5d} {seqlen:8d} {kv_bytes / 1e9:6.2f}        {row['flash3']:6.2f}  "
                  f"{row['append']:6.2f}  {row['paged16']:6.2f}  {row['paged256']:6.2f}  {row['cudnn']:6.2f} "
                  f"{row['copy']:6.2f}  {row['ratio_to_cudnn']:5.2f}", flush=True)
            del q, k, v, copy_to
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    return results


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("flash3.bench_decode needs a CUDA GPU (Hopper); none is visible")
    run(args)


if __name__ == "__main__":
    main()
