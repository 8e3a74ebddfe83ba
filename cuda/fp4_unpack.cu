// cuda/fp4_unpack.cu ↔ reference/ops/linear.cc unpack_f4_values
//
// A packed F4 weight (LinearWeight::packed: [out, in/2] bytes, two E2M1 codes per byte, element
// 2j in the low nibble) decoded to its E2M1 values [out, in] fp32, exactly (formats::e2m1_decode,
// the host's decoder), so that the F4 linears of a packed weight run the same block-scaled kernel
// on the same values: BIT-EXACT. Used by CudaOps::linear for weights loaded with pack_fp4
// (docs/released-dims.md).
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

// One thread per byte: values [2i], [2i + 1].
__global__ void unpack_f4_kernel(const uint8_t* __restrict__ packed, int64_t bytes, float* __restrict__ values) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= bytes) return;
  const uint8_t b = packed[i];
  values[2 * i] = formats::e2m1_decode(b & 0xFu);
  values[2 * i + 1] = formats::e2m1_decode(b >> 4);
}

}  // namespace

void unpack_f4(const uint8_t* packed, int64_t n, float* values) {
  const int64_t bytes = n / 2;
  if (bytes == 0) return;
  unpack_f4_kernel<<<grid_for(bytes, kThreads), kThreads>>>(packed, bytes, values);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
