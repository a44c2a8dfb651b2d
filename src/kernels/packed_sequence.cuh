// Varlen batches: where one sequence lies in a packed (total, heads, dim)
// tensor.
#pragma once

#include <cute/config.hpp>

namespace flash3::kernels {

struct PackedSequence {
  int offset;  // first row in the packed tensor
  int length;
};

// Sequence b: rows [cu_seqlens[b], cu_seqlens[b + 1]), or seqused[b] rows
// from cu_seqlens[b] when seqused is given, cut to the first `max_length`
// (the caller's max_seqlen, which sizes the grids). cu_seqlens live in
// device memory and cannot be checked on the host, so they are clamped to
// the packed tensor's `total` rows: inconsistent offsets give a wrong
// answer, never an access outside the tensors.
CUTE_DEVICE PackedSequence packed_sequence(int const* cu_seqlens, int const* seqused, int b, int total,
                                           int max_length) {
  int const begin = cu_seqlens[b];
  int const length = seqused != nullptr ? seqused[b] : cu_seqlens[b + 1] - begin;
  if (begin < 0 || begin > total) return {0, 0};
  return {begin, max(0, min(min(length, max_length), total - begin))};
}

// The varlen backward keeps per-row statistics and dQ tiles for whole query
// blocks (bwd_run.h): sequence b's start there is its first packed row plus
// b blocks, rounded down to a block. Sequences in order never share a block,
// and every sequence (clamped as above) ends before total + batch blocks.
CUTE_DEVICE int padded_sequence_start(PackedSequence s, int b, int block) {
  return (s.offset + b * block) / block * block;
}

}  // namespace flash3::kernels
