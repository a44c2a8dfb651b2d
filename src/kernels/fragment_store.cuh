// Register fragment -> global memory, for epilogues that write straight from
// the WGMMA accumulator layout.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cstdint>

namespace flash3::kernels {

using namespace cute;

// `frag` and `coords` are (rows, cols) views of the same fragment (values and
// their (row, col) in the tile); rows >= rows_left are dropped. A thread holds
// pairs of adjacent columns: each pair is one 32-bit store.
template <class Frag, class Coords, class Element>
CUTE_DEVICE void store_fragment_rows(Frag const& frag, Coords const& coords, Element* tile,
                                     int64_t row_stride, int rows_left) {
  static_assert(decltype(size<1>(frag))::value % 2 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size<0>(frag); ++i) {
    int const row = get<0>(coords(i, 0));
    if (row >= rows_left) continue;
    Element* out_row = tile + row * row_stride;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(frag); j += 2) {
      cutlass::Array<Element, 2> pair;
      pair[0] = frag(i, j);
      pair[1] = frag(i, j + 1);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(out_row + get<1>(coords(i, j))) = pair;
    }
  }
}

}  // namespace flash3::kernels
