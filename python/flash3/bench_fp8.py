"""`python -m flash3.bench_fp8`: the FP8 forward's measurements (issue 5).

In one process, on the training shapes of DESIGN.md 4:
- the ceiling: an fp8 GEMM (torch._scaled_mm, 8192^3) in TFLOP/s;
- the FP8 attention kernel on pre-quantized inputs, TFLOP/s and its ratio
  to that GEMM;
- end to end from bf16 (quantize_fp8 + the FP8 kernel) against the bf16
  kernel, d = 128;
- the quantize pass's bandwidth against a device copy of the same bytes;
- accuracy: RMSE against fp64 of per-tensor FP8 and of block scales +
  Hadamard, N(0, 1) inputs with 0.1 % N(0, 10^2) outliers (FA3 paper, 4.3).
"""

import argparse
import json

from .bench import DEFAULT_SEQLENS, HIDDEN, TOKENS, _environment, _make_timer, forward_flops

DEFAULT_HDIMS = (64, 128, 256)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m flash3.bench_fp8", description=__doc__.split("\n\n")[0])
    p.add_argument("--hdims", type=lambda t: tuple(int(x) for x in t.split(",")), default=DEFAULT_HDIMS)
    p.add_argument("--seqlens", type=lambda t: tuple(int(x) for x in t.split(",")),
                   default=DEFAULT_SEQLENS)
    p.add_argument("--json", default="bench_fp8.json", metavar="FILE")
    p.add_argument("--quick", action="store_true")
    return p.parse_args(argv)


def fp8_gemm_tflops(torch, timer, n=8192):
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    ms = timer(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * n**3 / ms / 1e9


def outlier_rmse(torch, flash3, head_dim, seqlen=4096, heads=4):
    from .reference import attention_ref

    generator = torch.Generator(device="cuda").manual_seed(0)

    def draw():
        x = torch.randn(1, seqlen, heads, head_dim, device="cuda", generator=generator)
        outliers = torch.rand(x.shape, device="cuda", generator=generator) < 1e-3
        return torch.where(outliers, 10 * torch.randn_like(x), x)

    q, k, v = draw(), draw(), draw()
    ref, _ = attention_ref(q.double(), k.double(), v.double(), compute_dtype=torch.float64)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    rmse = {}
    for name, quant, rotate in (("tensor", "tensor", False), ("tensor+hadamard", "tensor", True),
                                ("block", "block", False), ("block+hadamard", "block", True)):
        out = flash3.fp8_attention(qb, kb, vb, quant=quant, hadamard=rotate)
        rmse[name] = (out.double() - ref).pow(2).mean().sqrt().item()
    rmse["bf16"] = (flash3.flash_attn_func(qb, kb, vb).double() - ref).pow(2).mean().sqrt().item()
    return rmse


def run(args):
    import torch

    import flash3
    from flash3 import fp8

    timer_name, timer = _make_timer(torch, args.quick)
    results = {"environment": _environment(torch, timer_name, "e4m3"), "rows": []}
    gemm = fp8_gemm_tflops(torch, timer)
    results["fp8_gemm_tflops"] = gemm
    print(f"fp8 GEMM 8192^3 (torch._scaled_mm): {gemm:.0f} TFLOP/s")
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'TFLOP/s':>8} {'/GEMM':>6}")
    for head_dim in args.hdims:
        for causal in (False, True):
            for seqlen in args.seqlens:
                batch, heads = TOKENS // seqlen, HIDDEN // head_dim
                q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                       dtype=torch.bfloat16) for _ in range(3))
                inputs = fp8.quantize_fp8(q, k, v)
                ms = timer(lambda: fp8.fp8_forward(inputs, causal=causal))
                tflops = forward_flops(batch, heads, seqlen, seqlen, head_dim, causal) / ms / 1e9
                results["rows"].append(dict(head_dim=head_dim, causal=causal, seqlen=seqlen,
                                            tflops=tflops, ratio_to_gemm=tflops / gemm))
                print(f"{head_dim:>4} {str(causal):>6} {seqlen:>6} {tflops:>8.0f} {tflops / gemm:>6.3f}")

    # End to end and the quantize pass at d = 128, s = 8k.
    seqlen, head_dim = 8192, 128
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    bf16_ms = timer(lambda: flash3.flash_attn_func(q, k, v))
    e2e_ms = timer(lambda: flash3.fp8_attention(q, k, v))
    quant_ms = timer(lambda: fp8.quantize_fp8(q, k, v))
    moved = 3 * q.numel() * (2 + 1)  # read bf16, write e4m3
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = timer(lambda: dst.copy_(src))  # reads and writes moved bytes in all
    e2e = dict(bf16_ms=bf16_ms, fp8_end_to_end_ms=e2e_ms, speedup=bf16_ms / e2e_ms,
               quantize_ms=quant_ms, quantize_tb_s=moved / quant_ms / 1e9,
               copy_tb_s=moved / copy_ms / 1e9)
    e2e["quantize_fraction_of_copy"] = e2e["quantize_tb_s"] / e2e["copy_tb_s"]
    results["end_to_end_d128_s8k"] = e2e
    print(f"d128 s8k: bf16 {bf16_ms:.3f} ms, fp8 (quantize + attention) {e2e_ms:.3f} ms: "
          f"{e2e['speedup']:.2f}x; quantize {quant_ms:.3f} ms = {e2e['quantize_tb_s']:.2f} TB/s, "
          f"{e2e['quantize_fraction_of_copy']:.2f} of copy ({e2e['copy_tb_s']:.2f} TB/s)")

    results["rmse"] = {}
    for head_dim in args.hdims:
        rmse = outlier_rmse(torch, flash3, head_dim)
        rmse["ratio_tensor_to_block_hadamard"] = rmse["tensor"] / rmse["block+hadamard"]
        results["rmse"][head_dim] = rmse
        print(f"RMSE d{head_dim}: " + ", ".join(f"{k} {v:.3e}" for k, v in rmse.items()))
    return results


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("flash3.bench_fp8: no CUDA GPU visible; the FP8 benchmark needs a Hopper GPU")
        return 1
    results = run(args)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
