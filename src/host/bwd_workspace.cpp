#include "bwd_workspace.hpp"

#include <cstdint>

#include "kernels/tile_config.h"

namespace flash3::host {
namespace {

size_t align_up(size_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

}  // namespace

BwdWorkspaceLayout bwd_workspace_layout(int batch, int heads_q, int seqlen_q, int head_dim,
                                        int sink_key_blocks, int varlen_total_q) {
  BwdWorkspaceLayout l;
  if (batch <= 0 || heads_q <= 0 || seqlen_q <= 0 || head_dim <= 0) return l;
  const int block_m = kernels::bwd_tile_config(head_dim).block_m;
  const auto round_up = [block_m](int64_t rows) { return (rows + block_m - 1) / block_m * block_m; };
  // Varlen: sequence b starts b blocks past its first packed row, rounded
  // down to a block (packed_sequence.cuh), and ends before total_q + batch blocks.
  const bool varlen = varlen_total_q >= 0;
  l.head_rows = varlen ? round_up(int64_t{varlen_total_q} + int64_t{batch} * block_m) : round_up(seqlen_q);
  const size_t rows = size_t(varlen ? 1 : batch) * size_t(heads_q) * size_t(l.head_rows);
  l.lse_offset = 0;
  l.dpsum_offset = align_up(rows * sizeof(float));
  l.dq_accum_offset = l.dpsum_offset + align_up(rows * sizeof(float));
  l.dq_accum_bytes = rows * size_t(head_dim) * sizeof(float);
  l.semaphore_offset = l.dq_accum_offset + align_up(l.dq_accum_bytes);
  l.semaphore_bytes = rows / size_t(block_m) * sizeof(int);
  l.sink_key_blocks = sink_key_blocks > 0 ? sink_key_blocks : 0;
  l.sink_partials_offset = l.semaphore_offset + align_up(l.semaphore_bytes);
  l.sink_partials_bytes = size_t(batch) * size_t(heads_q) * size_t(l.sink_key_blocks) * sizeof(float);
  l.bytes = l.sink_partials_offset + align_up(l.sink_partials_bytes);
  return l;
}

BwdWorkspaceLayout bwd_workspace_layout(const BackwardParams& p) {
  const int block_n = p.head_dim > 0 ? kernels::bwd_tile_config(p.head_dim).block_n : 1;
  const int key_blocks = p.dsinks != nullptr && p.seqlen_k > 0 ? (p.seqlen_k + block_n - 1) / block_n : 0;
  if (p.cu_seqlens_q != nullptr && p.total_q <= 0) return {};
  return bwd_workspace_layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, key_blocks,
                              p.cu_seqlens_q != nullptr ? p.total_q : -1);
}

kernels::BwdWorkspaceView carve_workspace(const BwdWorkspaceLayout& l, void* base) {
  auto* bytes = static_cast<unsigned char*>(base);
  return kernels::BwdWorkspaceView{
      reinterpret_cast<float*>(bytes + l.lse_offset),
      reinterpret_cast<float*>(bytes + l.dpsum_offset),
      reinterpret_cast<float*>(bytes + l.dq_accum_offset),
      reinterpret_cast<int*>(bytes + l.semaphore_offset),
      l.sink_key_blocks > 0 ? reinterpret_cast<float*>(bytes + l.sink_partials_offset) : nullptr,
      l.head_rows,
      l.sink_key_blocks,
  };
}

}  // namespace flash3::host
