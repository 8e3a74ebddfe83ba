// cuda/engram.cu ↔ reference/ops/engram.cc (engram_lookup, engram_gates + engram_gate_residual)
//
// engram_lookup: the warp-per-row kernel below (8-byte code loads, 16-byte stores, float or bf16
//   output storage) when head_dim % 32 == 0 and the pointers are aligned, else one thread per
//   output value: bf16(e4m3_decode(code) * e8m0_decode(scale)), the
//   formats/ decoders compiled for the device (DSV41_HD) and one fp32 multiply: BIT-EXACT.
// engram_gates: one thread per (token, copy): the three torch-order sums of cuda/torch_sum.cuh
//   (squares of h, squares of key, (h * (qw * kw)) * key), the same fp32 divide / sqrt / multiply
//   chain, the clamp as std::max's (a < b ? b : a), copysign, and torch_sigmoid_f32 of
//   cuda/torch_math.cuh (the reference's own exp, built from correctly rounded fmas): BIT-EXACT.
//   fp32(dim^-0.5) is computed on the host (std::pow in double) and passed in.
// engram_gate_residual: one thread per output: bf16(h + gate * value) (fp32 mul, fp32 add).
#include <algorithm>

#include "cuda/bf16_storage.cuh"
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/kernels_bf16.h"
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

// engram_lookup, vectorised: one warp per gathered row (item i = t * cols + c of the flattened
// ids, out row i), lane k decodes the 8 codes of 8-byte chunks k, k + 32, ... of the row; each
// warp has kGatherRows rows in flight (their ids are warp-uniform loads), grid-stride over items.
// Per code, bit for bit the reference's bf16(e4m3_decode(code) * e8m0_decode(scale)):
//   * ((c & 0x7F) << 4) | ((c & 0x80) << 8) is the bf16 pattern of e4m3(c) * 2^-120, exactly, for
//     every non-NaN code (normal codes: the exponent field E lands in the bf16 exponent and the
//     bias differs by 120; subnormal codes M * 2^-9 land on the bf16 subnormals M * 2^-129; -0
//     stays -0). Times 2^120 (exact) it is e4m3_decode(c) as fp32; then one fp32 multiply by
//     e8m0_decode(scale) (the reference's own rounding) and the bf16 rounding of bf16x2_rn
//     (cuda/bf16_storage.cuh: formats::bf16_encode, NaN -> 0x7FC0).
//   * NaN codes (0x7F, 0xFF) decode to NaN as in formats::e4m3_decode.
__device__ inline void decode8(uint2 cw, uint8_t scale_byte, uint32_t (&w)[4]) {
  const float scale = formats::e8m0_decode(scale_byte);
  const float nan = f32_from_bits(0x7FC00000u);
  const uint32_t in[2] = {cw.x, cw.y};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t p = __byte_perm(in[k], 0u, half ? 0x4342u : 0x4140u);  // codes 2h, 2h+1 -> 16-bit lanes
      const uint32_t h2 = ((p & 0x007F007Fu) << 4) | ((p & 0x00800080u) << 8);
      float v0 = __fmul_rn(__fmul_rn(bf16_lo(h2), 0x1p120f), scale);
      float v1 = __fmul_rn(__fmul_rn(bf16_hi(h2), 0x1p120f), scale);
      if ((p & 0x7Fu) == 0x7Fu) v0 = nan;
      if ((p & 0x007F0000u) == 0x007F0000u) v1 = nan;
      w[2 * k + half] = bf16x2_rn(v0, v1);
    }
  }
}

constexpr int kGatherRows = 8;  // rows in flight per warp

template <class S>
__global__ void __launch_bounds__(256, 4)  // 4 blocks per SM: 64 KB of table rows in flight per SM
    lookup_vec_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t hd,
                      const int64_t* __restrict__ ids, int64_t items, S* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int chunks = static_cast<int>(hd / 8);
  const int64_t nwarps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = ((int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5) * kGatherRows; base < items;
       base += nwarps * kGatherRows) {
    int64_t id[kGatherRows];
#pragma unroll
    for (int u = 0; u < kGatherRows; ++u) id[u] = base + u < items ? __ldg(ids + base + u) : -1;
    for (int j = lane; j < chunks; j += 32) {
      uint2 cw[kGatherRows];
      uint8_t sc[kGatherRows];
#pragma unroll
      for (int u = 0; u < kGatherRows; ++u) {
        if (id[u] < 0) continue;
        cw[u] = __ldcs(reinterpret_cast<const uint2*>(codes + id[u] * hd) + j);
        sc[u] = __ldcs(scales + id[u] * (hd / 32) + j / 4);
      }
#pragma unroll
      for (int u = 0; u < kGatherRows; ++u) {
        if (id[u] < 0) continue;
        uint32_t w[4];
        decode8(cw[u], sc[u], w);
        store8_bits(out + (base + u) * hd + j * 8, w);
      }
    }
  }
}

template <class S>
bool lookup_vec(const uint8_t* codes, const uint8_t* scales, int64_t hd, const int64_t* ids, int64_t items, S* out) {
  if (hd % 32 != 0 || reinterpret_cast<uintptr_t>(codes) % 8 != 0 || !aligned16(out)) return false;
  constexpr int64_t kWarpsPerBlock = 8;
  const int64_t blocks = std::min<int64_t>((items + kGatherRows * kWarpsPerBlock - 1) / (kGatherRows * kWarpsPerBlock),
                                           int64_t{sm_count()} * 16);
  lookup_vec_kernel<S><<<static_cast<unsigned>(blocks), 256>>>(codes, scales, hd, ids, items, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
  return true;
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
  if (lookup_vec<float>(codes, scales, head_dim, ids, T * cols, out)) return;
  lookup_kernel<<<grid_for(T * cols * head_dim, kThreads), kThreads>>>(codes, scales, head_dim, ids, T, cols, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void engram_lookup_bf16(const uint8_t* codes, const uint8_t* scales, int64_t head_dim, const int64_t* ids, int64_t T,
                        int64_t cols, uint16_t* out) {
  if (T * cols * head_dim == 0) return;
  DSV41_CHECK(lookup_vec<uint16_t>(codes, scales, head_dim, ids, T * cols, out),
              "gpu::engram_lookup_bf16: needs head_dim % 32 == 0, 8-byte aligned codes and 16-byte aligned out; got "
              "head_dim ", head_dim);
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
