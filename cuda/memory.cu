// cuda/memory.cu
//
// Memory ops of the CUDA ops table (cuda/kernels.h): device-to-device copies, row gathers and
// scatters (cache entries, slices), column placement (concat_cols), the in-place add of
// add_markov_bias, and flag_unless_all_set (a deferred check). Pure data movement except add_in_place (one fp32 add per element: bit-exact).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace dsv41::gpu {
namespace {

constexpr int kThreads = 256;

// One thread per byte of the n rows: dst row dst_row[i] <- src row src_row[i].
__global__ void copy_rows_kernel(const uint8_t* __restrict__ src, const int64_t* __restrict__ src_row,
                                 uint8_t* __restrict__ dst, const int64_t* __restrict__ dst_row, int64_t n,
                                 int64_t row_bytes) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n * row_bytes) return;
  const int64_t i = k / row_bytes, b = k % row_bytes;
  const int64_t s = src_row ? src_row[i] : i, d = dst_row ? dst_row[i] : i;
  dst[d * row_bytes + b] = src[s * row_bytes + b];
}

// y [T, width]: columns [off, off + w) <- x [T, w].
__global__ void copy_cols_kernel(const float* __restrict__ x, int64_t T, int64_t w, float* __restrict__ y,
                                 int64_t width, int64_t off) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * w) return;
  const int64_t t = k / w, c = k % w;
  y[t * width + off + c] = x[k];
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t n) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) y[k] = __fadd_rn(y[k], b[k]);
}

__global__ void flag_unless_all_set_kernel(const uint8_t* __restrict__ flags, int64_t n, int* __restrict__ status) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n && flags[k] != 1) atomicExch(status, 1);
}

}  // namespace

void flag_unless_all_set(const uint8_t* flags, int64_t n, int* status) {
  if (n == 0) return;
  flag_unless_all_set_kernel<<<grid_for(n, kThreads), kThreads>>>(flags, n, status);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  DSV41_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void copy_rows(const uint8_t* src, const int64_t* src_row, uint8_t* dst, const int64_t* dst_row, int64_t n,
               int64_t row_bytes) {
  if (n * row_bytes == 0) return;
  copy_rows_kernel<<<grid_for(n * row_bytes, kThreads), kThreads>>>(src, src_row, dst, dst_row, n, row_bytes);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void copy_cols(const float* x, int64_t T, int64_t w, float* y, int64_t width, int64_t off) {
  if (T * w == 0) return;
  copy_cols_kernel<<<grid_for(T * w, kThreads), kThreads>>>(x, T, w, y, width, off);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

void add_in_place(float* y, const float* b, int64_t n) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads>>>(y, b, n);
  DSV41_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv41::gpu
