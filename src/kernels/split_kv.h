// Split-KV's workspace: where the forward kernel leaves each split's partial
// output and LSE for the combine kernel. Plain C++ (host and kernels).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flash3::kernels {

// o: (splits, batch, heads, seqlen_q, head_dim) fp32, then lse: (splits,
// batch, heads, seqlen_q) fp32; both dense in that order.
struct SplitWorkspace {
  float* o;
  float* lse;
};

inline int64_t split_rows(int splits, int batch, int heads, int seqlen_q) {
  return int64_t{splits} * batch * heads * seqlen_q;
}

inline size_t split_workspace_bytes(int splits, int batch, int heads, int seqlen_q, int head_dim) {
  return static_cast<size_t>(split_rows(splits, batch, heads, seqlen_q)) * (head_dim + 1) *
         sizeof(float);
}

inline SplitWorkspace split_workspace(void* workspace, int splits, int batch, int heads,
                                      int seqlen_q, int head_dim) {
  float* const o = static_cast<float*>(workspace);
  return {o, o + split_rows(splits, batch, heads, seqlen_q) * head_dim};
}

}  // namespace flash3::kernels
