// cuda/engram.cu ↔ reference/engram.cc (engram_lookup, engram_gates + engram_gate_residual)
//
// engram_lookup: one thread per output value: bf16(e4m3_decode(code) * e8m0_decode(scale)), the
//   formats/ decoders compiled for the device (DSV41_HD) and one fp32 multiply: BIT-EXACT.
// engram_gates: one thread per (token, copy): the three torch-order sums of cuda/torch_sum.cuh
//   (squares of h, squares of key, (h * (qw * kw)) * key), the same fp32 divide / sqrt / multiply
//   chain, the clamp as std::max's (a < b ? b : a), copysign, and torch_sigmoid_f32 of
//   cuda/torch_math.cuh (the reference's own exp, built from correctly rounded fmas): BIT-EXACT.
//   fp32(dim^-0.5) is computed on the host (std::pow in double) and passed in.
// engram_gate_residual: one thread per output: bf16(h + gate * value) (fp32 mul, fp32 add).
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/torch_math.cuh"
#include "cuda/torch_sum.cuh"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
constexpr float kGateClamp = 1e-6f;  // reference::kEngramGateClamp

__global__ void lookup_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t hd,
                              const int64_t* __restrict__ ids, int64_t T, int64_t cols, float* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * cols * hd) return;
  const int64_t tc = k / hd, d = k % hd;
  const int64_t id = ids[tc];
  const float v =
      __fmul_rn(formats::e4m3_decode(codes[id * hd + d]), formats::e8m0_decode(scales[id * (hd / 32) + d / 32]));
  out[k] = formats::round_to_bf16(v);
}

// at(i) = fl(fl(h[i] * fl(qw[i] * kw[i])) * key[i]).
struct GateProducts {
  const float *h, *qw, *kw, *key;
  __device__ float operator()(int64_t i) const { return __fmul_rn(__fmul_rn(h[i], __fmul_rn(qw[i], kw[i])), key[i]); }
};

__device__ inline float rsqrt_mean(float sum, float dim_f, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, dim_f), eps)));
}

__global__ void gates_kernel(const float* __restrict__ x, const float* __restrict__ kv, const float* __restrict__ qw,
                             const float* __restrict__ kw, int64_t T, int64_t hc, int64_t dim, float eps,
                             float inv_sqrt_dim, float* __restrict__ gates) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * hc) return;
  const int64_t t = k / hc, c = k % hc;
  const float* h = x + (t * hc + c) * dim;
  const float* key = kv + t * (hc + 1) * dim + c * dim;
  const float dim_f = static_cast<float>(dim);
  const float r_h = rsqrt_mean(torch_sum::torch_sum_sq(h, dim), dim_f, eps);
  const float r_k = rsqrt_mean(torch_sum::torch_sum_sq(key, dim), dim_f, eps);
  const float rstd = __fmul_rn(r_h, r_k);
  const float sum = torch_sum::torch_sum(GateProducts{h, qw + c * dim, kw + c * dim, key}, dim);
  const float dot = __fmul_rn(__fmul_rn(sum, rstd), inv_sqrt_dim);
  const float a = fabsf(dot);
  const float mag = __fsqrt_rn(a < kGateClamp ? kGateClamp : a);  // std::max(a, clamp)
  gates[k] = torch_math::torch_sigmoid_f32(copysignf(mag, dot));
}

__global__ void residual_kernel(const float* __restrict__ x, const float* __restrict__ kv,
                                const float* __restrict__ gates, int64_t T, int64_t hc, int64_t dim,
                                float* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * hc * dim) return;
  const int64_t t = k / (hc * dim), d = k % dim;
  const float value = kv[t * (hc + 1) * dim + hc * dim + d];
  out[k] = formats::round_to_bf16(__fadd_rn(x[k], __fmul_rn(gates[k / dim], value)));
}

}  // namespace

void engram_lookup(const uint8_t* codes, const uint8_t* scales, int64_t head_dim, const int64_t* ids, int64_t T,
                   int64_t cols, float* out) {
  if (T * cols * head_dim == 0) return;
  lookup_kernel<<<grid_for(T * cols * head_dim, kThreads), kThreads>>>(codes, scales, head_dim, ids, T, cols, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void engram_gate_residual(const float* x, const float* kv, const float* q_weight, const float* k_weight, int64_t T,
                          int64_t hc, int64_t dim, double eps, float inv_sqrt_dim, float* gates, float* out) {
  if (T * hc == 0) return;
  gates_kernel<<<grid_for(T * hc, kThreads), kThreads>>>(x, kv, q_weight, k_weight, T, hc, dim,
                                                         static_cast<float>(eps), inv_sqrt_dim, gates);
  DSV41_CUDA_CHECK(cudaGetLastError());
  if (dim == 0) return;
  residual_kernel<<<grid_for(T * hc * dim, kThreads), kThreads>>>(x, kv, gates, T, hc, dim, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
