"""A few small, odd-shaped forward and backward calls for compute-sanitizer
(memcheck, racecheck, synccheck): tile tails in both sequence dims, GQA,
causal with seqlen_q > seqlen_k (rows that see no key), every head dim and
dtype, the backward in both modes (atomic and deterministic dq)."""

import torch

import flash3

CASES = [  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)
    (1, 17, 113, 2, 1, 64, False),
    (2, 113, 17, 4, 2, 128, True),
    (1, 255, 129, 2, 2, 256, True),
    (1, 1, 799, 8, 1, 128, False),
    (1, 200, 77, 4, 1, 64, True),
]


def main():
    for dtype in (torch.bfloat16, torch.float16):
        for b, sq, sk, hq, hkv, d, causal in CASES:
            q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
            k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
            v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
            out, lse = flash3.flash_attn_func(q, k, v, causal=causal, return_lse=True)
            dout = torch.randn_like(out)
            for deterministic in (False, True):
                torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, causal, deterministic)
            torch.cuda.synchronize()
            print(f"ok {dtype} b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} causal={causal}")


if __name__ == "__main__":
    main()
