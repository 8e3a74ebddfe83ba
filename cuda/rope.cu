// cuda/rope.cu ↔ reference/ops/rope.cc (RopeTable::apply, rope_rows)
//
// One thread per rotated pair: the reference's four fp32 products, one subtraction / addition,
// each rounded to bf16, from the same cos/sin tables (mirrored from the host RopeTable):
// BIT-EXACT.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

// x [T, heads * width]: the last rd channels of each head vector, pair i of row t at position
// first_pos + t * pos_stride.
__global__ void rope_kernel(float* __restrict__ x, int64_t T, int64_t heads, int64_t width, int64_t rd,
                            const float* __restrict__ cos, const float* __restrict__ sin, int64_t first_pos,
                            int64_t pos_stride, bool inverse) {
  const int64_t half = rd / 2;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * heads * half) return;
  const int64_t t = k / (heads * half), h = (k / half) % heads, i = k % half;
  const int64_t pos = first_pos + t * pos_stride;
  float* tail = x + t * heads * width + h * width + (width - rd);
  const float c = cos[pos * half + i];
  const float s = inverse ? -sin[pos * half + i] : sin[pos * half + i];
  const float a = tail[2 * i], b = tail[2 * i + 1];
  const float ac = __fmul_rn(a, c), bs = __fmul_rn(b, s), as = __fmul_rn(a, s), bc = __fmul_rn(b, c);
  tail[2 * i] = formats::round_to_bf16(__fsub_rn(ac, bs));
  tail[2 * i + 1] = formats::round_to_bf16(__fadd_rn(as, bc));
}

}  // namespace

void rope_rows(float* x, int64_t T, int64_t heads, int64_t width, int64_t rd, const float* cos, const float* sin,
               int64_t first_pos, int64_t pos_stride, bool inverse) {
  const int64_t n = T * heads * (rd / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kThreads), kThreads>>>(x, T, heads, width, rd, cos, sin, first_pos, pos_stride, inverse);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
