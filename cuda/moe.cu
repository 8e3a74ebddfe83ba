// cuda/moe.cu ↔ reference/moe.cc (moe_experts' accumulation)
//
// The expert linears are cuda/linear.cu's (bit-exact); the SwiGLU's silu (std::exp) runs on the
// host (CudaOps::moe_experts, cuda/cuda_ops_moe.cc). Here:
//   moe_scatter_add  acc[tokens[i], d] += y[i, d] for i = 0, 1, ... in order: one thread per
//                    channel d loops i serially (a token listed twice is added twice, in order,
//                    as the reference does; no two threads touch one value): BIT-EXACT.
//   moe_finish       out = bf16(acc + shared), one fp32 add: BIT-EXACT.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;

__global__ void scatter_add_kernel(float* __restrict__ acc, const float* __restrict__ y,
                                   const int64_t* __restrict__ tokens, int64_t n, int64_t dim) {
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  for (int64_t i = 0; i < n; ++i) {
    float* a = acc + tokens[i] * dim + d;
    *a = __fadd_rn(*a, y[i * dim + d]);
  }
}

__global__ void finish_kernel(const float* __restrict__ acc, const float* __restrict__ shared, int64_t n,
                              float* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) out[k] = formats::round_to_bf16(__fadd_rn(acc[k], shared[k]));
}

}  // namespace

void moe_scatter_add(float* acc, const float* y, const int64_t* tokens, int64_t n, int64_t dim) {
  if (n == 0 || dim == 0) return;
  scatter_add_kernel<<<grid_for(dim, kThreads), kThreads>>>(acc, y, tokens, n, dim);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void moe_finish(const float* acc, const float* shared, int64_t n, float* out) {
  if (n == 0) return;
  finish_kernel<<<grid_for(n, kThreads), kThreads>>>(acc, shared, n, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
