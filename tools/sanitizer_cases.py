"""A few small, odd-shaped forward and backward calls for compute-sanitizer
(memcheck, racecheck, synccheck): tile tails in both sequence dims, GQA,
causal with seqlen_q > seqlen_k (rows that see no key), sliding windows
(key blocks no query sees), softcap and sinks (with their gradient), every
head dim and dtype, the backward in both modes (atomic and deterministic dq)."""

import torch

import flash3

CASES = [  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, softcap, sinks)
    (1, 17, 113, 2, 1, 64, False, (-1, -1), 0.0, False),
    (2, 113, 17, 4, 2, 128, True, (-1, -1), 0.0, True),
    (1, 255, 129, 2, 2, 256, True, (-1, -1), 0.0, False),
    (1, 1, 799, 8, 1, 128, False, (-1, -1), 0.0, False),
    (1, 200, 77, 4, 1, 64, True, (-1, -1), 0.0, True),
    (1, 333, 555, 2, 1, 128, False, (30, 5), 3.0, False),
    (1, 300, 100, 2, 2, 256, True, (40, 0), 0.0, True),
    (2, 257, 300, 4, 2, 64, False, (0, 0), 20.0, False),
]


def main():
    for dtype in (torch.bfloat16, torch.float16):
        for b, sq, sk, hq, hkv, d, causal, window, softcap, with_sinks in CASES:
            q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
            k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
            v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
            sinks = torch.randn(hq, device="cuda") if with_sinks else None
            out, lse = flash3.flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                              window_size=window, softcap=softcap, sinks=sinks)
            dout = torch.randn_like(out)
            for deterministic in (False, True):
                torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, causal, deterministic, *window,
                                     softcap, sinks)
            torch.cuda.synchronize()
            print(f"ok {dtype} b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} causal={causal} "
                  f"window={window} softcap={softcap} sinks={with_sinks}")


if __name__ == "__main__":
    main()
