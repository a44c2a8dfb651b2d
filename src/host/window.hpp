// The mask a kernel applies, from the user's causal flag and window: either
// full attention (-1, -1), or a band in which both bounds are explicit
// (>= 0). "Unbounded" becomes a bound no row reaches (left seqlen_k, right
// seqlen_q), which keeps the kernels' index arithmetic within int32
// (validation bounds seqlen_q + seqlen_k) and lets causal share the banded
// kernels (right 0).
#pragma once

#include <algorithm>

namespace flash3::host {

struct Window {
  int left;
  int right;
};

// `left`, `right` as validated: >= -1, and right <= 0 with causal.
inline Window resolve_window(bool causal, int left, int right, int seqlen_q, int seqlen_k) {
  if (!causal && left < 0 && right < 0) return {-1, -1};
  int const resolved_left = left < 0 ? seqlen_k : std::min(left, seqlen_k);
  int const resolved_right = causal ? 0 : right < 0 ? seqlen_q : std::min(right, seqlen_q);
  return {resolved_left, resolved_right};
}

// The same on a params struct (ForwardParams or BackwardParams), in place.
template <class Params>
void resolve_window(Params& p) {
  Window const w = resolve_window(p.causal, p.window_left, p.window_right, p.seqlen_q, p.seqlen_k);
  p.window_left = w.left;
  p.window_right = w.right;
}

}  // namespace flash3::host
