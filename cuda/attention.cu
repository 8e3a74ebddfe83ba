// cuda/attention.cu ↔ reference/attention.cc (sparse_attn's dot products, attention_index_rows)
//
// sparse_attn runs in three device stages (CudaOps::sparse_attn, cuda/cuda_ops_mhc_attn.cc):
//   sparse_scores  one thread per (t, h, j): s = fl32(fma-chain_d(q[d], kv_j[d]) * scale), the
//                  chain from +0 in d order with __fmaf_rn (the reference's fma_dot_f32: std::fma,
//                  correctly rounded), -inf for index -1: BIT-EXACT.
//   sparse_softmax one thread per (t, h): reference::OnlineSoftmax block by block (max with
//                  std::max's NaN behaviour, rescale = libm_expf(m - m'), p_j = libm_expf(s_j - m'),
//                  the double sum in j order rounded once, l = fl(l * r) + sum, bf16(p_j)), then
//                  l += libm_expf(sink - m); libm_expf is glibc's expf bit for bit
//                  (cuda/libm_expf.h): BIT-EXACT.
//   sparse_pv      one thread per (t, h, d): per block of 64 indices, pv = fma-chain_j(p_j, kv_j[d])
//                  from +0 in j order (p_j = the bf16 probabilities; index -1 reads 0.0f,
//                  as the reference's zero row), acc = fl(acc * rescale_b) + pv (separate
//                  __fmul_rn and __fadd_rn: the reference is built with -ffp-contract=off), then
//                  out = bf16(acc / l) (__fdiv_rn): BIT-EXACT given p, rescale and l (from
//                  sparse_softmax, or from the reference's own OnlineSoftmax on the host when
//                  this process's libm is not the one libm_expf reproduces).
// attention_index_rows: integer copies, one thread per output: BIT-EXACT.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "formats/minifloat.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kBlock = 64;  // reference::kSparseAttnBlock

__global__ void sparse_scores_kernel(const float* __restrict__ q, const float* __restrict__ kv,
                                     const int32_t* __restrict__ idxs, int64_t T, int64_t H, int64_t D, int64_t K,
                                     float scale, float* __restrict__ s) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * H * K) return;
  const int64_t t = k / (H * K), h = (k / K) % H, j = k % K;
  const int32_t r = idxs[t * K + j];
  if (r < 0) {
    s[k] = -INFINITY;
    return;
  }
  const float* qr = q + (t * H + h) * D;
  const float* kr = kv + static_cast<int64_t>(r) * D;
  float acc = 0.0f;
  for (int64_t d = 0; d < D; ++d) acc = __fmaf_rn(qr[d], kr[d], acc);
  s[k] = __fmul_rn(acc, scale);
}

__global__ void sparse_softmax_kernel(const float* __restrict__ s, const float* __restrict__ sink, int64_t rows,
                                      int64_t H, int64_t K, float* __restrict__ p, float* __restrict__ rescale,
                                      float* __restrict__ l_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const int64_t blocks = (K + kBlock - 1) / kBlock;
  const float* sr = s + i * K;
  float* pr = p + i * K;
  float m = -1e30f, l = 0.0f;  // reference::kSparseAttnInitMax
  for (int64_t b0 = 0, b = 0; b0 < K; b0 += kBlock, ++b) {
    const int64_t nb = K - b0 < kBlock ? K - b0 : kBlock;
    float block_max = -INFINITY;
    for (int64_t j = 0; j < nb; ++j) block_max = (block_max < sr[b0 + j]) ? sr[b0 + j] : block_max;
    const float m_new = (m < block_max) ? block_max : m;
    const float r = libm_expf(__fsub_rn(m, m_new));
    double p_sum = 0.0;
    for (int64_t j = 0; j < nb; ++j) {
      const float pj = libm_expf(__fsub_rn(sr[b0 + j], m_new));
      p_sum = __dadd_rn(p_sum, static_cast<double>(pj));
      pr[b0 + j] = formats::round_to_bf16(pj);
    }
    l = __fadd_rn(__fmul_rn(l, r), __double2float_rn(p_sum));
    m = m_new;
    rescale[i * blocks + b] = r;
  }
  l_out[i] = __fadd_rn(l, libm_expf(__fsub_rn(sink[i % H], m)));
}

__global__ void sparse_pv_kernel(const float* __restrict__ kv, const int32_t* __restrict__ idxs,
                                 const float* __restrict__ p, const float* __restrict__ rescale,
                                 const float* __restrict__ l, int64_t T, int64_t H, int64_t D, int64_t K,
                                 float* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * H * D) return;
  const int64_t t = k / (H * D), h = (k / D) % H, c = k % D;
  const int64_t blocks = (K + kBlock - 1) / kBlock;
  const int32_t* idx = idxs + t * K;
  const float* pr = p + (t * H + h) * K;
  const float* rr = rescale + (t * H + h) * blocks;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t b0 = b * kBlock, nb = K - b0 < kBlock ? K - b0 : kBlock;
    float pv = 0.0f;
    for (int64_t j = 0; j < nb; ++j) {
      const int32_t r = idx[b0 + j];
      const float v = r < 0 ? 0.0f : kv[static_cast<int64_t>(r) * D + c];
      pv = __fmaf_rn(pr[b0 + j], v, pv);
    }
    acc = __fadd_rn(__fmul_rn(acc, rr[b]), pv);
  }
  out[k] = formats::round_to_bf16(__fdiv_rn(acc, l[t * H + h]));
}

__global__ void index_rows_kernel(const int32_t* __restrict__ window, int64_t kw, const int32_t* __restrict__ topk,
                                  int64_t kt, int64_t rows, int64_t offset, int64_t width,
                                  int32_t* __restrict__ out) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cols = kw + width;
  if (k >= rows * cols) return;
  const int64_t t = k / cols, c = k % cols;
  int32_t v = -1;
  if (c < kw) {
    v = window[t * kw + c];
  } else if (c - kw < kt) {
    const int32_t x = topk[t * kt + (c - kw)];
    v = x < 0 ? -1 : static_cast<int32_t>(x + offset);
  }
  out[k] = v;
}

}  // namespace

void sparse_attn_scores(const float* q, const float* kv, const int32_t* idxs, int64_t T, int64_t H, int64_t D,
                        int64_t K, float scale, float* s) {
  if (T * H * K == 0) return;
  sparse_scores_kernel<<<grid_for(T * H * K, kThreads), kThreads>>>(q, kv, idxs, T, H, D, K, scale, s);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void sparse_attn_softmax(const float* s, const float* sink, int64_t T, int64_t H, int64_t K, float* p,
                         float* rescale, float* l) {
  const int64_t rows = T * H;
  if (rows == 0) return;
  sparse_softmax_kernel<<<grid_for(rows, kThreads), kThreads>>>(s, sink, rows, H, K, p, rescale, l);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void sparse_attn_pv(const float* kv, const int32_t* idxs, const float* p, const float* rescale, const float* l,
                    int64_t T, int64_t H, int64_t D, int64_t K, float* out) {
  if (T * H * D == 0) return;
  sparse_pv_kernel<<<grid_for(T * H * D, kThreads), kThreads>>>(kv, idxs, p, rescale, l, T, H, D, K, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void attention_index_rows(const int32_t* window, int64_t kw, const int32_t* topk, int64_t kt, int64_t rows,
                          int64_t offset, int64_t width, int32_t* out) {
  if (rows * (kw + width) == 0) return;
  index_rows_kernel<<<grid_for(rows * (kw + width), kThreads), kThreads>>>(window, kw, topk, kt, rows, offset,
                                                                           width, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
