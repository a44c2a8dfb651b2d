// Rotary embedding (RoPE) of 16-byte chunks of a row, for the KV-cache
// kernel's append: the new keys on their way into the cache and q on its way
// into shared memory are rotated there, so no separate pass reads them.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace flash3::kernels {

// cos / sin: (seqlen, dim / 2) rows of Element, row `position` for a token
// there. The first `dim` of a row's head_dim values rotate in pairs:
// interleaved (2i, 2i + 1), GPT-NeoX style (i, i + dim / 2); pair i turns by
// the angle of column i. dim is a multiple of 16 (host-validated), so a
// chunk of 8 16-bit values lies inside or outside the rotated columns and,
// NeoX style, its partner chunk dim / 2 columns away is whole too.
template <class Element>
struct Rotary {
  Element const* cos = nullptr;  // null: no rotary
  Element const* sin = nullptr;
  int dim = 0;
  int seqlen = 0;
  bool interleaved = true;

  static constexpr int kChunk = 16 / sizeof(Element);

  CUTE_HOST_DEVICE bool rotates(int col) const { return cos != nullptr && col < dim; }
  // The column of the chunk whose values pair with the chunk at `col` (NeoX).
  CUTE_HOST_DEVICE int partner(int col) const { return col < dim / 2 ? col + dim / 2 : col - dim / 2; }

  // Chunk `x` at columns [col, col + kChunk) of a token at `position`, with
  // `x_partner` the chunk at partner(col) (ignored when interleaved).
  // Positions past the table (the host cannot see device lengths) use its
  // last row: a wrong angle, never a read outside it.
  CUTE_DEVICE uint4 rotate(uint4 x, uint4 x_partner, int col, int position) const {
    int const row = min(max(position, 0), seqlen - 1) * (dim / 2);
    Element const* v = reinterpret_cast<Element const*>(&x);
    Element const* w = reinterpret_cast<Element const*>(&x_partner);
    uint4 result;
    Element* r = reinterpret_cast<Element*>(&result);
    if (interleaved) {
      CUTE_UNROLL
      for (int j = 0; j < kChunk; j += 2) {
        int const i = row + (col + j) / 2;
        float const c = float(cos[i]), s = float(sin[i]);
        float const a = float(v[j]), b = float(v[j + 1]);
        r[j] = Element(a * c - b * s);
        r[j + 1] = Element(b * c + a * s);
      }
    } else {
      bool const first_half = col < dim / 2;
      CUTE_UNROLL
      for (int j = 0; j < kChunk; ++j) {
        int const i = row + (first_half ? col : col - dim / 2) + j;
        float const c = float(cos[i]), s = float(sin[i]);
        float const a = float(v[j]), b = float(w[j]);
        r[j] = Element(first_half ? a * c - b * s : a * c + b * s);
      }
    }
    return result;
  }
};

}  // namespace flash3::kernels
