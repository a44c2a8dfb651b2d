// dQ = sum over key blocks of dS K: every CTA adds its (query block x head
// dim) share into an fp32 tile of the workspace.
//
// The tile is stored in the consumers' register order, not row-major: value
// v of consumer thread t sits at ((v / 4) * threads + t) * 4 + v % 4, so a
// warp's float4 writes (to shared memory, or atomics to global) cover 512
// contiguous bytes instead of eight rows 8 * head_dim * 4 bytes apart. The
// conversion kernel (bwd_kernel.cuh) reads the same order back.
//
// d <= 192: consumers write the tile to shared memory and one warp of the
// producer warpgroup adds it to global memory with a bulk reduce (one
// cp.reduce.async.bulk per tile, off the consumers' critical path). d = 256
// has no shared memory left for the tile: consumers add with float4 atomics.
// Deterministic mode orders the adds of a tile by key block with a semaphore
// (see turn()).
#pragma once

#include <cuda/atomic>
#include <cuda/ptx>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernels/attention_mask.cuh"
#include "kernels/bwd_kernel_params.cuh"
#include "kernels/fragment_layout.cuh"

namespace flash3::kernels {

using namespace cute;

// Named-barrier ids of the backward (CUTLASS adds its reserved count).
enum class BwdNamedBarrier : uint32_t {
  kPdSWritten = 0,  // dS^T (and P^T at d = 256) in shared memory
  kDQOrder = 1,     // consumers: deterministic atomic adds
  kDQFull = 2,      // consumers -> dQ writer: the tile is in shared memory
  kDQEmpty = 3,     // dQ writer -> consumers: the bulk reduce has read it
  kSinkSum = 4,     // consumers: each warp's share of the sinks' gradient in shared memory
};

template <class Traits>
struct DQAccumulator {
  using Params = BwdKernelParams<Traits>;
  static constexpr int kThreads = Traits::kNumConsumerThreads;
  static constexpr int kValues = Traits::kBlockM * Traits::kHeadDim / kThreads;
  static_assert(kValues % 4 == 0);
  static constexpr uint32_t kTileBytes = sizeof(float) * Traits::kBlockM * Traits::kHeadDim;
  static constexpr uint32_t kWriterThreads = kThreads + cutlass::NumThreadsPerWarp;

  using Mask = AttentionMask<Traits::kBanded, Traits::kBlockM, Traits::kBlockN>;

  // `stats_row`: the first workspace row of one (sequence, head) (BwdMainloop::stats_row).
  CUTE_DEVICE static float* global_tile(Params const& p, int64_t stats_row, int m_block) {
    return p.ws.dq_accum + (stats_row + int64_t(m_block) * Traits::kBlockM) * Traits::kHeadDim;
  }
  CUTE_DEVICE static int* semaphore(Params const& p, int64_t stats_row, int m_block) {
    return p.ws.dq_semaphore + stats_row / Traits::kBlockM + m_block;
  }
  // Deterministic mode: key block n_block adds to tile m_block after `turn`
  // other key blocks. Ascending for full attention, where every CTA starts at
  // query block 0. Banded (causal, window): from the last key block that
  // reaches the tile down to the first, the order in which CTAs started
  // together arrive (the CTA of key block n starts at the diagonal tile), so
  // no CTA idles for the CTAs of lower key blocks to catch up; run_bwd
  // launches key blocks in reverse then, so a CTA only waits on CTAs
  // dispatched before it.
  CUTE_DEVICE static int turn(Mask const& mask, int n_block, int m_block) {
    if constexpr (Traits::kBanded) {
      return mask.n_block_end(m_block) - 1 - n_block;
    } else {
      return n_block;
    }
  }
  // Spins until `turn` key blocks have added to the tile (one thread).
  CUTE_DEVICE static void wait_turn(int* sem, int turn) {
    cuda::atomic_ref<int, cuda::thread_scope_device> adds(*sem);
    while (adds.load(cuda::memory_order_acquire) != turn) {
    }
  }
  CUTE_DEVICE static void pass_turn(int* sem, int turn) {
    cuda::atomic_ref<int, cuda::thread_scope_device> adds(*sem);
    adds.store(turn + 1, cuda::memory_order_release);
  }
  CUTE_DEVICE static float4* chunk(float* tile, int thread, int c) {
    return reinterpret_cast<float4*>(tile) + c * kThreads + thread;
  }
  template <class Frag>
  CUTE_DEVICE static float4 values(Frag const& frag, int c) {
    return make_float4(frag(4 * c), frag(4 * c + 1), frag(4 * c + 2), frag(4 * c + 3));
  }

  // Consumers, d <= 192: hand the tile to the writer warp. `step` counts the
  // CTA's query blocks; the writer frees the buffer after every step but the last.
  template <class Frag>
  CUTE_DEVICE static void to_writer(float* smem_tile, int thread, int step, Frag const& acc) {
    static_assert(decltype(size(acc))::value == kValues);
    if (step > 0) cutlass::arch::NamedBarrier::sync(kWriterThreads, uint32_t(BwdNamedBarrier::kDQEmpty));
    CUTE_UNROLL
    for (int c = 0; c < kValues / 4; ++c) *chunk(smem_tile, thread, c) = values(acc, c);
    cutlass::arch::fence_view_async_shared();  // generic-proxy stores, bulk-copy reads
    cutlass::arch::NamedBarrier::arrive(kWriterThreads, uint32_t(BwdNamedBarrier::kDQFull));
  }

  // One warp of the producer warpgroup, d <= 192: adds each tile the
  // consumers hand over, for query blocks [m_begin, m_end) of `head`;
  // `last_head`: the CTA's last head, whose last tile needs no free buffer
  // after it. (No step counters: the producer's 24 registers are full.)
  CUTE_DEVICE static void writer(Params const& p, Mask const& mask, float const* smem_tile,
                                 int64_t stats_row, int n_block, int m_begin, int m_end, bool last_head) {
    bool const leader = cute::elect_one_sync();
    for (int m_block = m_begin; m_block < m_end; ++m_block) {
      cutlass::arch::NamedBarrier::sync(kWriterThreads, uint32_t(BwdNamedBarrier::kDQFull));
      if (leader) {
        int* sem = p.deterministic ? semaphore(p, stats_row, m_block) : nullptr;
        int const my_turn = sem != nullptr ? turn(mask, n_block, m_block) : 0;
        if (sem != nullptr) wait_turn(sem, my_turn);
        cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                                        cuda::ptx::op_add, global_tile(p, stats_row, m_block),
                                        smem_tile, kTileBytes);
        cuda::ptx::cp_async_bulk_commit_group();
        if (sem != nullptr) {
          // The adds must be done, not only the reads, before the next key block's.
          cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
          cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
          pass_turn(sem, my_turn);
        } else {
          cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
        }
      }
      __syncwarp();
      if (!last_head || m_block + 1 < m_end)
        cutlass::arch::NamedBarrier::arrive(kWriterThreads, uint32_t(BwdNamedBarrier::kDQEmpty));
    }
    if (leader) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  }

  // Consumers, d = 256: float4 atomics straight from registers.
  template <class Frag>
  CUTE_DEVICE static void add_atomic(Params const& p, Mask const& mask, int64_t stats_row, int n_block,
                                     int m_block, int thread, Frag const& acc) {
    static_assert(decltype(size(acc))::value == kValues);
    float* tile = global_tile(p, stats_row, m_block);
    int* sem = p.deterministic ? semaphore(p, stats_row, m_block) : nullptr;
    int const my_turn = sem != nullptr ? turn(mask, n_block, m_block) : 0;
    if (sem != nullptr) {
      if (thread == 0) wait_turn(sem, my_turn);
      cutlass::arch::NamedBarrier::sync(kThreads, uint32_t(BwdNamedBarrier::kDQOrder));
    }
    CUTE_UNROLL
    for (int c = 0; c < kValues / 4; ++c) atomicAdd(chunk(tile, thread, c), values(acc, c));
    if (sem != nullptr) {
      __threadfence();
      cutlass::arch::NamedBarrier::sync(kThreads, uint32_t(BwdNamedBarrier::kDQOrder));
      if (thread == 0) pass_turn(sem, my_turn);
    }
  }
};

}  // namespace flash3::kernels
