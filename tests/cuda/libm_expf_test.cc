// tests/cuda/libm_expf_test.cc: cuda/libm_expf.h, glibc's expf rebuilt from correctly rounded
// binary64 steps, against this process's std::exp(float) (the function the reference calls):
//   - its table: each entry re-derived from 2^(i/32) in 100-digit arithmetic (Boost.Multiprecision)
//   - the host routine on ALL 2^32 float inputs (no device needed: runs in CI; ~1 min on 2 cores)
//   - the device routine on all 2^32 inputs (skipped without a device)
//   - libm_expf_matches_host(), the probe CudaOps checks before running compress on the device
// NaN results compare as NaN (the payload is not part of the reference's contract: no op feeds a
// NaN to exp on a valid input).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <boost/multiprecision/cpp_bin_float.hpp>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/libm_expf.h"
#include "cuda/device.h"

namespace dsv41::test {
namespace {

using gpu::libm_expf;
namespace libm_expf_detail = gpu::libm_expf_detail;

bool same(float want, float got) { return std::isnan(want) ? std::isnan(got) : f32_bits(want) == f32_bits(got); }

// Runs check(first, last) over [0, 2^32) split among the host's threads; returns the mismatches
// and the first one.
struct Sweep {
  uint64_t mismatches = 0;
  uint32_t first = 0;
};
template <typename F>
Sweep sweep_all_floats(F check_range) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> first{~0ull};
  std::vector<std::thread> pool;
  const uint64_t total = 1ull << 32, per = (total + threads - 1) / threads;
  for (unsigned k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      const uint64_t lo = k * per, hi = std::min(total, lo + per);
      uint64_t n = 0, f = ~0ull;
      check_range(lo, hi, n, f);
      bad += n;
      uint64_t cur = first.load();
      while (f < cur && !first.compare_exchange_weak(cur, f)) {
      }
    });
  }
  for (std::thread& t : pool) t.join();
  return {bad.load(), static_cast<uint32_t>(first.load())};
}

TEST(LibmExpf, TableIsTwoToTheIOver32RoundedToDouble) {
  using Big = boost::multiprecision::cpp_bin_float_100;
  for (uint32_t i = 0; i < 32; ++i) {
    const double want = static_cast<double>(boost::multiprecision::pow(Big(2), Big(i) / 32));  // rn64
    const uint64_t entry = libm_expf_detail::table(i) + (static_cast<uint64_t>(i) << 47);
    EXPECT_EQ(entry, libm_expf_detail::f64_bits(want)) << "table entry " << i;
  }
}

TEST(LibmExpf, HostEqualsStdExpOnEveryFloat) {
  const Sweep s = sweep_all_floats([](uint64_t lo, uint64_t hi, uint64_t& n, uint64_t& first) {
    for (uint64_t u = lo; u < hi; ++u) {
      const float x = f32_from_bits(static_cast<uint32_t>(u));
      if (!same(std::exp(x), libm_expf(x))) {
        ++n;
        first = std::min<uint64_t>(first, u);
      }
    }
  });
  EXPECT_EQ(s.mismatches, 0u) << "first mismatch at x = " << std::hexfloat << f32_from_bits(s.first)
                              << " (bits 0x" << std::hex << s.first << ")";
}

TEST(LibmExpf, SpotValues) {
  // Values the routine must get right whatever the libm: exact cases and the range limits.
  EXPECT_EQ(f32_bits(libm_expf(0.0f)), f32_bits(1.0f));
  EXPECT_EQ(f32_bits(libm_expf(-0.0f)), f32_bits(1.0f));
  EXPECT_EQ(f32_bits(libm_expf(-INFINITY)), f32_bits(0.0f));
  EXPECT_TRUE(std::isinf(libm_expf(INFINITY)));
  EXPECT_TRUE(std::isnan(libm_expf(NAN)));
  EXPECT_TRUE(std::isinf(libm_expf(89.0f)));
  EXPECT_EQ(libm_expf(-104.0f), 0.0f);
  EXPECT_GT(libm_expf(-103.0f), 0.0f);  // subnormal, not flushed
  EXPECT_NEAR(libm_expf(1.0f), 2.7182817f, 3e-7f);
}

TEST(LibmExpf, ProbeAgreesWithThisProcess) { EXPECT_TRUE(gpu::libm_expf_matches_host()); }

TEST(LibmExpf, DeviceEqualsStdExpOnEveryFloat) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kChunk = int64_t{1} << 28;
  gpu::DeviceBuffer<float> d(static_cast<size_t>(kChunk));
  std::vector<float> y(static_cast<size_t>(kChunk));
  uint64_t mismatches = 0, first = ~0ull;
  for (uint64_t base = 0; base < (1ull << 32); base += kChunk) {
    gpu::libm_expf_range(static_cast<uint32_t>(base), kChunk, d.get());
    gpu::copy_to_host(y.data(), d.get(), d.bytes());
    const Sweep s = sweep_all_floats([&](uint64_t lo, uint64_t hi, uint64_t& n, uint64_t& f) {
      // Each thread takes its share of this chunk: [lo, hi) of 2^32 scaled down to the chunk.
      const uint64_t a = lo >> 4, b = hi >> 4;  // 2^32 / 2^28 = 16
      for (uint64_t i = a; i < b; ++i) {
        const float x = f32_from_bits(static_cast<uint32_t>(base + i));
        if (!same(std::exp(x), y[i])) {
          ++n;
          f = std::min<uint64_t>(f, base + i);
        }
      }
    });
    mismatches += s.mismatches;
    if (s.mismatches > 0) first = std::min<uint64_t>(first, s.first);
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch at bits 0x" << std::hex << first;
}

}  // namespace
}  // namespace dsv41::test
