// cuda/mhc.cu ↔ reference/ops/mhc.cc (hc_identity_pre, hc_pre, hc_post) and reference/ops/dspark.cc (hc_mean)
//
// hc_post: the vectorised kernel below (8 values per thread, 16-byte accesses, hc 1 or 4, float or
// bf16 storage), else the one-thread-per-output kernel; the same statements either way.
// One thread per output element; each sums over the hc copies in index order with separate fp32
// multiplies and adds (the host never contracts to FMA; --fmad=false here): BIT-EXACT.
// hc_raw_mixes (the heavy part of hc_mixes): one thread per token for the rsqrt statistic
// (cuda/torch_sum.cuh: the reference's torch sum order, bit-exact), then one thread per (token,
// mix) for the double dot product in index order (__dadd_rn/__dmul_rn, one rounding to fp32, then
// one fp32 multiply by r): BIT-EXACT. hc_split_sinkhorn: one thread per token, the statements of
// reference/ops/mhc.cc hc_split_sinkhorn_row (torch_sigmoid_f32 of cuda/torch_math.cuh for pre and
// post, libm_expf = glibc's expf bit for bit for the comb, the Sinkhorn sums sequential from 0 with
// true divisions): BIT-EXACT. (CudaOps::hc_mixes runs the reference's own split on the host when
// this process's libm is not the one libm_expf reproduces.)
#include "cuda/bf16_storage.cuh"
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/kernels_bf16.h"
#include "cuda/libm_expf.h"
#include "cuda/torch_math.cuh"
#include "cuda/torch_sum.cuh"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void identity_pre_kernel(int64_t T, int64_t hc, float* __restrict__ pre) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < T * hc) pre[k] = k % hc == 0 ? 1.0f : 0.0f;
}

// y[t, d] = bf16(sum_i pre[t, i] * stream[t, i, d]).
__global__ void hc_pre_kernel(const float* __restrict__ stream, const float* __restrict__ pre, int64_t T, int64_t hc,
                              int64_t dim, float* __restrict__ y) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * dim) return;
  const int64_t t = k / dim, d = k % dim;
  float sum = 0.0f;
  for (int64_t i = 0; i < hc; ++i) sum = __fadd_rn(sum, __fmul_rn(pre[t * hc + i], stream[(t * hc + i) * dim + d]));
  y[k] = formats::round_to_bf16(sum);
}

// y[t, j, d] = bf16(post[t, j] * f[t, d] + sum_i comb[t, i, j] * residual[t, i, d]).
__global__ void hc_post_kernel(const float* __restrict__ f, const float* __restrict__ residual,
                               const float* __restrict__ post, const float* __restrict__ comb, int64_t T, int64_t hc,
                               int64_t dim, float* __restrict__ y) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * hc * dim) return;
  const int64_t t = k / (hc * dim), j = (k / dim) % hc, d = k % dim;
  const float* c = comb + t * hc * hc;
  float mixed = 0.0f;
  for (int64_t i = 0; i < hc; ++i) mixed = __fadd_rn(mixed, __fmul_rn(c[i * hc + j], residual[(t * hc + i) * dim + d]));
  y[k] = formats::round_to_bf16(__fadd_rn(__fmul_rn(post[t * hc + j], f[t * dim + d]), mixed));
}

// hc_post, vectorised (the bandwidth-bound shape: T x hc x dim bf16 in and out): one thread per
// (token, 8 consecutive d), HC copies at compile time, S = the tensors' storage (float: bf16
// values in fp32, the backend; uint16_t: bf16 bits, the production format: cuda/bf16_storage.cuh).
// Per output the statements of hc_post_kernel / reference/ops/mhc.cc hc_post: mixed = 0, then
// mixed = fl(mixed + fl(comb[i][j] * residual[i][d])) for i ascending, then
// y = bf16(fl(fl(post[j] * f[d]) + mixed)), no FMA: BIT-EXACT. Grid: x covers the dim / 8 chunks of
// a token, y strides over tokens (post and comb of the token are block-uniform loads).
template <class S, int HC>
__global__ void __launch_bounds__(128)
    hc_post_vec_kernel(const S* __restrict__ f, const S* __restrict__ residual, const float* __restrict__ post,
                       const float* __restrict__ comb, int64_t T, int64_t dim, S* __restrict__ y) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk * 8 >= dim) return;
  const int64_t d0 = chunk * 8;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float fv[8], r[HC][8];
    load8(f + t * dim + d0, fv);
#pragma unroll
    for (int i = 0; i < HC; ++i) load8(residual + (t * HC + i) * dim + d0, r[i]);
    float c[HC][HC], p[HC];
#pragma unroll
    for (int i = 0; i < HC; ++i) {
      p[i] = __ldg(post + t * HC + i);
#pragma unroll
      for (int j = 0; j < HC; ++j) c[i][j] = __ldg(comb + (t * HC + i) * HC + j);
    }
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float mixed = 0.0f;
#pragma unroll
        for (int i = 0; i < HC; ++i) mixed = __fadd_rn(mixed, __fmul_rn(c[i][j], r[i][e]));
        out[e] = __fadd_rn(__fmul_rn(p[j], fv[e]), mixed);
      }
      store8_rounded(y + (t * HC + j) * dim + d0, out);
    }
  }
}

template <class S, int HC>
void launch_hc_post_vec(const S* f, const S* residual, const float* post, const float* comb, int64_t T, int64_t dim,
                        S* y) {
  constexpr int kVecThreads = 128;
  const dim3 grid(grid_for(dim / 8, kVecThreads), static_cast<unsigned>(T < 65535 ? T : 65535));
  hc_post_vec_kernel<S, HC><<<grid, kVecThreads>>>(f, residual, post, comb, T, dim, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

// The vectorised kernel takes hc 1 or 4 (the model's), dim % 8 == 0 and 16-byte aligned tensors.
template <class S>
bool hc_post_vec(const S* f, const S* residual, const float* post, const float* comb, int64_t T, int64_t hc,
                 int64_t dim, S* y) {
  if (dim % 8 != 0 || !aligned16(f) || !aligned16(residual) || !aligned16(y)) return false;
  if (hc == 4) launch_hc_post_vec<S, 4>(f, residual, post, comb, T, dim, y);
  else if (hc == 1) launch_hc_post_vec<S, 1>(f, residual, post, comb, T, dim, y);
  else return false;
  return true;
}

// y[t, d] = bf16((sum_i stream[t, i, d]) / hc).
__global__ void hc_mean_kernel(const float* __restrict__ stream, int64_t T, int64_t hc, int64_t dim,
                               float* __restrict__ y) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * dim) return;
  const int64_t t = k / dim, d = k % dim;
  float sum = 0.0f;
  for (int64_t i = 0; i < hc; ++i) sum = __fadd_rn(sum, stream[(t * hc + i) * dim + d]);
  y[k] = formats::round_to_bf16(__fdiv_rn(sum, static_cast<float>(hc)));
}

// r[t] = 1 / sqrt(torch_sum(x^2) / (hc*dim) + eps), x = stream[t] flattened (hc_raw_mixes).
__global__ void hc_rsqrt_kernel(const float* __restrict__ stream, int64_t T, int64_t width, float eps,
                                float* __restrict__ r) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float mean = __fdiv_rn(torch_sum::torch_sum_sq(stream + t * width, width), static_cast<float>(width));
  r[t] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// mixes[t, k] = fp32(sum_i double(x[i]) * double(fn[k, i]), i ascending) * r[t].
__global__ void hc_dot_kernel(const float* __restrict__ stream, const float* __restrict__ fn,
                              const float* __restrict__ r, int64_t T, int64_t width, int64_t n_mix,
                              float* __restrict__ mixes) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n_mix) return;
  const int64_t t = k / n_mix, m = k % n_mix;
  const float* x = stream + t * width;
  const float* w = fn + m * width;
  double acc = 0.0;
  for (int64_t i = 0; i < width; ++i) {
    acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(x[i]), static_cast<double>(w[i])));
  }
  mixes[k] = __fmul_rn(__double2float_rn(acc), r[t]);
}

// reference/ops/mhc.cc normalise_rows / normalise_cols: c /= (sequential sum + e).
__device__ void normalise_rows(float* c, int hc, float e) {
  for (int i = 0; i < hc; ++i) {
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, c[i * hc + j]);
    const float d = __fadd_rn(sum, e);
    for (int j = 0; j < hc; ++j) c[i * hc + j] = __fdiv_rn(c[i * hc + j], d);
  }
}
__device__ void normalise_cols(float* c, int hc, float e) {
  for (int j = 0; j < hc; ++j) {
    float sum = 0.0f;
    for (int i = 0; i < hc; ++i) sum = __fadd_rn(sum, c[i * hc + j]);
    const float d = __fadd_rn(sum, e);
    for (int i = 0; i < hc; ++i) c[i * hc + j] = __fdiv_rn(c[i * hc + j], d);
  }
}

__global__ void hc_split_sinkhorn_kernel(const float* __restrict__ mixes, const float* __restrict__ scale,
                                         const float* __restrict__ base, int64_t T, int hc, int iters, float e,
                                         float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  using torch_math::torch_sigmoid_f32;
  const float* mix = mixes + t * (2 + hc) * hc;
  float* p = pre + t * hc;
  float* q = post + t * hc;
  float* c = comb + t * hc * hc;
  for (int i = 0; i < hc; ++i) {
    p[i] = __fadd_rn(torch_sigmoid_f32(__fadd_rn(__fmul_rn(mix[i], scale[0]), base[i])), e);
    q[i] = __fmul_rn(2.0f, torch_sigmoid_f32(__fadd_rn(__fmul_rn(mix[hc + i], scale[1]), base[hc + i])));
  }
  const int off = 2 * hc;  // hc_comb_logits_row
  for (int k = 0; k < hc * hc; ++k) c[k] = __fadd_rn(__fmul_rn(mix[off + k], scale[2]), base[off + k]);
  for (int i = 0; i < hc; ++i) {
    float* row = c + i * hc;
    float mx = row[0];
    for (int j = 1; j < hc; ++j) mx = (mx < row[j]) ? row[j] : mx;  // std::max
    for (int j = 0; j < hc; ++j) row[j] = __fsub_rn(row[j], mx);
  }
  for (int k = 0; k < hc * hc; ++k) c[k] = libm_expf(c[k]);
  for (int i = 0; i < hc; ++i) {  // hc_sinkhorn_row: the softmax's division, then + e
    float* row = c + i * hc;
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, row[j]);
    for (int j = 0; j < hc; ++j) row[j] = __fadd_rn(__fdiv_rn(row[j], sum), e);
  }
  normalise_cols(c, hc, e);
  for (int it = 1; it < iters; ++it) {
    normalise_rows(c, hc, e);
    normalise_cols(c, hc, e);
  }
}

}  // namespace

void hc_raw_mixes(const float* stream, const float* fn, int64_t T, int64_t hc, int64_t dim, double norm_eps,
                  float* r, float* mixes) {
  const int64_t width = hc * dim, n_mix = (2 + hc) * hc;
  if (T == 0) return;
  hc_rsqrt_kernel<<<grid_for(T, kThreads), kThreads>>>(stream, T, width, static_cast<float>(norm_eps), r);
  DSV41_CUDA_CHECK(cudaGetLastError());
  hc_dot_kernel<<<grid_for(T * n_mix, kThreads), kThreads>>>(stream, fn, r, T, width, n_mix, mixes);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void hc_identity_pre(int64_t T, int64_t hc, float* pre) {
  if (T * hc == 0) return;
  identity_pre_kernel<<<grid_for(T * hc, kThreads), kThreads>>>(T, hc, pre);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void hc_pre(const float* stream, const float* pre, int64_t T, int64_t hc, int64_t dim, float* y) {
  if (T * dim == 0) return;
  hc_pre_kernel<<<grid_for(T * dim, kThreads), kThreads>>>(stream, pre, T, hc, dim, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void hc_post(const float* f, const float* residual, const float* post, const float* comb, int64_t T, int64_t hc,
             int64_t dim, float* y) {
  if (T * hc * dim == 0) return;
  if (hc_post_vec<float>(f, residual, post, comb, T, hc, dim, y)) return;
  hc_post_kernel<<<grid_for(T * hc * dim, kThreads), kThreads>>>(f, residual, post, comb, T, hc, dim, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void hc_post_bf16(const uint16_t* f, const uint16_t* residual, const float* post, const float* comb, int64_t T,
                  int64_t hc, int64_t dim, uint16_t* y) {
  if (T * hc * dim == 0) return;
  DSV41_CHECK(hc_post_vec<uint16_t>(f, residual, post, comb, T, hc, dim, y),
              "gpu::hc_post_bf16: needs hc 1 or 4, dim % 8 == 0 and 16-byte aligned tensors; got hc ", hc, ", dim ",
              dim);
}

void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int64_t T, int64_t hc, int iters,
                       double hc_eps, float* pre, float* post, float* comb) {
  if (T == 0) return;
  hc_split_sinkhorn_kernel<<<grid_for(T, kThreads), kThreads>>>(mixes, scale, base, T, static_cast<int>(hc), iters,
                                                                static_cast<float>(hc_eps), pre, post, comb);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void hc_mean(const float* stream, int64_t T, int64_t hc, int64_t dim, float* y) {
  if (T * dim == 0) return;
  hc_mean_kernel<<<grid_for(T * dim, kThreads), kThreads>>>(stream, T, hc, dim, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
