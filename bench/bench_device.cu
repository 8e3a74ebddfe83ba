// bench/bench_device.cu: see bench_device.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>

#include "bench/bench_device.h"
#include "cuda/common.cuh"
#include "formats/minifloat.h"

namespace dsv41::bench {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kGrid = 8192;  // grid-stride loops

__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_bf16_kernel(float* x, int64_t n, int64_t dim, uint64_t seed, int lo, int hi) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t row_h = mix64(seed ^ (0xA24BAED4963EE407ull * static_cast<uint64_t>(i / dim + 1)));
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1));
    const float u = static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) * 0x1.0p-22f;
    const float m = exp2f(static_cast<float>(lo + static_cast<int>(row_h % static_cast<uint64_t>(hi - lo))));
    x[i] = formats::round_to_bf16(u * m);
  }
}

__global__ void fill_f32_kernel(float* x, int64_t n, uint64_t seed, float lo, float span) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1));
    x[i] = lo + span * static_cast<float>(h >> 40) * 0x1.0p-24f;
  }
}

__global__ void fill_i64_kernel(int64_t* x, int64_t n, uint64_t seed, int64_t bound) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int64_t>(mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1)) %
                                static_cast<uint64_t>(bound));
  }
}

__global__ void fill_i64_const_kernel(int64_t* x, int64_t n, int64_t v) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = v;
  }
}

__global__ void fill_u8_kernel(uint8_t* x, int64_t n, uint64_t seed, int lo, int hi, bool no_nan) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1));
    int b = lo + static_cast<int>(h % static_cast<uint64_t>(hi - lo + 1));
    if (no_nan && (b & 0x7F) == 0x7F) b -= 1;
    x[i] = static_cast<uint8_t>(b);
  }
}

void check_launch() {
  DSV41_CUDA_CHECK(cudaGetLastError());
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

void fill_bf16(float* x, int64_t n, int64_t dim, uint64_t seed, int lo, int hi) {
  fill_bf16_kernel<<<kGrid, kThreads>>>(x, n, dim, seed, lo, hi);
  check_launch();
}
void fill_f32(float* x, int64_t n, uint64_t seed, float lo, float span) {
  fill_f32_kernel<<<kGrid, kThreads>>>(x, n, seed, lo, span);
  check_launch();
}
void fill_i64(int64_t* x, int64_t n, uint64_t seed, int64_t bound) {
  fill_i64_kernel<<<kGrid, kThreads>>>(x, n, seed, bound);
  check_launch();
}
void fill_i64_const(int64_t* x, int64_t n, int64_t v) {
  fill_i64_const_kernel<<<kGrid, kThreads>>>(x, n, v);
  check_launch();
}
void fill_u8(uint8_t* x, int64_t n, uint64_t seed, int lo, int hi, bool no_e4m3_nan) {
  fill_u8_kernel<<<kGrid, kThreads>>>(x, n, seed, lo, hi, no_e4m3_nan);
  check_launch();
}

std::vector<double> time_ms(int warmup, int reps, int copies, const std::function<void(int)>& launch) {
  constexpr std::size_t kFlush = std::size_t{256} << 20;  // > 60 MB of L2
  static void* flush = nullptr;
  if (flush == nullptr) DSV41_CUDA_CHECK(cudaMalloc(&flush, kFlush));
  cudaEvent_t a, b;
  DSV41_CUDA_CHECK(cudaEventCreate(&a));
  DSV41_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch(i % copies);
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    DSV41_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, kFlush));
    DSV41_CUDA_CHECK(cudaEventRecord(a));
    launch((warmup + i) % copies);
    DSV41_CUDA_CHECK(cudaEventRecord(b));
    DSV41_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    DSV41_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  DSV41_CUDA_CHECK(cudaEventDestroy(a));
  DSV41_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms;
}

double once_ms(const std::function<void()>& launch) {
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  launch();
  DSV41_CUDA_CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::size_t free_device_bytes() {
  std::size_t free_b = 0, total = 0;
  DSV41_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
  return free_b;
}

std::string cuda_runtime_version() {
  int v = 0;
  DSV41_CUDA_CHECK(cudaRuntimeGetVersion(&v));
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace dsv41::bench
