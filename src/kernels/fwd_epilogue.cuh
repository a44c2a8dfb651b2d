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
  using TileShape = typename Traits::TileShape;

  // `o_units`: what O's accumulator is in units of (FP8's V scale; else 1).
  template <class FragO, class Softmax>
  CUTE_DEVICE static void store(Params const& p, FwdTile tile, int thread, FragO& acc_o,
                                Softmax& softmax, float o_units) {
    if constexpr (Traits::kKvCache) {
      if (p.num_splits > 1) return store_split(p, tile, thread, acc_o, softmax);
    }
    constexpr int kRows = Softmax::kNumRows;
    float lse[kRows];
    Tensor o = as_rowcol(acc_o);
    float const sink = p.sinks == nullptr ? -INFINITY : p.sinks[tile.head];
    auto o_scale = softmax.finalize(sink, lse);
    if constexpr (Traits::kFp8) {
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) o_scale[i] *= o_units;
    }
    scale_rows(o, o_scale);
    Tensor out_frag = make_tensor<Element>(acc_o.layout());
    convert_fragment(acc_o, out_frag);
    Tensor out_rc = as_rowcol(out_frag);

    Tensor coords = out_coords(thread);

    int const row0 = tile.m_block * Traits::kBlockM;
    int const rows_left = FwdMainloop<Traits>::make_mask(p, tile).seqlen_q - row0;
    // Varlen: out_batch_stride is 0 and the sequence starts at row offset_q.
    Element* out = p.out + tile.batch * p.out_batch_stride + tile.head * p.out_head_stride +
                   (tile.offset_q + row0) * p.out_row_stride;
    float* lse_out = nullptr;
    if (p.lse != nullptr) {
      lse_out = Traits::kVarlen
                    ? p.lse + int64_t(tile.head) * p.total_q + tile.offset_q + row0
                    : p.lse + (int64_t(tile.batch) * p.heads_q + tile.head) * p.seqlen_q + row0;
    }
    store_fragment_rows(out_rc, coords, out, p.out_row_stride, rows_left);
    if (lse_out != nullptr) store_lse(coords, lse, lse_out, rows_left, thread);
  }

 private:
  // The 4 threads of a quad share rows; one of them writes the LSE.
  template <class Coords, int kRows>
  CUTE_DEVICE static void store_lse(Coords const& coords, float const (&lse)[kRows], float* lse_out,
                                    int rows_left, int thread) {
    if (thread % 4 != 0) return;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      int const row = get<0>(coords(i, 0));
      if (row < rows_left) lse_out[row] = lse[i];
    }
  }

  // (row, col) in the tile of each of this thread's O values, as (rows, cols).
  CUTE_DEVICE static auto out_coords(int thread) {
    typename Traits::TiledMmaO mma_o;
    Tensor tOcO = mma_o.get_thread_slice(thread).partition_C(
        make_identity_tensor(select<0, 2>(TileShape{})));
    return make_tensor(tOcO.data(), acc_rowcol_layout(tOcO.layout()));
  }

  // Split-KV: this split's output normalized by its own sum and its LSE, in
  // fp32, both without the sink (the combine adds it once). A split that saw
  // no key writes O = 0 and LSE = -inf, which the combine gives no weight.
  template <class FragO, class Softmax>
  CUTE_DEVICE static void store_split(Params const& p, FwdTile tile, int thread, FragO& acc_o,
                                      Softmax& softmax) {
    constexpr int kRows = Softmax::kNumRows;
    float lse[kRows];
    Tensor o = as_rowcol(acc_o);
    scale_rows(o, softmax.finalize(-INFINITY, lse));
    Tensor coords = out_coords(thread);
    int const row0 = tile.m_block * Traits::kBlockM;
    int const rows_left = p.seqlen_q - row0;
    int64_t const head_row =
        ((int64_t(tile.split) * p.batch + tile.batch) * p.heads_q + tile.head) * p.seqlen_q + row0;
    store_fragment_rows(o, coords, p.o_partial + head_row * Traits::kHeadDim, Traits::kHeadDim,
                        rows_left);
    store_lse(coords, lse, p.lse_partial + head_row, rows_left, thread);
  }
};

}  // namespace flash3::kernels
