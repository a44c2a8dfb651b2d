// Valid forward and backward parameters for tests that break one thing at a time.
#pragma once

#include <cstdint>

#include "flash3/flash3.hpp"

namespace flash3::testing {

// Contiguous (batch, seqlen, heads, head_dim) strides.
inline Tensor4d contiguous(void* data, int seqlen, int heads, int head_dim) {
  Tensor4d t;
  t.data = data;
  t.stride[0] = int64_t{seqlen} * heads * head_dim;
  t.stride[1] = int64_t{heads} * head_dim;
  t.stride[2] = head_dim;
  t.stride[3] = 1;
  return t;
}

// Sizes that are not multiples of any tile, GQA 4:1. The pointers are fake
// (16-byte aligned, never dereferenced): validation is pure host code.
inline ForwardParams valid_params(DType dtype = DType::kBFloat16, int head_dim = 128) {
  ForwardParams p;
  p.dtype = dtype;
  p.batch = 2;
  p.seqlen_q = 113;
  p.seqlen_k = 255;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.head_dim = head_dim;
  p.q = contiguous(reinterpret_cast<void*>(uintptr_t{0x100000}), p.seqlen_q, p.heads_q, head_dim);
  p.k = contiguous(reinterpret_cast<void*>(uintptr_t{0x200000}), p.seqlen_k, p.heads_kv, head_dim);
  p.v = contiguous(reinterpret_cast<void*>(uintptr_t{0x300000}), p.seqlen_k, p.heads_kv, head_dim);
  p.out = contiguous(reinterpret_cast<void*>(uintptr_t{0x400000}), p.seqlen_q, p.heads_q, head_dim);
  p.lse = reinterpret_cast<float*>(uintptr_t{0x500000});
  return p;
}

// Backward parameters for the problem of valid_params, with a workspace of
// exactly the needed size.
inline BackwardParams valid_backward_params(DType dtype = DType::kBFloat16, int head_dim = 128) {
  const ForwardParams f = valid_params(dtype, head_dim);
  BackwardParams p;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.out = f.out;
  p.lse = f.lse;
  p.dtype = f.dtype;
  p.batch = f.batch;
  p.seqlen_q = f.seqlen_q;
  p.seqlen_k = f.seqlen_k;
  p.heads_q = f.heads_q;
  p.heads_kv = f.heads_kv;
  p.head_dim = f.head_dim;
  p.dout = contiguous(reinterpret_cast<void*>(uintptr_t{0x600000}), p.seqlen_q, p.heads_q, head_dim);
  p.dq = contiguous(reinterpret_cast<void*>(uintptr_t{0x700000}), p.seqlen_q, p.heads_q, head_dim);
  p.dk = contiguous(reinterpret_cast<void*>(uintptr_t{0x800000}), p.seqlen_k, p.heads_kv, head_dim);
  p.dv = contiguous(reinterpret_cast<void*>(uintptr_t{0x900000}), p.seqlen_k, p.heads_kv, head_dim);
  p.workspace = reinterpret_cast<void*>(uintptr_t{0x1000000});
  p.workspace_bytes = backward_workspace_size(p);
  return p;
}

}  // namespace flash3::testing
