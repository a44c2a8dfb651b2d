// Forward tile shapes, one table for kernels and host heuristics alike.
#pragma once

namespace flash3::kernels {

struct FwdTileConfig {
  int block_m;     // query rows per CTA (64 per consumer warpgroup)
  int block_n;     // keys per mainloop step
  int kv_stages;   // K/V shared-memory pipeline depth
};

// Why these shapes:
// - block_m 128: two consumer warpgroups of 64 rows each (WGMMA's M is 64).
// - block_n 128 for d <= 128 keeps S (64 x 128 fp32 = 64 regs/thread) and O in
//   the 240-register consumer budget with room for P.
// - d 256: O alone is 128 regs/thread and Q takes 64 KB of shared memory, so
//   K/V tiles shrink to 80 keys: Q + 2 stages of K and V = 224 KB < 227 KB.
// - d 64: steps are short (half the GEMM work of d 128 per key block), so a
//   third K/V stage (16 + 3 x 32 KB) hides more load latency: measured +1-10 %
//   causal, 0.98-1.01x non-causal (docs/performance.md, 2026-12-03).
// - d 96: d 128's tile (24 + 4 x 24 KB; its 192-byte rows take a 64-byte swizzle).
// - d 192: O is 96 regs/thread; 128 keys would need 48 + 4 x 48 KB, so
//   112 (a multiple of the 16-row page box): 48 + 4 x 42 KB = 216 KB.
// - (192, 128) (head_dim_v 128): S and O are d 128's, so are its 128 keys;
//   48 + 2 x (48 + 32) KB = 208 KB.
// - FP8: 128 x 128 at every head dim, so that one tile is one block of the
//   quantizer's scales (flash3::kFp8ScaleBlock); half the bytes of 16-bit
//   tiles leave room for a third K/V stage up to d = 128.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool fp8 = false, int head_dim_v = 0) {
  if (fp8) return head_dim <= 128 ? FwdTileConfig{128, 128, 3} : FwdTileConfig{128, 128, 2};
  if (head_dim == 192 && head_dim_v == 128) return FwdTileConfig{128, 128, 2};
  return head_dim <= 64    ? FwdTileConfig{128, 128, 3}
         : head_dim <= 128 ? FwdTileConfig{128, 128, 2}
         : head_dim <= 192 ? FwdTileConfig{128, 112, 2}
                           : FwdTileConfig{128, 80, 2};
}

// The KV-cache kernel also keeps its page table, rotary and split bounds
// live: at d 192 its 112-key S spilled 8 bytes, 96 keys fit.
constexpr FwdTileConfig fwd_kvcache_tile_config(int head_dim) {
  FwdTileConfig tile = fwd_tile_config(head_dim);
  if (head_dim > 128 && head_dim <= 192) tile.block_n = 96;
  return tile;
}

// ALiBi (flash3.hpp) up to this head dim: at d = 256 the banded forward's
// registers are all taken (its bias pass spilled 6-13 values).
inline constexpr int kMaxAlibiHeadDim = 192;

struct BwdTileConfig {
  int block_m;    // query rows per mainloop step (one Q / dO tile)
  int block_n;    // keys per CTA (K and V stay resident)
  int q_stages;   // Q / dO shared-memory pipeline depth
};

// Why these shapes:
// - block_n 128 for d <= 128: each consumer warpgroup owns 64 keys, holds
//   dK and dV for them (64 x d fp32 each: 2 x 64 regs/thread at d = 128) and
//   feeds P^T and dS^T to those GEMMs from registers.
// - d 256 (and 192): 64 keys x 256 of dK and dV would be 256 regs/thread
//   (192: 192), so block_n drops to 64 and the warpgroups split the head dim
//   instead; P^T and dS^T then go through shared memory.
// - block_m 64: one WGMMA M for the dQ tile; Q and dO of 2 stages fit next to
//   resident K, V (d = 256: 64 KB + 128 KB + P/dS 32 KB).
constexpr BwdTileConfig bwd_tile_config(int head_dim) {
  return head_dim <= 128 ? BwdTileConfig{64, 128, 2} : BwdTileConfig{64, 64, 2};
}

}  // namespace flash3::kernels
