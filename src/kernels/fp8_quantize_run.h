// Seam between the host API and the FP8 quantize kernels (fp8_quantize.cu).
// Declared without CUTLASS types so host code compiles as plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.hpp"

namespace flash3::kernels {

// `params` is validated: dtype bf16 / fp16 (q, k, v quantized) or e4m3 (v
// only: transposed, unscaled), head_dim 64 / 128 / 256, batch >= 1.
cudaError_t run_quantize_fp8(const QuantizeFp8Params& params, cudaStream_t stream);

}  // namespace flash3::kernels
