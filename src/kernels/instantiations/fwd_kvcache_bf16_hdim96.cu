#include "kernels/fwd_launch.cuh"

namespace flash3::kernels {
template cudaError_t run_fwd_kvcache<DType::kBFloat16, 96>(const ForwardParams&, cudaStream_t);
}  // namespace flash3::kernels
