// cuda/moe.cu ↔ reference/ops/moe.cc (moe_experts' accumulation)
//
// The expert linears are cuda/linear.cu's (bit-exact). Here:
//   swiglu           reference/ops/moe.cc swiglu, one thread per value: clamp (std::max / std::min as
//                    the reference writes them), silu(g) = g / (1 + libm_expf(-g)) (glibc's expf
//                    bit for bit, cuda/libm_expf.h), * u, * the routing weight, bf16: BIT-EXACT.
//   moe_scatter_add  acc[tokens[i], d] += y[i, d] for i = 0, 1, ... in order: one thread per
//                    channel d loops i serially (a token listed twice is added twice, in order,
//                    as the reference does; no two threads touch one value): BIT-EXACT.
//   moe_finish       out = bf16(acc + shared), one fp32 add: BIT-EXACT.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
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

__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u,
                              const float* __restrict__ routing_weight, int64_t n, int64_t inter, float limit,
                              float* __restrict__ h) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n * inter) return;
  float gv = g[k], uv = u[k];
  if (limit > 0.0f) {
    uv = (uv < -limit) ? -limit : uv;  // std::max(uv, -limit)
    uv = (limit < uv) ? limit : uv;    // std::min(uv, limit)
    gv = (limit < gv) ? limit : gv;    // std::min(gv, limit)
  }
  const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, libm_expf(-gv)));
  float hv = __fmul_rn(silu, uv);
  if (routing_weight != nullptr) hv = __fmul_rn(routing_weight[k / inter], hv);
  h[k] = formats::round_to_bf16(hv);
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

void swiglu(const float* g, const float* u, const float* routing_weight, int64_t n, int64_t inter, double limit,
            float* h) {
  if (n * inter == 0) return;
  swiglu_kernel<<<grid_for(n * inter, kThreads), kThreads>>>(g, u, routing_weight, n, inter,
                                                            static_cast<float>(limit), h);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void moe_finish(const float* acc, const float* shared, int64_t n, float* out) {
  if (n == 0) return;
  finish_kernel<<<grid_for(n, kThreads), kThreads>>>(acc, shared, n, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
