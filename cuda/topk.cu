// cuda/topk.cu ↔ reference/topk.cc + reference/indexer.cc (select_index_topk, candidate blocks,
// apply_candidate_mask)
//
// The reference's order is a strict total order on (value descending, index ascending) for rows
// without NaN (-0 == +0 is a tie, broken by the index). Its top-k is therefore the set of entries
// whose RANK (the number of entries that beat them) is below k, whatever the sort algorithm:
//   topk_rank      one thread per (row, j): rank = #{i : s[i] > s[j] or (s[i] == s[j] and i < j)},
//                  a serial count (O(n) per thread, O(n^2) per row: correctness first); flags NaN
//                  (the caller then re-runs the reference, which raises its error).
//   topk_compact   one thread per row: the selected positions in ascending order (the reference
//                  sorts its picks ascending), -1 at and beyond the row's reach.
//   block_scores   one thread per (row, block): max over the block as std::max does ((b < s) ? s :
//                  b, from -inf: a NaN score is skipped, as on the host), then +inf on the block
//                  of the newest reachable position.
//   block_mask     one thread per (row, block): selected (rank < k) and score > -inf -> its
//                  positions 1, else 0.
//   mask_scores    one thread per value: -inf where the mask is 0.
// All comparisons and copies: BIT-EXACT (no arithmetic).
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/ops.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 128;

__device__ inline bool better(const float* s, int64_t a, int64_t b) {
  return s[a] > s[b] || (s[a] == s[b] && a < b);
}

__global__ void rank_kernel(const float* __restrict__ scores, int64_t rows, int64_t n, int64_t k,
                            uint8_t* __restrict__ selected, int* __restrict__ nan_seen) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= rows * n) return;
  const float* s = scores + (x / n) * n;
  const int64_t j = x % n;
  if (s[j] != s[j]) *nan_seen = 1;
  int64_t rank = 0;
  for (int64_t i = 0; i < n && rank < k; ++i) rank += better(s, i, j) ? 1 : 0;
  selected[x] = rank < k ? 1 : 0;
}

__global__ void compact_kernel(const uint8_t* __restrict__ selected, const int64_t* __restrict__ reach, int64_t rows,
                               int64_t n, int64_t k, int32_t* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  int64_t c = 0;
  for (int64_t j = 0; j < n && c < k; ++j) {
    if (selected[t * n + j] != 0) out[t * k + c++] = j < reach[t] ? static_cast<int32_t>(j) : -1;
  }
}

__global__ void block_scores_kernel(const float* __restrict__ scores, const int64_t* __restrict__ reach, int64_t rows,
                                    int64_t n, int64_t block_size, int64_t blocks, float* __restrict__ out) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= rows * blocks) return;
  const int64_t t = x / blocks, b = x % blocks;
  float m = -INFINITY;
  for (int64_t j = b * block_size; j < n && j < (b + 1) * block_size; ++j) {
    const float v = scores[t * n + j];
    m = (m < v) ? v : m;  // std::max(m, v)
  }
  const int64_t r = reach[t];
  if (r >= 1 && (r - 1) / block_size == b) m = INFINITY;  // floor_div(reach - 1, bs), none when reach is 0
  out[x] = m;
}

__global__ void block_mask_kernel(const float* __restrict__ block, int64_t rows, int64_t blocks, int64_t k,
                                  int64_t n, int64_t block_size, uint8_t* __restrict__ mask) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= rows * blocks) return;
  const int64_t t = x / blocks, b = x % blocks;
  const float* s = block + t * blocks;
  int64_t rank = 0;
  for (int64_t i = 0; i < blocks && rank < k; ++i) rank += better(s, i, b) ? 1 : 0;
  const uint8_t keep = (rank < k && s[b] > -INFINITY) ? 1 : 0;
  for (int64_t j = b * block_size; j < n && j < (b + 1) * block_size; ++j) mask[t * n + j] = keep;
}

__global__ void mask_scores_kernel(float* __restrict__ scores, const uint8_t* __restrict__ mask, int64_t n) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x < n && mask[x] == 0) scores[x] = -INFINITY;
}

}  // namespace

bool index_topk(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t k, int32_t* out) {
  if (rows * n == 0 || k == 0) return true;
  DeviceBuffer<uint8_t> selected(static_cast<size_t>(rows * n));
  DeviceBuffer<int> nan_seen(1);
  nan_seen.poison(0);
  rank_kernel<<<grid_for(rows * n, kThreads), kThreads>>>(scores, rows, n, k, selected.get(), nan_seen.get());
  DSV41_CUDA_CHECK(cudaGetLastError());
  if (nan_seen.download()[0] != 0) return false;
  compact_kernel<<<grid_for(rows, kThreads), kThreads>>>(selected.get(), reach, rows, n, k, out);
  DSV41_CUDA_CHECK(cudaGetLastError());
  return true;
}

void candidate_blocks(const float* scores, const int64_t* reach, int64_t rows, int64_t n, int64_t topk_blocks,
                      int64_t block_size, uint8_t* mask) {
  if (rows * n == 0) return;
  const int64_t blocks = (n + block_size - 1) / block_size;
  const int64_t k = topk_blocks < blocks ? topk_blocks : blocks;
  DeviceBuffer<float> block(static_cast<size_t>(rows * blocks));
  block_scores_kernel<<<grid_for(rows * blocks, kThreads), kThreads>>>(scores, reach, rows, n, block_size, blocks,
                                                                        block.get());
  DSV41_CUDA_CHECK(cudaGetLastError());
  block_mask_kernel<<<grid_for(rows * blocks, kThreads), kThreads>>>(block.get(), rows, blocks, k, n, block_size,
                                                                      mask);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void mask_scores(float* scores, const uint8_t* mask, int64_t n) {
  if (n == 0) return;
  mask_scores_kernel<<<grid_for(n, kThreads), kThreads>>>(scores, mask, n);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
