// How backward() carves its device workspace. Pure host code (unit-tested).
#pragma once

#include <cstddef>

#include "kernels/bwd_run.h"

namespace flash3::host {

struct BwdWorkspaceLayout {
  // Rows of the row statistics (and dQ tiles) per (batch, head): seqlen_q
  // padded to whole backward query blocks; varlen: per head, all sequences.
  int head_rows = 0;
  size_t lse_offset = 0;
  size_t dpsum_offset = 0;
  size_t dq_accum_offset = 0;
  size_t dq_accum_bytes = 0;
  size_t semaphore_offset = 0;
  size_t semaphore_bytes = 0;
  int sink_key_blocks = 0;  // key blocks with a partial of the sinks' gradient (0: none)
  size_t sink_partials_offset = 0;
  size_t sink_partials_bytes = 0;
  size_t bytes = 0;  // total
};

// Every region starts on this boundary (bulk copies need 16 bytes).
inline constexpr size_t kWorkspaceAlign = 256;

// Sizes must be non-negative and head_dim supported; all zero when there is
// nothing to compute (batch or seqlen_q is 0).
// sink_key_blocks > 0 adds (batch, heads_q, sink_key_blocks) fp32 partials of
// the sinks' gradient. varlen_total_q >= 0 selects the varlen layout
// (BwdWorkspaceView) for that many packed query rows.
BwdWorkspaceLayout bwd_workspace_layout(int batch, int heads_q, int seqlen_q, int head_dim,
                                        int sink_key_blocks = 0, int varlen_total_q = -1);
// The layout backward() uses for these parameters (partials when dsinks is set).
BwdWorkspaceLayout bwd_workspace_layout(const BackwardParams& params);

kernels::BwdWorkspaceView carve_workspace(const BwdWorkspaceLayout& layout, void* base);

}  // namespace flash3::host
