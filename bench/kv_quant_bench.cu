// bench/kv_quant_bench.cu
//
// Times gpu::pack_rows / gpu::unpack_rows of every cache format at the released dims, and a
// device-to-device copy of the same size as the measured bandwidth ceiling. CUDA events around
// each launch; the median of `repeats` launches after `warmup` launches. Bytes counted are the
// fewest the operation must move: pack reads [rows, dim] fp32 and writes the entries plus one
// finite flag per row; unpack reads the entries and writes [rows, dim] fp32. Inputs are random
// bf16 values (never zeros) with a per-row log-normal magnitude, made on the device.
//
// Usage: dsv41_kv_quant_bench [input GiB per case = 2] [repeats = 50]
// Results: bench/RESULTS.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"

namespace {

using dsv41::formats::CacheFormat;

__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// x[i] = bf16(m_row * u), u uniform in (-2, 2), log2(m_row) uniform in [-20, 20).
__global__ void fill_random(float* x, int64_t n, int dim, uint64_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t row_h = mix64(seed ^ static_cast<uint64_t>(i / dim));
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1));
    const float u =
        static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) * 0x1.0p-22f;
    const float m = exp2f(static_cast<float>(row_h % 40) - 20.0f);
    x[i] = dsv41::formats::round_to_bf16(u * m);
  }
}

template <class F>
float median_ms(int warmup, int repeats, F&& launch) {
  cudaEvent_t a, b;
  DSV41_CUDA_CHECK(cudaEventCreate(&a));
  DSV41_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> ms(repeats);
  for (int i = 0; i < repeats; ++i) {
    DSV41_CUDA_CHECK(cudaEventRecord(a));
    launch();
    DSV41_CUDA_CHECK(cudaEventRecord(b));
    DSV41_CUDA_CHECK(cudaEventSynchronize(b));
    DSV41_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
  }
  DSV41_CUDA_CHECK(cudaEventDestroy(a));
  DSV41_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  const float spread = ms[repeats * 9 / 10] / ms[repeats / 10];
  if (spread > 1.2f) std::printf("  (note: p90/p10 spread %.2f)\n", spread);
  return ms[repeats / 2];
}

struct Case {
  CacheFormat format;
  int dim;
};

void report(const char* what, int dim, int64_t rows, double bytes, float ms, double ceiling) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-22s %5d %9lld %10.1f %9.3f %9.0f %7.1f%%\n", what, dim,
              static_cast<long long>(rows), bytes / 1e6, ms, gbs,
              ceiling > 0 ? 100.0 * gbs / ceiling : 100.0);
}

int run(double gib, int repeats) {
  namespace gpu = dsv41::gpu;
  if (gpu::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::printf("device: %s\n", gpu::device_name(0).c_str());
  const int warmup = 5;
  const int64_t in_bytes = static_cast<int64_t>(gib * double(1ull << 30));

  // Ceiling: device-to-device copy of in_bytes, counting bytes read plus bytes written.
  double ceiling = 0;
  {
    gpu::DeviceBuffer<uint8_t> src(in_bytes), dst(in_bytes);
    src.poison(0x3C);
    const float ms = median_ms(warmup, repeats, [&] {
      DSV41_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), in_bytes, cudaMemcpyDeviceToDevice));
    });
    ceiling = 2.0 * double(in_bytes) / (ms * 1e-3) / 1e9;
    std::printf("%-22s %5s %9s %10s %9s %9s %8s\n", "op", "dim", "rows", "MB moved", "median ms",
                "GB/s", "of copy");
    report("d2d copy (ceiling)", 0, 0, 2.0 * double(in_bytes), ms, 0);
  }

  const Case cases[] = {{CacheFormat::kCompressedKvFp4, 512},
                        {CacheFormat::kIndexKeysFp4, 128},
                        {CacheFormat::kWindowKvFp8, 512},
                        {CacheFormat::kBf16, 512}};
  for (const Case& c : cases) {
    const int64_t rows = in_bytes / (int64_t{4} * c.dim);
    const int eb = dsv41::formats::entry_bytes(c.format, c.dim);
    gpu::DeviceBuffer<float> x(static_cast<size_t>(rows) * c.dim), y(x.size());
    gpu::DeviceBuffer<uint8_t> packed(static_cast<size_t>(rows) * eb), finite(rows);
    fill_random<<<4096, 256>>>(x.get(), static_cast<int64_t>(x.size()), c.dim, 20261129u);
    DSV41_CUDA_CHECK(cudaGetLastError());
    gpu::synchronize();
    const char* name = dsv41::formats::info(c.format).name;
    const double x_bytes = 4.0 * double(rows) * c.dim;
    const double e_bytes = double(rows) * eb;

    const float pack_ms = median_ms(warmup, repeats, [&] {
      gpu::pack_rows(c.format, x.get(), rows, c.dim, packed.get(), finite.get());
    });
    char what[64];
    std::snprintf(what, sizeof what, "pack %s", name);
    report(what, c.dim, rows, x_bytes + e_bytes + double(rows), pack_ms, ceiling);

    const float unpack_ms = median_ms(
        warmup, repeats, [&] { gpu::unpack_rows(c.format, packed.get(), rows, c.dim, y.get()); });
    std::snprintf(what, sizeof what, "unpack %s", name);
    report(what, c.dim, rows, e_bytes + x_bytes, unpack_ms, ceiling);

    // Sanity: some finite flags set and some packed bytes non-zero (never time unwritten data).
    const std::vector<uint8_t> f = finite.download();
    const std::vector<uint8_t> p = packed.download();
    const auto finite_rows = std::count(f.begin(), f.end(), uint8_t{1});
    const auto nonzero = std::count_if(p.begin(), p.end(), [](uint8_t v) { return v != 0; });
    if (finite_rows != rows || nonzero == 0) {
      std::printf("  sanity FAILED: %lld/%lld finite rows, %lld non-zero bytes\n",
                  static_cast<long long>(finite_rows), static_cast<long long>(rows),
                  static_cast<long long>(nonzero));
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 50;
  try {
    return run(gib, std::max(repeats, 10));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
