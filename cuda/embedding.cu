// cuda/embedding.cu ↔ reference/ops/embedding.cc
//
// embed: every token's table row copied hc times. Data movement only: bit-exact.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

// One thread per output element of stream [T, hc, dim].
__global__ void embed_kernel(const int64_t* __restrict__ tokens, int64_t T, const float* __restrict__ table,
                             int64_t dim, int64_t hc, float* __restrict__ stream) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * hc * dim) return;
  const int64_t t = k / (hc * dim), d = k % dim;
  stream[k] = table[tokens[t] * dim + d];
}

}  // namespace

void embed(const int64_t* tokens, int64_t T, const float* table, int64_t dim, int64_t hc, float* stream) {
  if (T * hc * dim == 0) return;
  embed_kernel<<<grid_for(T * hc * dim, kThreads), kThreads>>>(tokens, T, table, dim, hc, stream);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
