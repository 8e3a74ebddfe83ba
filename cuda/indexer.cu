// cuda/indexer.cu ↔ reference/indexer.cc (index_weights, index_scores)
//
// index_weights: one thread per value: bf16(proj * scale), one fp32 multiply (the scale is the
//   reference's index_weight_scale, computed on the host): BIT-EXACT.
// index_scores: one thread per (query, key): for each head in order, dot = bf16(fp32(double sum
//   of q[d] * k[d] in d order)) (__dadd_rn/__dmul_rn, one rounding, like dot_f64_f32), term =
//   bf16(relu(dot) * w[h]) with relu as `dot > 0 ? dot : 0`, sum += term in fp32 (__fadd_rn);
//   score = bf16(sum); -inf at and beyond the query's reach: BIT-EXACT.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;

__global__ void index_weights_kernel(const float* __restrict__ proj, int64_t n, float scale, float* __restrict__ w) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) w[k] = formats::round_to_bf16(__fmul_rn(proj[k], scale));
}

__global__ void index_scores_kernel(const float* __restrict__ q, const float* __restrict__ keys,
                                    const float* __restrict__ w, const int64_t* __restrict__ reach, int64_t T,
                                    int64_t heads, int64_t d, int64_t n, float* __restrict__ scores) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n) return;
  const int64_t t = k / n, j = k % n;
  if (j >= reach[t]) {
    scores[k] = -INFINITY;
    return;
  }
  const float* key = keys + j * d;
  float sum = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qr = q + (t * heads + h) * d;
    double acc = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(qr[i]), static_cast<double>(key[i])));
    }
    const float dot = formats::round_to_bf16(__double2float_rn(acc));
    sum = __fadd_rn(sum, formats::round_to_bf16(__fmul_rn(dot > 0.0f ? dot : 0.0f, w[t * heads + h])));
  }
  scores[k] = formats::round_to_bf16(sum);
}

}  // namespace

void index_weights(const float* proj, int64_t n, float scale, float* w) {
  if (n == 0) return;
  index_weights_kernel<<<grid_for(n, kThreads), kThreads>>>(proj, n, scale, w);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void index_scores(const float* q, const float* keys, const float* w, const int64_t* reach, int64_t T, int64_t heads,
                  int64_t d, int64_t n, float* scores) {
  if (T * n == 0) return;
  index_scores_kernel<<<grid_for(T * n, kThreads), kThreads>>>(q, keys, w, reach, T, heads, d, n, scores);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
