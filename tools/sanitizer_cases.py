"""A few small, odd-shaped forward and backward calls for compute-sanitizer
(memcheck, racecheck, synccheck): tile tails in both sequence dims, GQA,
the persistent forward grid with several tiles per CTA,
causal with seqlen_q > seqlen_k (rows that see no key), sliding windows
(key blocks no query sees), softcap, ALiBi and sinks (with their gradient), every
head dim and dtype (and head_dim_v 128 at head_dim 192), the backward in both modes (atomic and deterministic dq);
varlen forwards and backwards (both dq modes) with empty sequences and with
cu_seqlens past the packed tensors (which the kernels must clamp), also for
varlen q over a KV cache (appending to it too); FP8:
quantize (block and per-tensor scaling, e4m3 v transposed) and the forward
at every head dim."""

import itertools

import torch

import flash3

# head_dim: an int, or (head_dim, head_dim_v).
CASES = [  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, softcap, sinks)
    (1, 17, 113, 2, 1, 64, False, (-1, -1), 0.0, False),
    (2, 113, 17, 4, 2, 128, True, (-1, -1), 0.0, True),
    (1, 255, 129, 2, 2, 256, True, (-1, -1), 0.0, False),
    (1, 1, 799, 8, 1, 128, False, (-1, -1), 0.0, False),
    (1, 200, 77, 4, 1, 64, True, (-1, -1), 0.0, True),
    (1, 333, 555, 2, 1, 128, False, (30, 5), 3.0, False),
    (1, 300, 100, 2, 2, 256, True, (40, 0), 0.0, True),
    (2, 257, 300, 4, 2, 64, False, (0, 0), 20.0, False),
    # More tiles (4 x 16 x 3) than twice the SMs: the persistent grid's CTAs walk several.
    (4, 333, 200, 16, 4, 128, False, (-1, -1), 0.0, True),
    (2, 129, 211, 4, 2, 96, True, (-1, -1), 0.0, True),
    (1, 211, 129, 2, 1, 192, False, (50, 7), 0.0, False),
    (2, 129, 211, 4, 2, (192, 128), True, (-1, -1), 0.0, True),
    (4, 333, 200, 16, 4, (192, 128), False, (30, 5), 3.0, False),
]


def head_dims(head_dim):
    return head_dim if isinstance(head_dim, tuple) else (head_dim, head_dim)

# (seqlen_q, seqlen_k) per sequence, packed.
VARLEN_LENGTHS = [(17, 17), (0, 5), (113, 255), (255, 113), (5, 0), (130, 131)]


def varlen_cases(dtype):
    total_q = sum(sq for sq, _ in VARLEN_LENGTHS)
    total_k = sum(sk for _, sk in VARLEN_LENGTHS)
    offsets = lambda n: torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32,  # noqa: E731
                                     device="cuda")
    cu_q = offsets(sq for sq, _ in VARLEN_LENGTHS)
    cu_k = offsets(sk for _, sk in VARLEN_LENGTHS)
    # Starts past the end or negative, a length past the end: clamped, not accessed.
    bad = torch.tensor([0, 10**6, -5, total_q, total_q - 1, total_q + 7, total_q],
                       dtype=torch.int32, device="cuda")
    for d, dv in map(head_dims, (64, 96, 128, 192, 256, (192, 128))):
        q = torch.randn(total_q, 4, d, device="cuda", dtype=dtype)
        k = torch.randn(total_k, 2, d, device="cuda", dtype=dtype)
        v = torch.randn(total_k, 2, dv, device="cuda", dtype=dtype)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        sinks = torch.zeros(4, device="cuda", requires_grad=True)
        for causal, window, deterministic in ((False, (-1, -1), False), (True, (-1, -1), True),
                                              (False, (30, 5), False)):
            out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 255, 255, causal=causal,
                                                window_size=window, sinks=sinks,
                                                deterministic=deterministic)
            out.backward(torch.randn_like(out))
        for deterministic in (False, True):
            out = flash3.flash_attn_varlen_func(q, k, v, bad, bad.clamp(max=total_k), 300, 300,
                                                deterministic=deterministic)
            out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"ok varlen {dtype} d={d} dv={dv}")


def fp8_cases():
    from flash3 import fp8

    for b, sq, sk, hq, hkv, d, causal, window, _, with_sinks in CASES:
        if d not in (64, 128, 256):  # FP8's head dims
            continue
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        sinks = torch.randn(hq, device="cuda") if with_sinks else None
        for quant in ("block", "tensor"):
            fp8.fp8_attention(q, k, v, causal=causal, quant=quant, window_size=window, sinks=sinks)
        fp8.flash_attn_fp8(q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn),
                           v.to(torch.float8_e4m3fn), causal=causal)
        torch.cuda.synchronize()
        print(f"ok fp8 b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} causal={causal} window={window}")


def kvcache_cases():
    # Odd lengths, a batch index past the batch, left padding, paged caches,
    # and split-KV with an empty split.
    for d in (64, 96, 128, 192, 256):
        k_cache = torch.randn(4, 301, 2, d, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(3, 5, 4, d, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.tensor([301, 0, 77], dtype=torch.int32, device="cuda")
        leftpad = torch.tensor([0, 0, 70], dtype=torch.int32, device="cuda")
        batch_idx = torch.tensor([3, 0, 1], dtype=torch.int32, device="cuda")
        for splits in (1, 3):
            flash3.flash_attn_with_kvcache(q, k_cache, k_cache, cache_seqlens=seqlens,
                                           cache_leftpad=leftpad, cache_batch_idx=batch_idx,
                                           causal=True, num_splits=splits)
        # Append with half-dim NeoX rotary: to an empty entry, and past the capacity.
        v_cache = torch.randn_like(k_cache)
        new = torch.randn(3, 5, 2, d, device="cuda", dtype=torch.bfloat16)
        angles = torch.randn(301, d // 4, device="cuda", dtype=torch.bfloat16)
        cached = torch.tensor([296, 0, 300], dtype=torch.int32, device="cuda")
        for splits in (1, 3):
            flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k=new, v=new, rotary_cos=angles,
                                           rotary_sin=angles, cache_seqlens=cached,
                                           cache_leftpad=leftpad, cache_batch_idx=batch_idx,
                                           causal=True, num_splits=splits, rotary_interleaved=False)
        # 48-row pages straddle key blocks; 80 and 128 hold whole blocks (d 256 / d <= 128).
        for page_size, per_entry in ((48, 6), (80, 4), (128, 3)):
            pages = torch.randn(3 * per_entry + 2, page_size, 2, d, device="cuda",
                                dtype=torch.bfloat16)
            table = torch.randperm(pages.shape[0], device="cuda")[:3 * per_entry]
            flash3.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=seqlens,
                                           page_table=table.view(3, per_entry).to(torch.int32),
                                           num_splits=3)
            capacity = per_entry * page_size
            v_pages = torch.randn_like(pages)
            flash3.flash_attn_with_kvcache(
                q, pages, v_pages, k=new, v=new, cache_seqlens=(cached * capacity) // 301,
                page_table=table.view(3, per_entry).to(torch.int32), num_splits=3,
                rotary_cos=torch.ones(capacity, d // 2, device="cuda", dtype=torch.bfloat16),
                rotary_sin=torch.zeros(capacity, d // 2, device="cuda", dtype=torch.bfloat16))
        # Varlen q (5, 0 and 8 queries; then offsets past the packed q, clamped)
        # over the cache, split and not, packed GQA or not; and appending one
        # new key per query (k, v packed like q), past the capacity too.
        packed_q = torch.randn(13, 4, d, device="cuda", dtype=torch.bfloat16)
        packed_new = torch.randn(13, 2, d, device="cuda", dtype=torch.bfloat16)
        for cu in ([0, 5, 5, 13], [0, 10**6, -5, 12]):
            cu = torch.tensor(cu, dtype=torch.int32, device="cuda")
            for splits, pack_gqa in ((1, None), (3, True), (3, False)):
                flash3.flash_attn_with_kvcache(packed_q, k_cache, k_cache, cache_seqlens=seqlens,
                                               cache_leftpad=leftpad, cache_batch_idx=batch_idx,
                                               cu_seqlens_q=cu, max_seqlen_q=8, causal=True,
                                               num_splits=splits, pack_gqa=pack_gqa)
                flash3.flash_attn_with_kvcache(packed_q, k_cache, v_cache, k=packed_new,
                                               v=packed_new, rotary_cos=angles, rotary_sin=angles,
                                               cache_seqlens=cached, cache_leftpad=leftpad,
                                               cache_batch_idx=batch_idx, cu_seqlens_q=cu,
                                               max_seqlen_q=8, causal=True, num_splits=splits,
                                               pack_gqa=pack_gqa)
        torch.cuda.synchronize()
        print(f"ok kvcache d={d}")


def main():
    kvcache_cases()
    fp8_cases()
    for dtype in (torch.bfloat16, torch.float16):
        for b, sq, sk, hq, hkv, head_dim, causal, window, softcap, with_sinks in CASES:
            d, dv = head_dims(head_dim)
            q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
            k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
            v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype)
            sinks = torch.randn(hq, device="cuda") if with_sinks else None
            # ALiBi (per batch entry) where it is supported: no softcap, d <= 128.
            alibi = None if softcap or d > 192 else torch.rand(b, hq, device="cuda")
            out, lse = flash3.flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                              window_size=window, softcap=softcap, sinks=sinks,
                                              alibi_slopes=alibi)
            dout = torch.randn_like(out)
            for deterministic in (False, True):
                torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, causal, deterministic, *window,
                                     softcap, sinks, alibi)
            torch.cuda.synchronize()
            print(f"ok {dtype} b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} dv={dv} causal={causal} "
                  f"window={window} softcap={softcap} sinks={with_sinks}")
        varlen_cases(dtype)


if __name__ == "__main__":
    main()
