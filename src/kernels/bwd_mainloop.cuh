// Backward mainloop: the producer's TMA loads (K, V once; Q, dO and their row
// statistics per query block) and the consumers' five GEMMs per query block.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cmath>

#include "kernels/attention_mask.cuh"
#include "kernels/bwd_kernel_params.cuh"
#include "kernels/dq_accumulator.cuh"
#include "kernels/fragment_layout.cuh"
#include "kernels/online_softmax.cuh"
#include "kernels/packed_sequence.cuh"
#include "kernels/wgmma_gemm.cuh"

namespace flash3::kernels {

using namespace cute;

// Where one CTA works: a block of keys of one KV head of one batch entry. It
// walks the query blocks of every query head that shares this KV head, so
// dK and dV of a GQA group are summed in registers. Varlen: the sequence's
// first rows in the packed tensors, its lengths, and its start in the
// workspace (otherwise left 0: the params give them).
struct BwdTile {
  int n_block;
  int kv_head;
  int batch;
  int offset_q = 0;
  int offset_k = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int stats_start = 0;
};

template <class Traits>
struct BwdMainloop {
  using Element = typename Traits::Element;
  using Params = BwdKernelParams<Traits>;
  using SharedStorage = typename Traits::SharedStorage;
  using Mask = AttentionMask<Traits::kBanded, Traits::kBlockM, Traits::kBlockN>;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  using TileQ = typename Traits::TileQ;

  static constexpr bool kVarlen = Traits::kVarlen;

  CUTE_DEVICE static BwdTile make_tile(Params const& p, int n_block, int kv_head, int batch) {
    if constexpr (kVarlen) {
      PackedSequence const q = packed_sequence(p.cu_seqlens_q, p.seqused_q, batch, p.total_q, p.seqlen_q);
      PackedSequence const k = packed_sequence(p.cu_seqlens_k, p.seqused_k, batch, p.total_k, p.seqlen_k);
      return {n_block, kv_head, batch, q.offset, k.offset, q.length, k.length,
              padded_sequence_start(q, batch, kBlockM)};
    } else {
      return {n_block, kv_head, batch};
    }
  }

  // Fixed lengths read the params directly (the constant bank: no registers).
  CUTE_DEVICE static int seqlen_q(Params const& p, BwdTile const& tile) {
    return kVarlen ? tile.seqlen_q : p.seqlen_q;
  }
  CUTE_DEVICE static int seqlen_k(Params const& p, BwdTile const& tile) {
    return kVarlen ? tile.seqlen_k : p.seqlen_k;
  }
  CUTE_DEVICE static Mask make_mask(Params const& p, BwdTile const& tile) {
    if constexpr (kVarlen) {
      return varlen_mask(p, tile.seqlen_q, tile.seqlen_k);
    } else {
      return {p.seqlen_q, p.seqlen_k, p.key_lo, p.key_hi};
    }
  }
  CUTE_DEVICE static Mask varlen_mask(Params const& p, int seqlen_q, int seqlen_k) {
    int const diagonal = seqlen_k - seqlen_q;
    return {seqlen_q, seqlen_k, diagonal + p.key_lo, diagonal + p.key_hi};
  }
  // The mask inside compute()'s loop. Varlen: the lengths the kernel put in
  // shared memory, read at each step (volatile: not hoisted); held in
  // registers through the loop, they made d = 128 spill.
  CUTE_DEVICE static Mask step_mask(Params const& p, SharedStorage& smem, BwdTile const& tile) {
    if constexpr (kVarlen) {
      auto const* lengths = reinterpret_cast<int const volatile*>(smem.sequence_lengths);
      return varlen_mask(p, lengths[0], lengths[1]);
    } else {
      return make_mask(p, tile);
    }
  }

  // First workspace row of (the tile's sequence, head): bwd_run.h's layouts.
  CUTE_DEVICE static int64_t stats_row(Params const& p, BwdTile const& tile, int head) {
    int64_t const start = kVarlen ? tile.stats_start : int64_t(tile.batch) * p.heads_q * p.ws.head_rows;
    return start + int64_t(head) * p.ws.head_rows;
  }

  // (rows, kCols) of one head of the tile's sequence in the tensor `tma`
  // loads (`rows` per batch entry; kCols: Q's or V's head dim); varlen: TMA
  // sees the packed tensors as one batch entry, the sequence from row `offset`.
  template <int kCols, class Tma>
  CUTE_DEVICE static auto sequence_rows(Params const& p, Tma const& tma, int rows, int heads, int head,
                                        int batch, int offset) {
    if constexpr (kVarlen) {
      Tensor m = tma.get_tma_tensor(make_shape(rows, Int<kCols>{}, heads, 1));
      return domain_offset(make_coord(offset, _0{}), m(_, _, head, _0{}));
    } else {
      return tma.get_tma_tensor(make_shape(rows, Int<kCols>{}, heads, p.batch))(_, _, head, batch);
    }
  }

  // Run by one producer thread, once per CTA.
  CUTE_DEVICE static void load_kv(Params const& p, SharedStorage& smem, BwdTile tile) {
    int const heads_kv = p.heads_q / p.heads_per_kv_head;
    int const rows = kVarlen ? p.total_k : p.seqlen_k;
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    auto const coord = make_coord(tile.n_block, _0{});
    constexpr int kD = Traits::kHeadDim, kDv = Traits::kHeadDimV;
    Tensor gK = local_tile(sequence_rows<kD>(p, p.tma_k, rows, heads_kv, tile.kv_head, tile.batch, tile.offset_k),
                           typename Traits::TileK{}, coord);
    Tensor gV = local_tile(sequence_rows<kDv>(p, p.tma_v, rows, heads_kv, tile.kv_head, tile.batch, tile.offset_k),
                           typename Traits::TileV{}, coord);
    auto [tKgK, tKsK] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));
    smem.barrier_kv.arrive_and_expect_tx(Traits::kKVBytes);
    auto& barrier = reinterpret_cast<uint64_t&>(smem.barrier_kv);
    copy(p.tma_k.with(barrier, 0), tKgK, tKsK);
    copy(p.tma_v.with(barrier, 0), tVgV, tVsV);
  }

  // Run by one producer thread: Q with its LSE and dO with its D for query
  // blocks [m_begin, m_end) of `head`.
  template <class Pipeline, class PipelineState>
  CUTE_DEVICE static void load_q_do(Params const& p, SharedStorage& smem, BwdTile tile, int head,
                                    int m_begin, int m_end, Pipeline& pipeline_q,
                                    Pipeline& pipeline_do, PipelineState& write) {
    int const rows = kVarlen ? p.total_q : p.seqlen_q;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
    constexpr int kD = Traits::kHeadDim, kDv = Traits::kHeadDimV;
    Tensor gQ = local_tile(sequence_rows<kD>(p, p.tma_q, rows, p.heads_q, head, tile.batch, tile.offset_q),
                           TileQ{}, make_coord(_, _0{}));  // (M, D, m)
    Tensor gdO = local_tile(sequence_rows<kDv>(p, p.tma_do, rows, p.heads_q, head, tile.batch, tile.offset_q),
                            typename Traits::TileDO{}, make_coord(_, _0{}));
    auto [tQgQ, tQsQ] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));
    auto [tdOgdO, tdOsdO] = tma_partition(p.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                          group_modes<0, 2>(gdO));
    float const* lse = p.ws.lse_log2 + stats_row(p, tile, head);
    float const* dpsum = p.ws.dpsum + stats_row(p, tile, head);
#pragma unroll 1  // unrolled, the loop needs more than the producer's registers
    for (int m_block = m_begin; m_block < m_end; ++m_block) {
      int const stage = write.index();
      pipeline_q.producer_acquire(write);
      uint64_t* barrier_q = pipeline_q.producer_get_barrier(write);
      copy(p.tma_q.with(*barrier_q, 0), tQgQ(_, m_block), tQsQ(_, stage));
      SM90_BULK_COPY_G2S::copy(lse + m_block * kBlockM, barrier_q,
                               smem.lse_log2.data() + stage * kBlockM, Traits::kRowStatBytes);
      pipeline_do.producer_acquire(write);
      uint64_t* barrier_do = pipeline_do.producer_get_barrier(write);
      copy(p.tma_do.with(*barrier_do, 0), tdOgdO(_, m_block), tdOsdO(_, stage));
      SM90_BULK_COPY_G2S::copy(dpsum + m_block * kBlockM, barrier_do,
                               smem.dpsum.data() + stage * kBlockM, Traits::kRowStatBytes);
      ++write;
    }
  }

  // ALiBi (without softcap: validated) on the transposed scores (rows are
  // keys): score (key, query) gains -slope * |query + seqlen_k - seqlen_q -
  // key|, `slope` in units of the raw scores, as the forward added it.
  template <class Scores, class Coords>
  CUTE_DEVICE static void add_alibi(Scores& scores_t, Coords const& coords, float slope, Mask const& mask,
                                    int m_block, int n_block) {
    int const diagonal = mask.seqlen_k - mask.seqlen_q + m_block * kBlockM - n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores_t); ++i) {
      int const key_minus_diagonal = int(get<0>(coords(i, 0))) - diagonal;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores_t); ++j)
        scores_t(i, j) = fmaf(-slope, float(abs(int(get<1>(coords(i, j))) - key_minus_diagonal)), scores_t(i, j));
    }
  }

  // Run by all consumer threads (`thread` = index among them) for query
  // blocks [m_begin, m_end) of `head`; accumulates into acc_dk / acc_dv.
  // `step` counts the query blocks this CTA has done (selects the dS buffer).
  template <class Pipeline, class PipelineState, class FragDK, class FragDV>
  CUTE_DEVICE static void compute(Params const& p, SharedStorage& smem, BwdTile tile, int head,
                                  int m_begin, int m_end, int thread, Pipeline& pipeline_q,
                                  Pipeline& pipeline_do, PipelineState& read, int& step,
                                  FragDK& acc_dk, FragDV& acc_dv) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutPdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutPdSt{});
    Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::SmemLayoutPdS{});

    using TileST = Shape<Int<kBlockN>, Int<kBlockM>>;  // (keys, queries)
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDK mma_dk;
    typename Traits::TiledMmaDV mma_dv;
    typename Traits::TiledMmaDQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(thread);
    auto thr_dk = mma_dk.get_thread_slice(thread);
    auto thr_dv = mma_dv.get_thread_slice(thread);
    auto thr_dq = mma_dq.get_thread_slice(thread);

    Tensor tSrK = thr_sdp.partition_fragment_A(sK);
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = thr_dv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = thr_dk.partition_fragment_B(sQt);
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdSt);    // (MMA, MMA_M, MMA_K, buffer)
    Tensor tdQrKt = thr_dq.partition_fragment_B(sKt(_, _, 0));

    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto r2s_thread = r2s.get_thread_slice(thread);
    Tensor tdSsdS = r2s_thread.partition_D(sdS);  // (CPY, CPY_M, CPY_N, buffer)
    Tensor tPsP = r2s_thread.partition_D(sP);

    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(TileST{}));
    Tensor coords = make_tensor(tScS.data(), acc_rowcol_layout(tScS.layout()));
    constexpr int kCols = decltype(size<1>(coords))::value;

    bool const softcap = p.softcap_input_scale != 0.f;
    // The sinks' gradient is -sum_j P_sink,j sum_i P_ij dP_ij (j: queries, i:
    // keys); D_j = rowsum(dO O) from the rounded output is not accurate enough
    // for it. Each CTA adds sum_j P_sink,j sum_i P_ij (dP_ij - D_j), the sum
    // of dS without softcap's factor; bwd_sink_grad_kernel adds the missing
    // P_sink,j D_j (1 - P_sink,j) per query (sum_i P_ij = 1 - P_sink,j), in
    // which D's error cancels.
    float const sink_log2 = p.sinks != nullptr ? p.sinks[head] * float(M_LOG2E) : 0.f;
    float sink_sum = 0.f;
    bool const alibi = p.alibi_slopes != nullptr;
    for (int m_block = m_begin; m_block < m_end; ++m_block, ++step) {
      int const stage = read.index();
      int const buffer = step % Traits::kDSBuffers;
      Tensor acc_s = partition_fragment_C(mma_sdp, TileST{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, TileST{});
      pipeline_q.consumer_wait(read);
      warpgroup_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
      pipeline_do.consumer_wait(read);
      warpgroup_gemm<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);

      // Row statistics are per query, i.e. per column here: read each once per
      // column (a column's rows share it) rather than holding them all.
      float const* lse = smem.lse_log2.data() + stage * kBlockM;
      float const* dpsum = smem.dpsum.data() + stage * kBlockM;
      Tensor scores = as_rowcol(acc_s);
      Tensor dp = as_rowcol(acc_dp);
      warpgroup_wait<1>();
      if (softcap) apply_softcap(scores, p.softcap_input_scale);
      Mask const mask = step_mask(p, smem, tile);
      // (The slope is read each step: held across the loop it spilled.)
      if (alibi)
        add_alibi(scores, coords, p.alibi_slopes[tile.batch * p.alibi_batch_stride + head] / p.softmax_scale,
                  mask, m_block, tile.n_block);
      if (mask.needs_mask(m_block, tile.n_block))
        mask.apply_transposed(scores, coords, m_block, tile.n_block);
      warpgroup_wait<0>();
      // P = exp(logit_scale * S - LSE) (padded and keyless rows have lse =
      // +inf: P = 0), and dS = P (dP - D), with softcap times d tanh = 1 - t^2
      // of the capped score t. Masked scores (t = -inf) have P = 0 and no
      // gradient. The exps wait for dP: run while dP was in flight they
      // measured 5-7 % slower at d = 64, the same at 128 and 256
      // (docs/performance.md). One
      // branch around each loop: tested per column, it split the loop into
      // blocks the scheduler could not interleave (7-15 % slower).
      auto const probability = [&](float s, float lse_j) {
        return fast_exp2(fmaf(s, p.scale_log2, -lse_j));
      };
      // P_sink of query j (0 for padding, whose lse is +inf) times its column's sum.
      auto const add_sink_share = [&](float lse_j, float column) {
        sink_sum = fmaf(fast_exp2(sink_log2 - lse_j), column, sink_sum);
      };
      if (p.sinks != nullptr && softcap) {  // dS will carry tanh's derivative: sum before
        CUTE_UNROLL
        for (int j = 0; j < kCols; ++j) {
          int const col = get<1>(coords(0, j));
          float const lse_j = lse[col], dpsum_j = dpsum[col];
          float column = 0.f;
          CUTE_UNROLL
          for (int i = 0; i < size<0>(dp); ++i)
            column = fmaf(probability(scores(i, j), lse_j), dp(i, j) - dpsum_j, column);
          add_sink_share(lse_j, column);
        }
      }
      if (softcap) {
        CUTE_UNROLL
        for (int j = 0; j < kCols; ++j) {
          int const col = get<1>(coords(0, j));
          float const lse_j = lse[col], dpsum_j = dpsum[col];
          CUTE_UNROLL
          for (int i = 0; i < size<0>(dp); ++i) {
            float const t = scores(i, j);
            float const prob = probability(t, lse_j);
            scores(i, j) = prob;
            dp(i, j) = prob > 0.f ? prob * (dp(i, j) - dpsum_j) * fmaf(-t, t, 1.f) : 0.f;
          }
        }
      } else {
        CUTE_UNROLL
        for (int j = 0; j < kCols; ++j) {
          int const col = get<1>(coords(0, j));
          float const lse_j = lse[col], dpsum_j = dpsum[col];
          CUTE_UNROLL
          for (int i = 0; i < size<0>(dp); ++i) {
            scores(i, j) = probability(scores(i, j), lse_j);
            dp(i, j) = scores(i, j) * (dp(i, j) - dpsum_j);
          }
        }
        if (p.sinks != nullptr) {  // dS itself: no exps again
          CUTE_UNROLL
          for (int j = 0; j < kCols; ++j) {
            float column = 0.f;
            CUTE_UNROLL
            for (int i = 0; i < size<0>(dp); ++i) column += dp(i, j);
            add_sink_share(lse[get<1>(coords(0, j))], column);
          }
        }
      }

      // P^T and dS^T in the input dtype, laid out as the A operand of m64nNk16.
      // (Issuing dV += P^T dO before dS is computed, to overlap them, measured
      // 3 % slower at d = 128 and 64: docs/performance.md.)
      Tensor tdVrP = make_tensor<Element>(acc_as_operand_a_layout(acc_s.layout()));
      Tensor tdKrdS = make_tensor<Element>(acc_as_operand_a_layout(acc_dp.layout()));
      convert_fragment(acc_s, tdVrP);
      convert_fragment(acc_dp, tdKrdS);
      if constexpr (Traits::kDKVFromRegisters) {
        warpgroup_gemm<false>(mma_dv, tdVrP, tdVrdOt(_, _, _, stage), acc_dv);
        warpgroup_gemm<false>(mma_dk, tdKrdS, tdKrQt(_, _, _, stage), acc_dk);
      } else {
        // stmatrix: 8x8 blocks of the accumulator layout, one row address per thread.
        copy(r2s, r2s_thread.retile_S(make_tensor(tdVrP.data(), acc_s.layout())), tPsP(_, _, _, buffer));
      }
      copy(r2s, r2s_thread.retile_S(make_tensor(tdKrdS.data(), acc_dp.layout())), tdSsdS(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();  // generic-proxy stores, WGMMA reads
      cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads,
                                        uint32_t(BwdNamedBarrier::kPdSWritten));
      if constexpr (!Traits::kDKVFromRegisters) {
        Tensor tdVsP = thr_dv.partition_fragment_A(sP);  // (MMA, MMA_M, MMA_K, buffer)
        Tensor tdKsdS = thr_dk.partition_fragment_A(sdS);
        warpgroup_gemm<false>(mma_dv, tdVsP(_, _, _, buffer), tdVrdOt(_, _, _, stage), acc_dv);
        warpgroup_gemm<false>(mma_dk, tdKsdS(_, _, _, buffer), tdKrQt(_, _, _, stage), acc_dk);
      }
      Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
      warpgroup_gemm<true>(mma_dq, tdQrdS(_, _, _, buffer), tdQrKt, acc_dq);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dk);
      warpgroup_fence_operand(acc_dv);
      pipeline_q.consumer_release(read);
      pipeline_do.consumer_release(read);
      ++read;
      if constexpr (Traits::kDQInSmem) {
        DQAccumulator<Traits>::to_writer(smem.dq.data(), thread, step, acc_dq);
      } else {
        DQAccumulator<Traits>::add_atomic(p, mask, stats_row(p, tile, head), tile.n_block, m_block,
                                          thread, acc_dq);
      }
    }
    if (p.sinks != nullptr) write_sink_partial(p, smem, tile, head, thread, sink_sum);
  }

  // The consumers' sum of `value` (a fixed order: shuffles, then warp 0's
  // thread adds the warps in turn) into ws.sink_partials[batch, head, n_block].
  // Written for every key block, also those no query sees (0).
  CUTE_DEVICE static void write_sink_partial(Params const& p, SharedStorage& smem, BwdTile tile,
                                             int head, int thread, float value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffff, value, offset);
    if (thread % 32 == 0) smem.sink_sums[thread / 32] = value;
    auto const sync = [] {
      cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads,
                                        uint32_t(BwdNamedBarrier::kSinkSum));
    };
    sync();
    if (thread == 0) {
      float total = 0.f;
      for (int w = 0; w < Traits::kNumConsumerThreads / 32; ++w) total += smem.sink_sums[w];
      write_sink_share(p, tile, head, total);
    }
    sync();  // the next head writes sink_sums again
  }
  CUTE_DEVICE static void write_sink_share(Params const& p, BwdTile const& tile, int head, float value) {
    int64_t const row = int64_t(tile.batch) * p.heads_q + head;
    p.ws.sink_partials[row * p.ws.sink_key_blocks + tile.n_block] = value;
  }
};

}  // namespace flash3::kernels
