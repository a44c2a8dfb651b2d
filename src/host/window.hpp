// The mask a kernel applies, from the user's causal flag and window: either
// full attention (-1, -1), or a band in which both bounds are explicit
// (>= 0). "Unbounded" becomes a bound no row reaches (left seqlen_k, right
// seqlen_q), which keeps the kernels' index arithmetic within int32
// (validation bounds seqlen_q + seqlen_k) and lets causal share the banded
// kernels (right 0).
#pragma once

#include <algorithm>

#include "flash3/flash3.hpp"

namespace flash3::host {

struct Window {
  int left;
  int right;
};

// A band in which both bounds are explicit; "unbounded" is rows_k on the
// left and rows_q on the right.
inline Window resolve_band(bool causal, int left, int right, int rows_q, int rows_k) {
  int const resolved_left = left < 0 ? rows_k : std::min(left, rows_k);
  int const resolved_right = causal ? 0 : right < 0 ? rows_q : std::min(right, rows_q);
  return {resolved_left, resolved_right};
}

// `left`, `right` as validated: >= -1, and right <= 0 with causal.
inline Window resolve_window(bool causal, int left, int right, int seqlen_q, int seqlen_k) {
  if (!causal && left < 0 && right < 0) return {-1, -1};
  return resolve_band(causal, left, right, seqlen_q, seqlen_k);
}

// The same on a params struct (ForwardParams or BackwardParams), in place.
// Varlen kernels always take a band, relative to each sequence, whose
// "unbounded" is total_k / total_q: no sequence is longer (validation bounds
// total_q + total_k).
template <class Params>
void resolve_window(Params& p) {
  Window const w = p.cu_seqlens_q != nullptr
                       ? resolve_band(p.causal, p.window_left, p.window_right, p.total_q, p.total_k)
                       : resolve_window(p.causal, p.window_left, p.window_right, p.seqlen_q, p.seqlen_k);
  p.window_left = w.left;
  p.window_right = w.right;
}

}  // namespace flash3::host
