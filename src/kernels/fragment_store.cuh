// Register fragment -> global memory, for epilogues that write straight from
// the WGMMA accumulator layout.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cstdint>
#include <type_traits>

namespace flash3::kernels {

using namespace cute;

// `frag` and `coords` are (rows, cols) views of the same fragment (values and
// their (row, col) in the tile); `row_address(row)` is where tile row `row`
// goes, or null to drop it. A thread holds pairs of adjacent columns: each
// pair is one 32-bit store.
template <class Frag, class Coords, class RowAddress>
CUTE_DEVICE void store_fragment_rows(Frag const& frag, Coords const& coords,
                                     RowAddress const& row_address) {
  static_assert(decltype(size<1>(frag))::value % 2 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size<0>(frag); ++i) {
    auto* const out_row = row_address(int(get<0>(coords(i, 0))));
    if (out_row == nullptr) continue;
    using Element = std::remove_pointer_t<decltype(out_row)>;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(frag); j += 2) {
      cutlass::Array<Element, 2> pair;
      pair[0] = frag(i, j);
      pair[1] = frag(i, j + 1);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(out_row + get<1>(coords(i, j))) = pair;
    }
  }
}

// A tile of rows `row_stride` apart from `tile`; rows >= rows_left are dropped.
template <class Frag, class Coords, class Element>
CUTE_DEVICE void store_fragment_rows(Frag const& frag, Coords const& coords, Element* tile,
                                     int64_t row_stride, int rows_left) {
  store_fragment_rows(frag, coords, [&](int row) -> Element* {
    return row < rows_left ? tile + row * row_stride : nullptr;
  });
}

}  // namespace flash3::kernels
