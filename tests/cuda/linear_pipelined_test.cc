// tests/cuda/linear_pipelined_test.cc (in cuda_linear_production_test): the pipelined fp8 GEMM
// (cuda/linear_fp8_wgmma_pipe.cu; code tiles by cp.async, and by TMA) and the warp-specialized one
// (cuda/linear_fp8_wgmma_ws.cu) against the serial one (cuda/linear_fp8_wgmma.cu), bit for bit.
// They run the same block dots (one wgmma e4m3 from a zero accumulator per 32 of K, same tile
// layout and descriptors) and the same promotion in the same K order (ws: the scale products from
// a shared table, the same fp32 multiply); only the schedule differs, so every output must be the
// same fp32 bit pattern. Shapes cover each configuration the kernels pick (T > 64: 128 rows x 128
// columns; T <= 64: 64 rows x 128 or 64 columns), a last stage of 1, 2, 3 and 4 blocks, one stage
// only, more stages than the rings hold, T and out off the tiles (out odd: the scalar stores), ws's
// two scale loads (TMA where in / 32 % 4 == 0, else cp.async), and random power-of-two scales per block.
// Then the switch: DSV41_FP8_LINEAR_KERNEL picks the kernel of fp8_mma_linear_codes, a bad value throws.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <vector>

#include "cuda/kernels.h"
#include "formats/minifloat.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

// E4M3 codes, uniform over the finite ones (0x7F and 0xFF are NaN).
std::vector<uint8_t> random_codes(size_t n) {
  std::uniform_int_distribution<int> c(0, 255);
  std::vector<uint8_t> v(n);
  for (uint8_t& x : v) {
    int k = c(rng());
    while ((k & 0x7F) == 0x7F) k = c(rng());
    x = static_cast<uint8_t>(k);
  }
  return v;
}
// Powers of two 2^lo .. 2^hi (E8M0 values).
std::vector<float> random_scales(size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> e(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(1.0f, e(rng()));
  return v;
}

struct Gemm {
  int64_t T, out, in;
  gpu::DeviceBuffer<uint8_t> x, w;
  gpu::DeviceBuffer<float> xs, ws;
  Gemm(int64_t T_, int64_t out_, int64_t in_)
      : T(T_), out(out_), in(in_), x(static_cast<size_t>(T_ * in_)), w(static_cast<size_t>(out_ * in_)),
        xs(static_cast<size_t>(T_ * (in_ / 32))), ws(static_cast<size_t>((out_ + 31) / 32 * (in_ / 32))) {
    x.upload(random_codes(x.size()));
    w.upload(random_codes(w.size()));
    xs.upload(random_scales(xs.size(), -12, 4));
    ws.upload(random_scales(ws.size(), -12, 0));
  }
  using Fn = void (*)(const uint8_t*, const float*, int64_t, int64_t, const uint8_t*, const float*, int64_t, float*);
  std::vector<float> run(Fn fn) const {
    gpu::DeviceBuffer<float> y(static_cast<size_t>(T * out));
    y.poison();
    fn(x.get(), xs.get(), T, in, w.get(), ws.get(), out, y.get());
    return y.download();
  }
};

struct Shape {
  int64_t T, out, in;
};

// The kernels compared with the serial one (test names cp_async, tma, ws; --gtest_filter can pick one).
struct Variant {
  const char* name;  // DSV41_FP8_LINEAR_KERNEL's
  const char* test;  // the test's
  Gemm::Fn fn;
};
const Variant kVariants[] = {
    {"pipelined", "cp_async", gpu::fp8_wgmma_pipelined_linear_codes},
    {"pipelined-tma", "tma", gpu::fp8_wgmma_pipelined_tma_linear_codes},
    {"ws", "ws", gpu::fp8_wgmma_ws_linear_codes},
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class PipelinedLinear : public ::testing::TestWithParam<Variant> {};

TEST_P(PipelinedLinear, SameBitsAsTheSerialKernel) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const char* name = GetParam().name;
  const Shape shapes[] = {
      {1, 256, 512},      // decode, 64 columns; whole stages
      {33, 1000, 4192},   // decode, 64 columns; last stage 3 blocks (131), out off the tiles
      {64, 768, 5120},    // decode, 64 columns; 40 stages through the 8-deep ring
      {64, 17000, 256},   // decode, 128 columns (>= one column tile an SM); out off the tiles
      {7, 16901, 160},    // decode, 128 columns; last stage 1 block; out odd
      {65, 333, 160},     // prefill, 2 warpgroups: T just past the decode tile; out odd
      {200, 1000, 4192},  // prefill; last stage 3 blocks
      {300, 130, 96},     // prefill; one stage of 3 blocks
      {129, 256, 128},    // prefill; one stage of 4 blocks
      {128, 128, 32},     // prefill; one block
      {130, 384, 8192},   // prefill; 64 stages through the 6-deep ring
      {257, 520, 1088},   // prefill; last stage 2 blocks (34)
      {1000, 200, 640},   // prefill, 8 row tiles, T and out off the tiles; ws: scales by TMA
      {64, 520, 1056},    // decode, 64 columns; last stage 1 block (33); ws: scales by cp.async
  };
  for (const Shape s : shapes) {
    const Gemm gemm(s.T, s.out, s.in);
    const std::vector<float> serial = gemm.run(gpu::fp8_wgmma_serial_linear_codes);
    int64_t nonzero = 0;
    for (size_t i = 0; i < serial.size(); ++i) {
      ASSERT_TRUE(std::isfinite(serial[i]))
          << "serial output " << i << " of shape " << s.T << "x" << s.out << "x" << s.in;
      nonzero += serial[i] != 0.0f;
    }
    EXPECT_GT(nonzero, 0) << "all outputs zero";
    const std::vector<float> piped = gemm.run(GetParam().fn);
    ASSERT_EQ(serial.size(), piped.size());
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < serial.size(); ++i) {
      if (std::memcmp(&serial[i], &piped[i], sizeof(float)) != 0) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << name << ", shape T " << s.T << " out " << s.out << " in " << s.in
                         << ": first differing output t " << first / s.out << " o " << first % s.out << ": serial "
                         << serial[std::max<int64_t>(first, 0)] << " " << name << " "
                         << piped[std::max<int64_t>(first, 0)];
    std::printf("shape T %lld, out %lld, in %lld: %lld of %zu outputs differ between the serial and %s kernels "
                "(%lld nonzero)\n", static_cast<long long>(s.T), static_cast<long long>(s.out),
                static_cast<long long>(s.in), static_cast<long long>(differ), serial.size(), name,
                static_cast<long long>(nonzero));
  }
}

// Restores DSV41_FP8_LINEAR_KERNEL when the test ends.
class KernelEnv {
 public:
  KernelEnv() {
    const char* v = std::getenv(kName);
    had_ = v != nullptr;
    if (had_) old_ = v;
  }
  ~KernelEnv() { had_ ? setenv(kName, old_.c_str(), 1) : unsetenv(kName); }
  void set(const char* v) const { setenv(kName, v, 1); }
  void clear() const { unsetenv(kName); }

 private:
  static constexpr const char* kName = "DSV41_FP8_LINEAR_KERNEL";
  bool had_ = false;
  std::string old_;
};

INSTANTIATE_TEST_SUITE_P(Loads, PipelinedLinear, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.test); });

TEST(PipelinedLinearSwitch, TheSwitchPicksTheKernel) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const KernelEnv env;
  const Gemm gemm(100, 200, 256);
  const std::vector<float> piped = gemm.run(gpu::fp8_wgmma_pipelined_linear_codes);
  env.set("pipelined");
  EXPECT_EQ(gpu::fp8_linear_kernel(), gpu::Fp8LinearKernel::kPipelined);
  EXPECT_EQ(std::memcmp(gemm.run(gpu::fp8_mma_linear_codes).data(), piped.data(), piped.size() * sizeof(float)), 0);
  env.set("pipelined-tma");
  EXPECT_EQ(gpu::fp8_linear_kernel(), gpu::Fp8LinearKernel::kPipelinedTma);
  EXPECT_EQ(std::memcmp(gemm.run(gpu::fp8_mma_linear_codes).data(), piped.data(), piped.size() * sizeof(float)), 0);
  env.set("ws");
  EXPECT_EQ(gpu::fp8_linear_kernel(), gpu::Fp8LinearKernel::kWs);
  EXPECT_EQ(std::memcmp(gemm.run(gpu::fp8_mma_linear_codes).data(), piped.data(), piped.size() * sizeof(float)), 0);
  env.set("serial");
  EXPECT_EQ(gpu::fp8_linear_kernel(), gpu::Fp8LinearKernel::kSerial);
  env.clear();  // the default: the pipelined kernel on TMA loads
  EXPECT_EQ(gpu::fp8_linear_kernel(), gpu::Fp8LinearKernel::kPipelinedTma);
  EXPECT_EQ(std::memcmp(gemm.run(gpu::fp8_mma_linear_codes).data(), piped.data(), piped.size() * sizeof(float)), 0);
  env.set("fastest");
  EXPECT_THROW(gpu::fp8_linear_kernel(), Error);
  EXPECT_THROW(gemm.run(gpu::fp8_mma_linear_codes), Error);
}

}  // namespace
}  // namespace dsv41::test
