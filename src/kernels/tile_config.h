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
constexpr FwdTileConfig fwd_tile_config(int head_dim) {
  return head_dim <= 64    ? FwdTileConfig{128, 128, 2}
         : head_dim <= 128 ? FwdTileConfig{128, 128, 2}
                           : FwdTileConfig{128, 80, 2};
}

}  // namespace flash3::kernels
