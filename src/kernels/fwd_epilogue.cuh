// Forward epilogue: normalize O, write it (rows past seqlen_q are dropped)
// and the LSE.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/fragment_layout.cuh"
#include "kernels/fragment_store.cuh"
#include "kernels/fwd_kernel_params.cuh"
#include "kernels/fwd_mainloop.cuh"

namespace flash3::kernels {

using namespace cute;

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::OutElement;
  using Params = FwdKernelParams<Traits>;

  // `o_units`: what O's accumulator is in units of (FP8's V scale; else 1).
  template <class FragO, class Softmax>
  CUTE_DEVICE static void store(Params const& p, FwdTile tile, int thread, FragO& acc_o,
                                Softmax& softmax, float o_units) {
    if constexpr (Traits::kKvCache) {
      if (p.num_splits > 1) return store_split(p, tile, thread, acc_o, softmax);
    }
    constexpr int kRows = Softmax::kNumRows;
    Tensor coords = out_coords(thread);
    float sinks[kRows];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      int const head = Mainloop::query_row(p, tile, row0(tile) + get<0>(coords(i, 0))).head;
      sinks[i] = p.sinks == nullptr ? -INFINITY : p.sinks[head];
    }
    float lse[kRows];
    Tensor o = as_rowcol(acc_o);
    auto o_scale = softmax.finalize(sinks, lse);
    if constexpr (Traits::kFp8) {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) o_scale[i] *= o_units;
    }
    scale_rows(o, o_scale);
    Tensor out_frag = make_tensor<Element>(acc_o.layout());
    convert_fragment(acc_o, out_frag);

    // Packed q: out_batch_stride is 0 and the sequence starts at row offset_q.
    Element* const out = p.out + tile.batch * p.out_batch_stride + tile.offset_q * p.out_row_stride;
    store_fragment_rows(as_rowcol(out_frag), coords, at_query(p, tile, [&](QueryRow q) {
                          return out + q.head * p.out_head_stride + q.row * p.out_row_stride;
                        }));
    if (p.lse == nullptr) return;
    store_lse(coords, lse, thread, at_query(p, tile, [&](QueryRow q) {
                return Mainloop::packed_q(p)
                           ? p.lse + int64_t(q.head) * p.total_q + tile.offset_q + q.row
                           : p.lse + (int64_t(tile.batch) * p.heads_q + q.head) * p.seqlen_q + q.row;
              }));
  }

 private:
  using Mainloop = FwdMainloop<Traits>;
  using QueryRow = typename Mainloop::QueryRow;

  CUTE_DEVICE static int row0(FwdTile const& tile) { return tile.m_block * Traits::kBlockM; }

  // Tile row -> `address(its query row and head)`, or null for rows past the
  // queries (fragment_store.cuh).
  template <class Address>
  CUTE_DEVICE static auto at_query(Params const& p, FwdTile const& tile, Address const& address) {
    int const seqlen_q = Mainloop::make_mask(p, tile).seqlen_q;
    return [&p, &tile, &address, seqlen_q](int row) {
      QueryRow const q = Mainloop::query_row(p, tile, row0(tile) + row);
      return q.row < seqlen_q ? address(q) : nullptr;
    };
  }

  // The 4 threads of a quad share rows; one of them writes the LSE.
  template <class Coords, int kRows, class RowAddress>
  CUTE_DEVICE static void store_lse(Coords const& coords, float const (&lse)[kRows], int thread,
                                    RowAddress const& row_address) {
    if (thread % 4 != 0) return;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float* const out = row_address(int(get<0>(coords(i, 0))));
      if (out != nullptr) *out = lse[i];
    }
  }

  // (row, col) in the tile of each of this thread's O values, as (rows, cols).
  CUTE_DEVICE static auto out_coords(int thread) {
    typename Traits::TiledMmaO mma_o;
    Tensor tOcO = mma_o.get_thread_slice(thread).partition_C(
        make_identity_tensor(typename Traits::TileShapeO{}));
    return make_tensor(tOcO.data(), acc_rowcol_layout(tOcO.layout()));
  }

  // Split-KV: this split's output normalized by its own sum and its LSE, in
  // fp32, both without the sink (the combine adds it once). A split that saw
  // no key writes O = 0 and LSE = -inf, which the combine gives no weight.
  template <class FragO, class Softmax>
  CUTE_DEVICE static void store_split(Params const& p, FwdTile tile, int thread, FragO& acc_o,
                                      Softmax& softmax) {
    constexpr int kRows = Softmax::kNumRows;
    float no_sinks[kRows];
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) no_sinks[i] = -INFINITY;
    float lse[kRows];
    Tensor o = as_rowcol(acc_o);
    scale_rows(o, softmax.finalize(no_sinks, lse));
    Tensor coords = out_coords(thread);
    auto const head_row = [&](QueryRow q) {
      return ((int64_t(tile.split) * p.batch + tile.batch) * p.heads_q + q.head) * p.seqlen_q + q.row;
    };
    store_fragment_rows(o, coords, at_query(p, tile, [&](QueryRow q) {
                          return p.o_partial + head_row(q) * Traits::kHeadDimV;
                        }));
    store_lse(coords, lse, thread,
              at_query(p, tile, [&](QueryRow q) { return p.lse_partial + head_row(q); }));
  }
};

}  // namespace flash3::kernels
