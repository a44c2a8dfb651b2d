#include "kernels/bwd_launch.cuh"

namespace flash3::kernels {
template cudaError_t run_bwd<DType::kBFloat16, 192, 128>(const BackwardParams&, const BwdWorkspaceView&,
                                                         cudaStream_t);
}  // namespace flash3::kernels
