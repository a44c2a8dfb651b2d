#include "kernels/fwd_launch.cuh"

namespace flash3::kernels {
template cudaError_t run_fwd<DType::kBFloat16, 192, 128>(const ForwardParams&, cudaStream_t);
}  // namespace flash3::kernels
