// Forward mainloop: the producer's TMA loads and the consumers' two GEMMs
// with the online softmax between them. A tile walks its key blocks
// [n_block_begin, n_block_end) from the last to the first, so the blocks that
// need masking at the sequence end or right edge of the window (the causal
// diagonal) come first; only a sliding window's left edge is masked at the end.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernels/attention_mask.cuh"
#include "kernels/fragment_layout.cuh"
#include "kernels/fwd_kernel_params.cuh"
#include "kernels/online_softmax.cuh"
#include "kernels/packed_sequence.cuh"
#include "kernels/tile_config.h"
#include "kernels/warp_scheduler.cuh"
#include "kernels/wgmma_gemm.cuh"

namespace flash3::kernels {

using namespace cute;

// One tile of work: a block of query rows of one head of one batch entry.
// Varlen: the sequence's first rows in the packed q / k and its lengths; KV
// cache: the cache entry, first key and key count (otherwise left 0: the
// lengths are the params'). kv_batch: K / V's batch index; split: which
// split of the keys (split-KV). PackGQA: head is the first of the tile's
// `pack` heads (FwdMainloop::query_row). cached_k (append): the cache's keys
// before this call, where the new ones start.
struct FwdTile {
  int m_block;
  int head;
  int batch;
  int offset_q = 0;
  int offset_k = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int kv_batch = 0;
  int split = 0;
  int cached_k = 0;
};

template <class Traits>
struct FwdMainloop {
  using Element = typename Traits::Element;
  using Params = FwdKernelParams<Traits>;
  using SharedStorage = typename Traits::SharedStorage;
  using TileShape = typename Traits::TileShape;
  // KV-cache kernels pack GQA groups (pack_gqa.h), pack 1 included.
  using Mask = AttentionMask<Traits::kBanded, Traits::kBlockM, Traits::kBlockN, Traits::kKvCache>;
  static constexpr int kHeadDim = Traits::kHeadDim;

  static constexpr bool kVarlen = Traits::kVarlen;
  static constexpr bool kKvCache = Traits::kKvCache;
  // Lengths per batch entry, in the tile (else the params').
  static constexpr bool kTileLengths = kVarlen || kKvCache;
  // q and out packed (varlen, or varlen q over a cache): one batch entry of
  // total_q rows, lse (heads_q, total_q).
  CUTE_DEVICE static bool packed_q(Params const& p) {
    return kVarlen || (kKvCache && p.cu_seqlens_q != nullptr);
  }
  // Producer warps whose threads issue loads (KV cache: K's and V's apart),
  // and the threads of the append barrier: the consumers and those warps.
  static constexpr int kLoadingWarps = kKvCache ? 2 : 1;
  static constexpr int kAppendedThreads =
      Traits::kNumConsumerThreads + kLoadingWarps * cutlass::NumThreadsPerWarp;

  // The query row and head of row `row` of the tile's sequence (counted from
  // its first row): PackGQA's rows are queries times `pack` heads.
  struct QueryRow {
    int row;
    int head;
  };
  CUTE_DEVICE static QueryRow query_row(Params const& p, FwdTile const& tile, int row) {
    if constexpr (kKvCache) {
      return {row / p.pack, tile.head + row % p.pack};
    } else {
      return {row, tile.head};
    }
  }

  // KV cache: `head` counts the scheduler's groups of `pack` heads.
  CUTE_DEVICE static FwdTile make_tile(Params const& p, int m_block, int head, int batch,
                                       int split = 0) {
    if constexpr (kVarlen) {
      PackedSequence const q = packed_sequence(p.cu_seqlens_q, p.seqused_q, batch, p.total_q, p.seqlen_q);
      PackedSequence const k = packed_sequence(p.cu_seqlens_k, p.seqused_k, batch, p.total_k, p.seqlen_k);
      return {m_block, head, batch, q.offset, k.offset, q.length, k.length, batch};
    } else if constexpr (kKvCache) {
      // Device arrays the host cannot check: clamped into the cache, so
      // inconsistent ones give a wrong answer, never an access outside it
      // (a batch index outside the cache reads TMA's zeros).
      PackedSequence const q = packed_q(p)
                                   ? packed_sequence(p.cu_seqlens_q, p.seqused_q, batch, p.total_q, p.seqlen_q)
                                   : PackedSequence{0, p.seqlen_q};
      // Varlen q appends one key per query (k_new packed like q; seqlen_new
      // is then seqlen_q, the longest).
      int const new_keys = packed_q(p) ? min(q.length, p.seqlen_new) : p.seqlen_new;
      int const cached = p.seqused_k != nullptr ? min(max(p.seqused_k[batch], 0), p.seqlen_k) : p.seqlen_k;
      int const used = min(cached + new_keys, p.seqlen_k);
      int const leftpad = p.leftpad_k != nullptr ? min(max(p.leftpad_k[batch], 0), used) : 0;
      int const kv_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[batch] : batch;
      return {m_block, head * p.pack, batch, q.offset, leftpad, q.length, used - leftpad, kv_batch, split,
              cached};
    } else {
      return {m_block, head, batch, 0, 0, 0, 0, batch};
    }
  }

  // Fixed lengths read the params directly (from the constant bank: no
  // registers held across the mainloop).
  CUTE_DEVICE static Mask make_mask(Params const& p, FwdTile const& tile) {
    if constexpr (kKvCache) {
      int const diagonal = tile.seqlen_k - tile.seqlen_q;
      return {tile.seqlen_q, tile.seqlen_k, diagonal + p.key_lo, diagonal + p.key_hi, p.pack};
    } else if constexpr (kVarlen) {
      int const diagonal = tile.seqlen_k - tile.seqlen_q;
      return {tile.seqlen_q, tile.seqlen_k, diagonal + p.key_lo, diagonal + p.key_hi};
    } else {
      return {p.seqlen_q, p.seqlen_k, p.key_lo, p.key_hi};
    }
  }

  // Varlen: TMA sees the packed tensors as one batch entry. KV cache: K and
  // V have cache_batch entries. FP8: V as V^T, (head_dim, padded keys,
  // heads, batch).
  CUTE_DEVICE static auto global_qkv(Params const& p) {
    int const rows_q = kVarlen ? p.total_q : p.seqlen_q;
    int const rows_k = kVarlen ? p.total_k : p.seqlen_k;
    int const batch = kVarlen ? 1 : p.batch;
    int const batch_kv = kKvCache ? p.cache_batch : batch;
    int const heads_kv = p.heads_q / p.heads_per_kv_head;
    auto const v_shape = [&] {
      if constexpr (Traits::kFp8) {
        return make_shape(Int<kHeadDim>{}, p.vt_keys, heads_kv, batch);
      } else {
        return make_shape(rows_k, Int<Traits::kHeadDimV>{}, heads_kv, batch_kv);
      }
    }();
    return cute::make_tuple(
        p.tma_q.get_tma_tensor(make_shape(rows_q, Int<kHeadDim>{}, p.heads_q, batch)),
        p.tma_k.get_tma_tensor(make_shape(rows_k, Int<kHeadDim>{}, heads_kv, batch_kv)),
        p.tma_v.get_tma_tensor(v_shape));
  }

  // (rows, head_dim) of one head of the tile's sequence, from row `offset`
  // of batch entry `batch` (varlen: of the one packed entry).
  template <class GlobalTensor>
  CUTE_DEVICE static auto sequence_rows(GlobalTensor const& m, int head, int batch, int offset) {
    if constexpr (kVarlen) {
      return domain_offset(make_coord(offset, _0{}), m(_, _, head, _0{}));
    } else if constexpr (kKvCache) {
      return domain_offset(make_coord(offset, _0{}), m(_, _, head, batch));
    } else {
      return m(_, _, head, batch);
    }
  }

  // Paged KV: a key block is one TMA box per kPageBoxRows keys, each from
  // the page that holds them. Boxes past the sequence name a page past the
  // cache, for which TMA delivers zeros (and the full byte count the stage
  // expects).
  static constexpr int kPageBoxes = Traits::kBlockN / Traits::kPageBoxRows;
  struct BlockPages {
    int page[kPageBoxes];
  };
  // Block n_block's pages, fetched a block ahead of their TMA loads: the
  // loads are in flight while the producer waits for a free stage, where a
  // read just before each TMA would cost a dependent global load per box.
  CUTE_DEVICE static BlockPages block_pages(Params const& p, FwdTile const& tile, int n_block) {
    int const* pages = p.page_table + tile.batch * p.page_table_stride;
    BlockPages b;
    int const boxes = whole_blocks_per_page(p) ? 1 : kPageBoxes;
    CUTE_UNROLL
    for (int box = 0; box < kPageBoxes; ++box) {
      int const key = n_block * Traits::kBlockN + box * Traits::kPageBoxRows;
      if (box < boxes) b.page[box] = key < tile.seqlen_k ? pages[key / p.page_size] : p.cache_batch;
    }
    return b;
  }

  // Pages of whole key blocks take one TMA box per block, as unpaged K / V do.
  CUTE_DEVICE static bool whole_blocks_per_page(Params const& p) {
    return p.page_size % Traits::kBlockN == 0;
  }

  // Paged KV: key block n_block (its pages `pages`) into one stage of
  // `s_tile` (K or V).
  template <class TmaBlock, class TmaBox, class SmemTensor>
  CUTE_DEVICE static void load_paged_block(Params const& p, TmaBlock const& tma_block,
                                           TmaBox const& tma, SmemTensor& s_tile,
                                           uint64_t& barrier, BlockPages const& pages,
                                           int kv_head, int n_block, int stage) {
    constexpr int kBoxRows = Traits::kPageBoxRows;
    auto const page_shape = make_shape(p.page_size, Int<kHeadDim>{},
                                       p.heads_q / p.heads_per_kv_head, p.cache_batch);
    if (whole_blocks_per_page(p)) {
      Tensor m = tma_block.get_tma_tensor(page_shape);
      int const key = n_block * Traits::kBlockN;
      Tensor g = local_tile(m(_, _, kv_head, pages.page[0]), select<1, 2>(TileShape{}),
                            make_coord((key % p.page_size) / Traits::kBlockN, _0{}));
      auto [tg, ts] = tma_partition(tma_block, _0{}, Layout<_1>{}, group_modes<0, 2>(s_tile),
                                    group_modes<0, 2>(g));
      copy(tma_block.with(barrier, 0), tg, ts(_, stage));
      return;
    }
    Tensor m = tma.get_tma_tensor(page_shape);
    CUTE_UNROLL
    for (int box = 0; box < kPageBoxes; ++box) {
      int const key = n_block * Traits::kBlockN + box * kBoxRows;
      Tensor g = local_tile(m(_, _, kv_head, pages.page[box]), typename Traits::PageBoxShape{},
                            make_coord((key % p.page_size) / kBoxRows, _0{}));
      Tensor s = make_tensor(make_smem_ptr(&s_tile(box * kBoxRows, 0, stage)),
                             typename Traits::SmemLayoutPageBox{});
      auto [tg, ts] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
      copy(tma.with(barrier, 0), tg, ts);
    }
  }

  // Run by one thread of the producer warp.
  template <class Pipeline, class PipelineState>
  CUTE_DEVICE static void load(Params const& p, SharedStorage& smem, FwdTile tile,
                               int n_block_begin, int n_block_end, Pipeline& pipeline_k,
                               Pipeline& pipeline_v, PipelineState& write, bool loads_k,
                               bool loads_v) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::VtLayout::LoadSmem{});
    auto const qkv = global_qkv(p);
    Tensor mQ = get<0>(qkv);
    Tensor mK = get<1>(qkv);
    Tensor mV = get<2>(qkv);
    int const kv_head = tile.head / p.heads_per_kv_head;
    Tensor gK = local_tile(sequence_rows(mK, kv_head, tile.kv_batch, tile.offset_k),
                           select<1, 2>(TileShape{}), make_coord(_, _0{}));  // (N, D, n_block)
    Tensor gV = [&] {
      if constexpr (Traits::kFp8) {  // (D, N, n_block) of V^T
        return local_tile(mV(_, _, kv_head, tile.batch), Shape<Int<kHeadDim>, Int<Traits::kBlockN>>{},
                          make_coord(_0{}, _));
      } else {
        return local_tile(sequence_rows(mV, kv_head, tile.kv_batch, tile.offset_k),
                          typename Traits::TileShapeV{}, make_coord(_, _0{}));
      }
    }();

    auto [tKgK, tKsK] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));

    if constexpr (!kKvCache) {  // (the KV-cache consumers gather Q: gather_q)
      Tensor gQ = local_tile(sequence_rows(mQ, tile.head, tile.batch, tile.offset_q),
                             select<0, 2>(TileShape{}), make_coord(tile.m_block, _0{}));  // (M, D)
      auto [tQgQ, tQsQ] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      smem.barrier_q.arrive_and_expect_tx(Traits::kQBytes);
      copy(p.tma_q.with(reinterpret_cast<uint64_t&>(smem.barrier_q), 0), tQgQ, tQsQ);
    }
    bool const paged = kKvCache && p.page_table != nullptr;
    BlockPages pages;
    if (paged) pages = block_pages(p, tile, n_block_end - 1);
    for (int n_block = n_block_end - 1; n_block >= n_block_begin; --n_block) {
      if (loads_k) {
        pipeline_k.producer_acquire(write);
        if constexpr (kKvCache) {
          if (paged)
            load_paged_block(p, p.tma_k, p.tma_k_page, sK, *pipeline_k.producer_get_barrier(write),
                             pages, kv_head, n_block, write.index());
        }
        if (!paged)
          copy(p.tma_k.with(*pipeline_k.producer_get_barrier(write), 0), tKgK(_, n_block),
               tKsK(_, write.index()));
      }
      if (loads_v) {
        pipeline_v.producer_acquire(write);
        if constexpr (kKvCache) {
          if (paged)
            load_paged_block(p, p.tma_v, p.tma_v_page, sV, *pipeline_v.producer_get_barrier(write),
                             pages, kv_head, n_block, write.index());
        }
        if (!paged)
          copy(p.tma_v.with(*pipeline_v.producer_get_barrier(write), 0), tVgV(_, n_block),
               tVsV(_, write.index()));
      }
      if (paged && n_block > n_block_begin) pages = block_pages(p, tile, n_block - 1);
      ++write;
    }
  }

  CUTE_DEVICE static uint4 load_chunk(Element const* at) { return *reinterpret_cast<uint4 const*>(at); }

  // Append (p.seqlen_new > 0; run by all consumer threads, before any TMA
  // load of the tile: FwdKernel's producer waits on kAppended): the new keys
  // and values this tile reads, those of key blocks [n_block_begin,
  // n_block_end), into the cache, keys rotated. The tile of query block 0 and
  // split 0 writes all of them, so keys no query sees (left of every
  // window) are in the cache too. Tiles of one KV head that read the same
  // keys write the same values: whichever store lands, a read sees them.
  // Entries or pages outside the cache are not written (their TMA reads
  // give zeros).
  CUTE_DEVICE static void append_kv(Params const& p, FwdTile const& tile, int n_block_begin,
                                    int n_block_end, int thread) {
    constexpr int kChunk = 16 / sizeof(Element);
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    int const end = tile.offset_k + tile.seqlen_k;
    bool const writes_all = tile.m_block == 0 && tile.split == 0;
    int const first = writes_all ? tile.cached_k
                                 : max(tile.cached_k, tile.offset_k + n_block_begin * Traits::kBlockN);
    int const last = writes_all ? end : min(end, tile.offset_k + n_block_end * Traits::kBlockN);
    int const kv_head = tile.head / p.heads_per_kv_head;
    for (int c = thread; c < (last - first) * kChunksPerRow; c += Traits::kNumConsumerThreads) {
      int const key = first + c / kChunksPerRow;
      int const col = c % kChunksPerRow * kChunk;
      int entry = tile.kv_batch, row = key;
      if (p.page_table != nullptr) {
        entry = p.page_table[tile.batch * p.page_table_stride + key / p.page_size];
        row = key % p.page_size;
      }
      if (entry < 0 || entry >= p.cache_batch) continue;
      // (Varlen q: new key i of the sequence is packed row offset_q + i.)
      int const entry_new = packed_q(p) ? 0 : tile.batch;
      int const i = key - tile.cached_k + (packed_q(p) ? tile.offset_q : 0);
      Element const* const k_row = p.k_new.row(entry_new, i, kv_head);
      uint4 k = load_chunk(k_row + col);
      if (p.rotary.rotates(col))
        k = p.rotary.rotate(k, p.rotary.interleaved ? k : load_chunk(k_row + p.rotary.partner(col)), col, key);
      *reinterpret_cast<uint4*>(p.k_cache.row(entry, row, kv_head) + col) = k;
      *reinterpret_cast<uint4*>(p.v_cache.row(entry, row, kv_head) + col) =
          load_chunk(p.v_new.row(entry_new, i, kv_head) + col);
    }
    // The producer's TMA (the async proxy) reads what these generic stores
    // wrote; CUTLASS has this fence for shared memory only.
    asm volatile("fence.proxy.async.global;" ::: "memory");
    appended();
  }

  // Releases the producer's wait on the appended keys (append_kv's end, and
  // a tile without rows, which appends nothing: varlen q's surplus blocks).
  CUTE_DEVICE static void appended() {
    cutlass::arch::NamedBarrier::arrive(kAppendedThreads, uint32_t(FwdNamedBarrier::kAppended));
  }

  // ALiBi: each score of key block n_block gains -slope * |query +
  // seqlen_k - seqlen_q - key| (the tile's lengths), in the units of the
  // scores (masked ones stay -inf). A row's slope is its head's (PackGQA:
  // heads differ by row).
  template <class Scores, class Coords>
  CUTE_DEVICE static void add_alibi(Params const& p, FwdTile const& tile, Mask const& mask,
                                    Scores& scores, Coords const& coords, int n_block) {
    int const diagonal_minus_block = mask.seqlen_k - mask.seqlen_q - n_block * Traits::kBlockN;
    float const* const slopes = p.alibi_slopes + tile.batch * p.alibi_batch_stride;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(scores); ++i) {
      QueryRow const query = query_row(p, tile, tile.m_block * Traits::kBlockM + get<0>(coords(i, 0)));
      float const slope = slopes[query.head] * p.alibi_score_scale;
      int const diagonal_col = query.row + diagonal_minus_block;  // the row's diagonal key, in the block
      CUTE_UNROLL
      for (int j = 0; j < size<1>(scores); ++j)
        scores(i, j) = fmaf(-slope, float(abs(diagonal_col - int(get<1>(coords(i, j))))), scores(i, j));
    }
  }

  // q's rotary, in place in the warpgroup's rows of sQ (all stored): one
  // pass over its rotated chunks, each thread turning whole pairs (NeoX: a
  // chunk and its partner), so no thread reads what another writes. A rolled
  // loop: rotating the gathered registers instead (unrolled) made every
  // KV-cache call ~2.5 us slower, rotary or not (measured 2026-12-07).
  template <class SmemQ>
  CUTE_DEVICE static void rotate_q(Params const& p, SmemQ& sQ, FwdTile const& tile, int first_row,
                                   int thread) {
    constexpr int kRows = Traits::kBlockM / Traits::kNumConsumerWarpgroups;
    constexpr int kChunk = 16 / sizeof(Element);
    bool const interleaved = p.rotary.interleaved;
    int const units_per_row = p.rotary.dim / kChunk / (interleaved ? 1 : 2);
#pragma unroll 1
    for (int u = thread; u < kRows * units_per_row; u += cutlass::NumThreadsPerWarpGroup) {
      int const row = first_row + u / units_per_row;
      QueryRow const query = query_row(p, tile, tile.m_block * Traits::kBlockM + row);
      if (query.row >= tile.seqlen_q) continue;
      int const position = tile.cached_k + (p.rotary_q_per_row ? query.row : 0);
      int const col = u % units_per_row * kChunk;
      uint4* const x = reinterpret_cast<uint4*>(&sQ(row, col));
      if (interleaved) {
        *x = p.rotary.rotate(*x, *x, col, position);
      } else {
        int const partner_col = p.rotary.partner(col);
        uint4* const w = reinterpret_cast<uint4*>(&sQ(row, partner_col));
        uint4 const x0 = *x, w0 = *w;
        *x = p.rotary.rotate(x0, w0, col, position);
        *w = p.rotary.rotate(w0, x0, partner_col, position);
      }
    }
  }

  // KV cache (PackGQA's rows are no TMA box): each consumer warpgroup
  // gathers the 64 rows of Q its GEMMs read, 16 bytes per load (all loads
  // before any store, so they are in flight together), zeros past the
  // queries; applies q's rotary; then makes them visible to WGMMA (the
  // async proxy) and waits for the rest of its warpgroup. Its own earlier
  // GEMMs on sQ are complete (warpgroup_wait<0> ends compute), and no other
  // warpgroup reads its rows.
  CUTE_DEVICE static void gather_q(Params const& p, SharedStorage& smem, FwdTile const& tile,
                                   int thread) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    constexpr int kThreads = cutlass::NumThreadsPerWarpGroup;
    constexpr int kRows = Traits::kBlockM / Traits::kNumConsumerWarpgroups;
    constexpr int kChunk = 16 / sizeof(Element);  // elements per load
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    constexpr int kLoads = kRows * kChunksPerRow / kThreads;
    static_assert(kLoads * kThreads == kRows * kChunksPerRow);
    int const warpgroup = thread / kThreads;
    int const first_row = warpgroup * kRows;
    uint4 chunks[kLoads];
    auto const query_of = [&](int c) {
      return query_row(p, tile, tile.m_block * Traits::kBlockM + first_row + c / kChunksPerRow);
    };
    CUTE_UNROLL
    for (int i = 0; i < kLoads; ++i) {
      int const c = i * kThreads + thread % kThreads;
      QueryRow const query = query_of(c);
      chunks[i] = query.row < tile.seqlen_q
                      ? load_chunk(p.q.row(tile.batch, tile.offset_q + query.row, query.head) +
                                   c % kChunksPerRow * kChunk)
                      : make_uint4(0, 0, 0, 0);
    }
    CUTE_UNROLL
    for (int i = 0; i < kLoads; ++i) {
      int const c = i * kThreads + thread % kThreads;
      *reinterpret_cast<uint4*>(&sQ(first_row + c / kChunksPerRow, c % kChunksPerRow * kChunk)) =
          chunks[i];
    }
    if (p.rotary.cos != nullptr) {
      cutlass::arch::NamedBarrier::sync(
          kThreads, uint32_t(FwdNamedBarrier::kQGathered0) + uint32_t(warpgroup));
      rotate_q(p, sQ, tile, first_row, thread % kThreads);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(
        kThreads, uint32_t(FwdNamedBarrier::kQGathered0) + uint32_t(warpgroup));
  }

  // Run by all consumer threads; `thread` is the index among them. Leaves the
  // unnormalized O in `acc_o` and the running statistics in `softmax`, and
  // returns the units O is in (FP8: V block n_block_begin's scale; else 1).
  //
  // Intra-warpgroup overlap (FA3 paper, section 3.2): the WGMMAs of the next
  // S = Q K^T and of the current O += P V are in flight together while the
  // softmax of the next block runs, so its exps hide under the GEMMs. Optionally
  // (off: measured slower) the two consumer warpgroups take turns issuing
  // (PingPongScheduler). Both are traits switches so the ablation can build them.
  template <class Pipeline, class PipelineState, class FragO, class Softmax>
  CUTE_DEVICE static float compute(Params const& p, SharedStorage& smem, FwdTile tile,
                                  int n_block_begin, int n_block_end, int thread,
                                  int q_phase, Pipeline& pipeline_k,
                                  Pipeline& pipeline_v, PipelineState& read_k,
                                  PipelineState& read_v, FragO& acc_o, Softmax& softmax) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});

    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmaO mma_o;
    auto thr_s = mma_s.get_thread_slice(thread);
    auto thr_o = mma_o.get_thread_slice(thread);
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = thr_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tScS = thr_s.partition_C(make_identity_tensor(select<0, 1>(TileShape{})));
    Tensor coords = make_tensor(tScS.data(), acc_rowcol_layout(tScS.layout()));
    Tensor acc_s = partition_fragment_C(mma_s, select<0, 1>(TileShape{}));
    Tensor scores = as_rowcol(acc_s);
    // P in registers, laid out as the A operand of O += P V (16-bit: the
    // accumulator's own order; FP8: see convert_p_fp8).
    Tensor tOrP = [&] {
      if constexpr (Traits::kFp8) {
        return make_tensor<Element>(partition_shape_A(mma_o, select<0, 1>(TileShape{})));
      } else {
        return make_tensor<Element>(acc_as_operand_a_layout(acc_s.layout()));
      }
    }();
    // PackGQA's decode tiles hold a few live rows of 128: a warpgroup whose
    // rows are all past the queries keeps the pipeline's protocol (waits,
    // releases, turns) but gathers no Q, issues no GEMM and runs no softmax.
    // It runs its own copy of the loop (run(true_type)): a runtime test around
    // each WGMMA makes ptxas serialize them all (its warning C7515).
    bool const idle_rows = [&] {
      if constexpr (kKvCache) {
        constexpr int kRows = Traits::kBlockM / Traits::kNumConsumerWarpgroups;
        int const first = tile.m_block * Traits::kBlockM +
                          thread / cutlass::NumThreadsPerWarpGroup * kRows;
        return query_row(p, tile, first).row >= tile.seqlen_q;
      } else {
        return false;
      }
    }();
    auto convert_p = [&](auto idle) {
      if constexpr (decltype(idle)::value) return;
      if constexpr (Traits::kFp8) {
        convert_p_fp8(acc_s, tOrP);
      } else {
        convert_fragment(acc_s, tOrP);
      }
    };
    // What turns block n_block's scores into log2-domain logits, and (FP8)
    // the scale of V's block n_block, in which O += P V accumulates.
    int const kv_head = tile.head / p.heads_per_kv_head;
    float const q_scale = Traits::kFp8 ? p.q_scale(tile.batch, tile.head, tile.m_block) : 1.f;
    auto score_scale = [&](int n_block) {
      if constexpr (Traits::kFp8) {
        return p.scale_log2 * q_scale * p.k_scale(tile.batch, kv_head, n_block);
      } else {
        return p.scale_log2;
      }
    };
    auto v_scale = [&](int n_block) {
      return Traits::kFp8 ? p.v_scale(tile.batch, kv_head, n_block) : 1.f;
    };
    // O holds blocks after n_block in units of V block n_block + 1's scale;
    // before P V of block n_block joins, switch it to n_block's.
    auto o_rescale = [&](auto idle, int n_block, auto o_scale) {
      if constexpr (decltype(idle)::value) return;
      if constexpr (Traits::kFp8) {
        float const units = v_scale(n_block + 1) / v_scale(n_block);
        for (float& factor : o_scale) factor *= units;
      }
      scale_rows(as_rowcol(acc_o), o_scale);
    };

    PingPongScheduler<Traits::kPingPong> const scheduler{thread / cutlass::NumThreadsPerWarpGroup};
    Mask const mask = make_mask(p, tile);
    auto mask_and_softmax = [&](auto idle, int n_block) {
      if constexpr (decltype(idle)::value) return decltype(softmax.step(scores, 0.f)){};
      if (p.softcap_input_scale != 0.f) apply_softcap(scores, p.softcap_input_scale);
      if (mask.needs_right_mask(tile.m_block, n_block))
        mask.apply_right(scores, coords, tile.m_block, n_block);
      if (mask.needs_left_mask(tile.m_block, n_block))
        mask.apply_left(scores, coords, tile.m_block, n_block);
      // (d = 256: the banded forward has no registers left for it, 6-13
      // spills measured; validation refuses the combination.)
      if constexpr (kMaxAlibiHeadDim >= kHeadDim) {
        if (p.alibi_slopes != nullptr) add_alibi(p, tile, mask, scores, coords, n_block);
      }
      return softmax.step(scores, score_scale(n_block));
    };
    // Operand waits stay outside the issue turn: a warpgroup holding the turn
    // while its data is in flight would stall the other for nothing.
    auto wait_k = [&] { pipeline_k.consumer_wait(read_k); };
    auto wait_v = [&] { pipeline_v.consumer_wait(read_v); };
    auto gemm_s = [&](auto idle) {
      if constexpr (!decltype(idle)::value) warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, read_k.index()), acc_s);
    };
    auto gemm_o = [&](auto idle) {
      if constexpr (!decltype(idle)::value) warpgroup_gemm<false>(mma_o, tOrP, tOrV(_, _, _, read_v.index()), acc_o);
    };
    // After the matching warpgroup_wait: results readable, stage reusable.
    auto s_done = [&] {
      warpgroup_fence_operand(acc_s);
      pipeline_k.consumer_release(read_k);
      ++read_k;
    };
    auto o_done = [&] {
      warpgroup_fence_operand(acc_o);
      warpgroup_fence_operand(tOrP);
      pipeline_v.consumer_release(read_v);
      ++read_v;
    };

    scheduler.start();
    if constexpr (kKvCache) {
      if (!idle_rows) gather_q(p, smem, tile, thread);
    } else {
      smem.barrier_q.wait(q_phase);
    }
    // Every S = Q K^T has completed: the producer may overwrite Q.
    auto q_done = [&] {
      if constexpr (!kKvCache) smem.barrier_q_free.arrive();
    };
    auto run = [&](auto idle) {
      if constexpr (Traits::kIntraWarpgroupOverlap) {
        int n_block = n_block_end - 1;
        wait_k();
        scheduler.wait_turn();
        gemm_s(idle);
        scheduler.pass_turn();
        warpgroup_wait<0>();
        s_done();
        mask_and_softmax(idle, n_block);  // O is still zero: its scale factor is moot
        convert_p(idle);
        for (--n_block; n_block >= n_block_begin; --n_block) {
          wait_k();
          wait_v();
          scheduler.wait_turn();
          gemm_s(idle);
          gemm_o(idle);
          scheduler.pass_turn();
          warpgroup_wait<1>();  // S is ready; O += P V still runs
          s_done();
          auto const o_scale = mask_and_softmax(idle, n_block);
          warpgroup_wait<0>();
          o_done();
          o_rescale(idle, n_block, o_scale);
          convert_p(idle);
        }
        q_done();
        wait_v();
        scheduler.wait_turn();
        gemm_o(idle);
        scheduler.pass_last_turn();
        warpgroup_wait<0>();
        o_done();
      } else {  // the ablation baseline: each GEMM waited for before the softmax
        for (int n_block = n_block_end - 1; n_block >= n_block_begin; --n_block) {
          wait_k();
          scheduler.wait_turn();
          gemm_s(idle);
          scheduler.pass_turn();
          warpgroup_wait<0>();
          s_done();
          auto const o_scale = mask_and_softmax(idle, n_block);
          if (n_block < n_block_end - 1) o_rescale(idle, n_block, o_scale);
          convert_p(idle);
          wait_v();
          scheduler.wait_turn();
          gemm_o(idle);
          if (n_block > n_block_begin) {
            scheduler.pass_turn();
          } else {
            scheduler.pass_last_turn();
          }
          warpgroup_wait<0>();
          o_done();
        }
        q_done();
      }
    };
    if (kKvCache && idle_rows) {
      run(cute::true_type{});
    } else {
      run(cute::false_type{});
    }
    return v_scale(n_block_begin);
  }
};

}  // namespace flash3::kernels
