// cuda/compressor.cu ↔ reference/ops/compressor.cc
//
// compress's softmax pooling, one thread per (group, channel), in the reference's order and
// roundings (--fmad=false; every fp32 operation an explicit __f*_rn):
//   m = max_t s_t (the reference's std::max: a NaN after the first row is skipped), e_t =
//   libm_expf(s_t - m) (glibc's expf bit for bit, cuda/libm_expf.h), z = e_0 + ... left to right,
//   latent = bf16(sum_t fl(kv_t * fl(e_t / z))) left to right. BIT-EXACT.
// Row t of group g is token p = g*ratio + t: this call's input row p - start_pos when
// p >= start_pos, else the state slot t (the group began in an earlier call). The state update (the
// slots of this call's tokens of an unfinished first group, and the trailing partial group) is a
// second launch, after the pooling has read the old slots.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;

__global__ void compress_pool_kernel(const float* __restrict__ kv, const float* __restrict__ score, int64_t dim,
                                     int64_t start_pos, int ratio, const float* __restrict__ kv_state,
                                     const float* __restrict__ score_state, int64_t first_group, int64_t n_groups,
                                     float* __restrict__ latent) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_groups * dim) return;
  const int64_t g = first_group + i / dim, c = i % dim;
  // The element (t, c) of the group's kv or score rows.
  auto row = [&](const float* in, const float* state, int t) {
    const int64_t p = g * ratio + t;
    return p >= start_pos ? in[(p - start_pos) * dim + c] : state[static_cast<int64_t>(t) * dim + c];
  };
  float m = row(score, score_state, 0);
  for (int t = 1; t < ratio; ++t) {
    const float s = row(score, score_state, t);
    m = (m < s) ? s : m;  // std::max(m, s)
  }
  float z = 0.0f;
  for (int t = 0; t < ratio; ++t) z = __fadd_rn(z, libm_expf(__fsub_rn(row(score, score_state, t), m)));
  float acc = 0.0f;
  for (int t = 0; t < ratio; ++t) {
    const float w = __fdiv_rn(libm_expf(__fsub_rn(row(score, score_state, t), m)), z);  // the same e_t
    acc = __fadd_rn(acc, __fmul_rn(row(kv, kv_state, t), w));
  }
  latent[i] = formats::round_to_bf16(acc);
}

// Slots of tokens p_lo .. p_hi - 1 (slot p % ratio) <- their input rows.
__global__ void compress_state_write_kernel(const float* __restrict__ kv, const float* __restrict__ score,
                                            int64_t dim, int64_t start_pos, int ratio, int64_t p_lo, int64_t n,
                                            float* __restrict__ kv_state, float* __restrict__ score_state) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t p = p_lo + i / dim, c = i % dim, slot = p % ratio;
  kv_state[slot * dim + c] = kv[(p - start_pos) * dim + c];
  score_state[slot * dim + c] = score[(p - start_pos) * dim + c];
}

}  // namespace

void compress_pool(const float* kv, const float* score, int64_t dim, int64_t start_pos, int ratio,
                   const float* kv_state, const float* score_state, int64_t first_group, int64_t n_groups,
                   float* latent) {
  if (n_groups * dim == 0) return;
  compress_pool_kernel<<<grid_for(n_groups * dim, kThreads), kThreads>>>(kv, score, dim, start_pos, ratio, kv_state,
                                                                         score_state, first_group, n_groups, latent);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void compress_state_write(const float* kv, const float* score, int64_t dim, int64_t start_pos, int ratio,
                          int64_t p_lo, int64_t p_hi, float* kv_state, float* score_state) {
  const int64_t n = p_hi - p_lo;
  if (n <= 0 || dim == 0) return;
  compress_state_write_kernel<<<grid_for(n * dim, kThreads), kThreads>>>(kv, score, dim, start_pos, ratio, p_lo, n,
                                                                         kv_state, score_state);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

// libm_expf over x = f32_from_bits(first + i), i < n -> y[i] (the exhaustive device check).
namespace {
__global__ void libm_expf_kernel(uint32_t first, int64_t n, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = libm_expf(__uint_as_float(first + static_cast<uint32_t>(i)));
}
}  // namespace

void libm_expf_range(uint32_t first, int64_t n, float* y) {
  if (n <= 0) return;
  libm_expf_kernel<<<grid_for(n, kThreads), kThreads>>>(first, n, y);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
