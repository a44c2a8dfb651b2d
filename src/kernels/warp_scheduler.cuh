// Ping-pong between the two consumer warpgroups (FA3 paper, section 3.1):
// a warpgroup issues its WGMMAs only on its turn and hands the turn over
// right after issuing, so while one warpgroup's GEMMs occupy the tensor cores
// the other runs its softmax on the MUFU and FMA units.
#pragma once

#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

namespace flash3::kernels {

// Named-barrier ids (CUTLASS adds its reserved count).
enum class FwdNamedBarrier : uint32_t {
  kConsumer0Turn = 0,
  kConsumer1Turn = 1,
  kQGathered0 = 2,  // consumer warpgroup 0 (1: + 1) has written its rows of Q (gather_q)
  kAppended = 4,    // the consumers have written the new keys and values (append_kv)
};

// kEnabled = false: every call is a no-op (the ablation without ping-pong).
template <bool kEnabled>
struct PingPongScheduler {
  static constexpr uint32_t kThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  int warpgroup;  // 0 or 1 among the consumers

  CUTE_DEVICE static uint32_t turn_of(int wg) {
    return uint32_t(FwdNamedBarrier::kConsumer0Turn) + uint32_t(wg);
  }
  // Consumer 0 goes first.
  CUTE_DEVICE void start() const {
    if (kEnabled && warpgroup == 1) cutlass::arch::NamedBarrier::arrive(kThreads, turn_of(0));
  }
  CUTE_DEVICE void wait_turn() const {
    if (kEnabled) cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, turn_of(warpgroup));
  }
  CUTE_DEVICE void pass_turn() const {
    if (kEnabled) cutlass::arch::NamedBarrier::arrive(kThreads, turn_of(1 - warpgroup));
  }
  // After the last GEMMs of a tile: consumer 1's hand-over would have no
  // taker, and would leave the barrier half-arrived.
  CUTE_DEVICE void pass_last_turn() const {
    if (warpgroup == 0) pass_turn();
  }
};

}  // namespace flash3::kernels
