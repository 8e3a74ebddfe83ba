// tests/cuda/kv_quant_vs_reference_test.cc
//
// The CUDA path of the cache formats (cuda/device.h) against the host formats/ functions, bit for
// bit, with a zero tolerance everywhere:
//   ScalarEncoderSweep.DeviceEqualsHostOnAllInputs/<encoder>
//       the device encoder on all 2^32 fp32 bit patterns == the host encoder.
//   ScalarEncoderSweep.CudaIntrinsicEqualsDeviceExceptDocumented/<encoder>
//       CUDA's own conversion (an independent implementation) on all 2^32 == the device encoder,
//       except on the documented classes of kDocumented (research/numerics.md §0.3, §5), where
//       both sides must give the class's stated codes, and every class must occur.
//   BlockRecipe.PackAndUnpackEqualHost/<format><dim>
//       2^20 random rows (bf16 values, per-row log-normal magnitude, rows of specials, rows of
//       raw fp32 bit patterns): packed bytes, finite flags and unpacked values == the host.
//   BlockRecipe.UnpackOfRandomBytesEqualsHost/<format><dim>
//       unpack of random entry bytes (every (code, scale) pair, NaN codes too) == the host.
// Skips with "no CUDA device" when gpu::device_count() == 0 (CI builds it and skips it).
// Random data: the seed is printed; DSV41_SEED=<n> reproduces a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "base/base.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"

namespace dsv41 {
namespace gpu {
// Readable, build-independent GetParam() text in test names and ctest listings.
void PrintTo(Encoder e, std::ostream* os) { *os << encoder_name(e); }
}  // namespace gpu

namespace {

using formats::CacheFormat;
using gpu::Encoder;

constexpr uint64_t kAllInputs = uint64_t{1} << 32;
constexpr uint64_t kChunk = uint64_t{1} << 28;  // inputs per device sweep
constexpr int64_t kRows = int64_t{1} << 20;     // rows per block-recipe tensor

#define DSV41_SKIP_WITHOUT_DEVICE()                                 \
  do {                                                              \
    if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- parallel host loops ----

// Calls fn(begin, end) on disjoint ranges covering [0, n), one per hardware thread.
void parallel_for(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn) {
  const uint64_t threads = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t step = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (uint64_t b = 0; b < n; b += step) pool.emplace_back(fn, b, std::min(n, b + step));
  for (std::thread& t : pool) t.join();
}

// Count of differences and the first one (lowest index).
struct Mismatches {
  uint64_t count = 0;
  uint64_t first = ~uint64_t{0};
  uint32_t expected = 0;
  uint32_t got = 0;

  void add(uint64_t index, uint32_t want, uint32_t have) {
    if (count++ == 0 || index < first) {
      first = index;
      expected = want;
      got = have;
    }
  }
  void merge(const Mismatches& o) {
    if (o.count == 0) return;
    if (count == 0 || o.first < first) {
      first = o.first;
      expected = o.expected;
      got = o.got;
    }
    count += o.count;
  }
};

// Runs check(i, mismatches) for i in [0, n) on all threads and merges the tallies.
Mismatches parallel_check(uint64_t n,
                          const std::function<void(uint64_t, uint64_t, Mismatches&)>& range) {
  std::vector<Mismatches> parts(std::max(1u, std::thread::hardware_concurrency()) + 1);
  std::vector<std::thread> pool;
  const uint64_t step = (n + parts.size() - 2) / (parts.size() - 1);
  size_t k = 0;
  for (uint64_t b = 0; b < n; b += step, ++k) {
    pool.emplace_back([&, b, k] { range(b, std::min(n, b + step), parts[k]); });
  }
  for (std::thread& t : pool) t.join();
  Mismatches all;
  for (const Mismatches& m : parts) all.merge(m);
  return all;
}

// Page-locked host buffer (fast device-to-host copies).
struct Pinned {
  explicit Pinned(size_t bytes) : p(static_cast<uint8_t*>(gpu::pinned_alloc(bytes))) {}
  ~Pinned() { gpu::pinned_free(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  uint8_t* p;
};

uint32_t code_at(const uint8_t* codes, int code_bytes, uint64_t i) {
  if (code_bytes == 1) return codes[i];
  return codes[2 * i] | (uint32_t{codes[2 * i + 1]} << 8);
}

// ---- scalar encoders ----

uint32_t host_encode(Encoder e, uint32_t bits) {
  const float x = f32_from_bits(bits);
  switch (e) {
    case Encoder::kE2M1:
      return formats::e2m1_encode(x);
    case Encoder::kE4M3Satfinite:
      return formats::e4m3_encode_satfinite(x);
    case Encoder::kE4M3NoSat:
      return formats::E4M3::encode<formats::Round::kNearestEven, formats::Overflow::kSpecial>(x);
    case Encoder::kE8M0Ceil:
      return formats::e8m0_encode_ceil(x);
    case Encoder::kE8M0CeilOfficial:
      return formats::e8m0_ceil_official(x);
    case Encoder::kBf16:
      return formats::bf16_encode(x);
  }
  return ~0u;
}

// Where CUDA's conversion and formats/ differ on purpose. `applies` sees |x|'s bits.
constexpr int kAnyNan = -1;  // CUDA may give any NaN code of the format (payload is CUDA's)
struct Documented {
  Encoder encoder;
  const char* what;
  bool (*applies)(uint32_t abs_bits);
  uint32_t formats_code;  // what formats/ gives on the whole class
  int cuda_code;          // what CUDA gives on the whole class, or kAnyNan
  uint64_t inputs;        // fp32 patterns in the class (both signs)
};
const Documented kDocumented[] = {
    {Encoder::kE8M0CeilOfficial,
     "fp32 subnormal 0 < |t| <= 2^-127: the bit formula gives 2^-126 (0x01), CUDA 2^-127 (0x00)",
     [](uint32_t a) { return a != 0 && a <= 0x00400000u; }, 0x01, 0x00, 2 * 0x400000ull},
    {Encoder::kE8M0CeilOfficial,
     "2^127 < |t| <= Inf: the bit formula gives 0xFF (NaN), CUDA saturates to 0xFE (2^127)",
     [](uint32_t a) { return a > 0x7F000000u && a <= 0x7F800000u; }, 0xFF, 0xFE, 2 * 0x800000ull},
    {Encoder::kE8M0CeilOfficial, "NaN: the bit formula wraps to 0x00, CUDA gives 0xFF (NaN)",
     [](uint32_t a) { return a > 0x7F800000u; }, 0x00, 0xFF, 2 * 0x7FFFFFull},
    {Encoder::kBf16,
     "NaN: formats gives 0x7FC0 (torch's c10::BFloat16), CUDA its own NaN (cuda_bf16.hpp: 0x7FFF)",
     [](uint32_t a) { return a > 0x7F800000u; }, 0x7FC0, kAnyNan, 2 * 0x7FFFFFull},
};

bool is_nan_code(Encoder e, uint32_t c) {
  return e == Encoder::kBf16 ? formats::BF16::is_nan(c) : (c & 0x7F) == 0x7F;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIX64, v);
  return buf;
}

class ScalarEncoderSweep : public ::testing::TestWithParam<Encoder> {};

TEST_P(ScalarEncoderSweep, DeviceEqualsHostOnAllInputs) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Encoder e = GetParam();
  const int cb = gpu::encoder_code_bytes(e);
  gpu::DeviceBuffer<uint8_t> dev(kChunk * cb);
  Pinned codes(kChunk * cb);
  const auto t0 = std::chrono::steady_clock::now();
  Mismatches all;
  uint64_t nonzero = 0;
  for (uint64_t begin = 0; begin < kAllInputs; begin += kChunk) {
    dev.poison();
    gpu::sweep_encoder(e, begin, kChunk, dev.get());
    gpu::copy_to_host(codes.p, dev.get(), kChunk * cb);
    all.merge(parallel_check(kChunk, [&](uint64_t b, uint64_t end, Mismatches& m) {
      for (uint64_t i = b; i < end; ++i) {
        const uint32_t bits = static_cast<uint32_t>(begin + i);
        const uint32_t want = host_encode(e, bits);
        const uint32_t have = code_at(codes.p, cb, i);
        if (want != have) m.add(bits, want, have);
      }
    }));
    for (uint64_t i = 0; i < kChunk; i += 4097) nonzero += code_at(codes.p, cb, i) != 0;
  }
  std::printf("[ sweep    ] %s device vs host: %" PRIu64 " inputs, %" PRIu64
              " mismatches, %.1f s\n",
              gpu::encoder_name(e), kAllInputs, all.count, seconds_since(t0));
  EXPECT_GT(nonzero, 0u) << "device codes are all zero";
  EXPECT_EQ(all.count, 0u) << gpu::encoder_name(e) << ": first mismatch at input bits "
                           << hex(all.first) << " (" << f32_from_bits(uint32_t(all.first))
                           << "): host " << hex(all.expected) << ", device " << hex(all.got);
}

TEST_P(ScalarEncoderSweep, CudaIntrinsicEqualsDeviceExceptDocumented) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Encoder e = GetParam();
  const int cb = gpu::encoder_code_bytes(e);
  std::vector<const Documented*> classes;
  for (const Documented& d : kDocumented) {
    if (d.encoder == e) classes.push_back(&d);
  }
  gpu::DeviceBuffer<uint8_t> dev_fmt(kChunk * cb), dev_cuda(kChunk * cb);
  Pinned fmt(kChunk * cb), cuda(kChunk * cb);
  const auto t0 = std::chrono::steady_clock::now();
  Mismatches undocumented;                         // CUDA != formats outside every class
  std::vector<Mismatches> broken(classes.size());  // a class whose stated codes do not hold
  std::vector<uint64_t> hits(classes.size(), 0);
  std::vector<uint32_t> cuda_codes_seen(classes.size(), ~0u);  // one CUDA code seen per class
  for (uint64_t begin = 0; begin < kAllInputs; begin += kChunk) {
    dev_fmt.poison();
    dev_cuda.poison(0x5A);
    gpu::sweep_encoder(e, begin, kChunk, dev_fmt.get());
    gpu::sweep_cuda_intrinsic(e, begin, kChunk, dev_cuda.get());
    gpu::copy_to_host(fmt.p, dev_fmt.get(), kChunk * cb);
    gpu::copy_to_host(cuda.p, dev_cuda.get(), kChunk * cb);
    std::vector<std::vector<Mismatches>> part_broken;
    std::vector<std::vector<uint64_t>> part_hits;
    const size_t nthreads = std::max(1u, std::thread::hardware_concurrency());
    part_broken.assign(nthreads, std::vector<Mismatches>(classes.size()));
    part_hits.assign(nthreads, std::vector<uint64_t>(classes.size(), 0));
    std::vector<uint32_t> part_seen(nthreads * std::max<size_t>(1, classes.size()), ~0u);
    const uint64_t step = (kChunk + nthreads - 1) / nthreads;
    std::vector<Mismatches> part_undoc(nthreads);
    std::vector<std::thread> pool;
    for (size_t t = 0; t < nthreads; ++t) {
      pool.emplace_back([&, t] {
        const uint64_t end = std::min(kChunk, (t + 1) * step);
        for (uint64_t i = t * step; i < end; ++i) {
          const uint32_t bits = static_cast<uint32_t>(begin + i);
          const uint32_t f = code_at(fmt.p, cb, i);
          const uint32_t c = code_at(cuda.p, cb, i);
          size_t k = 0;
          while (k < classes.size() && !classes[k]->applies(bits & 0x7FFFFFFFu)) ++k;
          if (k == classes.size()) {
            if (f != c) part_undoc[t].add(bits, f, c);
            continue;
          }
          const Documented& d = *classes[k];
          ++part_hits[t][k];
          part_seen[t * classes.size() + k] = c;
          const bool cuda_ok =
              d.cuda_code == kAnyNan ? is_nan_code(e, c) : c == static_cast<uint32_t>(d.cuda_code);
          if (f != d.formats_code || !cuda_ok) part_broken[t][k].add(bits, f, c);
        }
      });
    }
    for (std::thread& th : pool) th.join();
    for (size_t t = 0; t < nthreads; ++t) {
      undocumented.merge(part_undoc[t]);
      for (size_t k = 0; k < classes.size(); ++k) {
        broken[k].merge(part_broken[t][k]);
        hits[k] += part_hits[t][k];
        if (part_seen[t * classes.size() + k] != ~0u) {
          cuda_codes_seen[k] = part_seen[t * classes.size() + k];
        }
      }
    }
  }
  std::printf("[ oracle   ] %s CUDA intrinsic vs device: %" PRIu64 " inputs, %" PRIu64
              " undocumented differences, %zu documented classes, %.1f s\n",
              gpu::encoder_name(e), kAllInputs, undocumented.count, classes.size(),
              seconds_since(t0));
  EXPECT_EQ(undocumented.count, 0u)
      << gpu::encoder_name(e) << ": first undocumented difference at input bits "
      << hex(undocumented.first) << " (" << f32_from_bits(uint32_t(undocumented.first))
      << "): formats " << hex(undocumented.expected) << ", CUDA " << hex(undocumented.got);
  for (size_t k = 0; k < classes.size(); ++k) {
    const Documented& d = *classes[k];
    std::printf("[ oracle   ]   class \"%s\": %" PRIu64 " inputs (stated %" PRIu64 "), %" PRIu64
                " break it; a CUDA code seen: %s\n",
                d.what, hits[k], d.inputs, broken[k].count, hex(cuda_codes_seen[k]).c_str());
    EXPECT_EQ(hits[k], d.inputs) << d.what;
    EXPECT_EQ(broken[k].count, 0u)
        << d.what << ": first break at input bits " << hex(broken[k].first) << ": formats "
        << hex(broken[k].expected) << ", CUDA " << hex(broken[k].got);
  }
}

INSTANTIATE_TEST_SUITE_P(AllEncoders, ScalarEncoderSweep, ::testing::ValuesIn(gpu::kAllEncoders),
                         [](const ::testing::TestParamInfo<Encoder>& info) {
                           return std::string(gpu::encoder_name(info.param));
                         });

// ---- block recipes ----

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("DSV41_SEED");
    const uint64_t s =
        env != nullptr
            ? std::strtoull(env, nullptr, 0)
            : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) %
                  1000000007u;
    std::printf("[ seed     ] DSV41_SEED=%" PRIu64 "%s\n", s, env ? " (from the environment)" : "");
    return s;
  }();
  return seed;
}

uint64_t mix64(uint64_t z) {  // a 64-bit finalizer (xor-shift-multiply), bijective
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Counter-based generator: the stream of a row depends only on (seed, row), so the data do
// not depend on the number of threads.
struct RowRng {
  uint64_t state;
  uint64_t next() { return mix64(state += 0x9E3779B97F4A7C15ull); }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
};

// Values the recipes treat specially: zeros, the amax floors, E2M1/E4M3 ties and limits, the
// main-KV scale saturation (2688), bf16 and fp32 extremes.
const uint32_t kFiniteSpecials[] = {0x00000000u,
                                    0x80000000u,
                                    0x3C400000u /*6*2^-9*/,
                                    0x01C00000u /*6*2^-126*/,
                                    0x38D1B717u /*1e-4*/,
                                    0x3E800000u /*0.25*/,
                                    0x3F400000u /*0.75*/,
                                    0x40200000u /*2.5*/,
                                    0x40A00000u /*5*/,
                                    0x40C00000u /*6*/,
                                    0x43E00000u /*448*/,
                                    0x43E80000u /*464*/,
                                    0x43E80001u /*464+*/,
                                    0x45280000u /*2688*/,
                                    0x45280800u /*2688.5*/,
                                    0x7F7F0000u /*bf16 max*/,
                                    0x7F7FFFFFu /*fp32 max*/,
                                    0x00010000u /*bf16 min subnormal*/,
                                    0x00800000u /*min normal*/,
                                    0x00000001u /*fp32 min subnormal*/,
                                    0x00400000u /*2^-127*/,
                                    0x3F808000u,
                                    0x3F818000u};
const uint32_t kNonFiniteSpecials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                       0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu};

// x: [rows, dim]. Row kinds, 1 in 16 each: special (specials mixed with normal values; half
// of them also NaN/Inf), raw fp32 bit patterns, bf16 values near 2^-125 (the amax floors,
// subnormals), signed zeros; the rest (12 in 16) bf16 values N(0,1) * M with log2(M) ~ N(0, 8)
// per row and a second N(0, 2) binade spread per 32 values.
std::vector<float> make_rows(uint64_t seed, int64_t rows, int dim) {
  std::vector<float> x(static_cast<size_t>(rows) * dim);
  parallel_for(static_cast<uint64_t>(rows), [&](uint64_t r0, uint64_t r1) {
    for (uint64_t r = r0; r < r1; ++r) {
      RowRng rng{mix64(seed ^ mix64(r + 1))};
      float* row = &x[r * dim];
      const uint64_t kind = rng.next() % 16;
      const double log2m = 8.0 * rng.normal();
      double block_m = 1.0;
      for (int i = 0; i < dim; ++i) {
        if (i % 32 == 0) block_m = std::exp2(log2m + 2.0 * rng.normal());
        float v = formats::round_to_bf16(static_cast<float>(block_m * rng.normal()));
        if (kind == 1) {
          v = f32_from_bits(static_cast<uint32_t>(rng.next()));
        } else if (kind == 2) {
          v = formats::round_to_bf16(static_cast<float>(std::exp2(-125.0) * rng.normal()));
        } else if (kind == 3) {
          v = f32_from_bits(static_cast<uint32_t>(rng.next() & 0x80000000u));
        } else if (kind == 0 && rng.next() % 4 == 0) {
          const uint64_t pick = rng.next();
          const bool nonfinite = (r / 16) % 2 == 0 && pick % 8 == 0;
          v = f32_from_bits(nonfinite
                                ? kNonFiniteSpecials[(pick >> 8) % std::size(kNonFiniteSpecials)]
                                : kFiniteSpecials[(pick >> 8) % std::size(kFiniteSpecials)]);
          if ((pick >> 40) & 1) v = -v;
        }
        row[i] = v;
      }
    }
  });
  return x;
}

bool host_pack(CacheFormat f, const float* x, int dim, uint8_t* out) {
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
      return formats::pack_compressed_kv(x, dim, out);
    case CacheFormat::kIndexKeysFp4:
      return formats::pack_index_keys(x, dim, out);
    case CacheFormat::kWindowKvFp8:
      return formats::pack_window_kv(x, dim, out);
    case CacheFormat::kBf16:
      return formats::pack_bf16(x, dim, out);
  }
  return false;
}

void host_unpack(CacheFormat f, const uint8_t* in, int dim, float* out) {
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
      return formats::unpack_compressed_kv(in, dim, out);
    case CacheFormat::kIndexKeysFp4:
      return formats::unpack_index_keys(in, dim, out);
    case CacheFormat::kWindowKvFp8:
      return formats::unpack_window_kv(in, dim, out);
    case CacheFormat::kBf16:
      return formats::unpack_bf16(in, dim, out);
  }
}

// Host unpack of [rows, entry] bytes compared bitwise with the device's [rows, dim] floats.
Mismatches compare_unpack(CacheFormat f, const std::vector<uint8_t>& bytes, int64_t rows, int dim,
                          const std::vector<float>& device_out, uint64_t* nonzero) {
  const int eb = formats::entry_bytes(f, dim);
  std::vector<uint64_t> nz(rows, 0);
  Mismatches m =
      parallel_check(static_cast<uint64_t>(rows), [&](uint64_t r0, uint64_t r1, Mismatches& mm) {
        std::vector<float> want(dim);
        for (uint64_t r = r0; r < r1; ++r) {
          host_unpack(f, &bytes[r * eb], dim, want.data());
          for (int i = 0; i < dim; ++i) {
            const uint32_t w = f32_bits(want[i]);
            const uint32_t h = f32_bits(device_out[r * dim + i]);
            nz[r] += h != 0;
            if (w != h) mm.add(r * dim + i, w, h);
          }
        }
      });
  *nonzero = 0;
  for (uint64_t v : nz) *nonzero += v;
  return m;
}

struct RecipeCase {
  CacheFormat format;
  int dim;
  const char* name;
};
const RecipeCase kRecipeCases[] = {
    {CacheFormat::kCompressedKvFp4, 512, "CompressedKvDim512"},      // released head_dim
    {CacheFormat::kIndexKeysFp4, 128, "IndexKeysDim128"},  // released index_head_dim (68 B entries)
    {CacheFormat::kWindowKvFp8, 512, "WindowKvDim512"},        // released head_dim
    {CacheFormat::kBf16, 512, "Bf16Dim512"},             // uncompressed ablation
    {CacheFormat::kCompressedKvFp4, 128, "CompressedKvDim128"},      // tiny config
    {CacheFormat::kIndexKeysFp4, 64, "IndexKeysDim64"},    // tiny config: 34 B entries, unaligned
    {CacheFormat::kWindowKvFp8, 128, "WindowKvDim128"},        // tiny config
};

void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

class BlockRecipe : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(BlockRecipe, PackAndUnpackEqualHost) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const RecipeCase c = GetParam();
  const int eb = formats::entry_bytes(c.format, c.dim);
  const uint64_t seed = test_seed() ^ mix64(std::hash<std::string>{}(c.name));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> x = make_rows(seed, kRows, c.dim);

  // Host: the formats/ row functions.
  std::vector<uint8_t> want(static_cast<size_t>(kRows) * eb), want_finite(kRows);
  parallel_for(kRows, [&](uint64_t r0, uint64_t r1) {
    for (uint64_t r = r0; r < r1; ++r) {
      want_finite[r] = host_pack(c.format, &x[r * c.dim], c.dim, &want[r * eb]) ? 1 : 0;
    }
  });

  // Device: pack, then unpack what the device packed.
  gpu::DeviceBuffer<float> dx(x.size()), dy(x.size());
  gpu::DeviceBuffer<uint8_t> dpacked(want.size()), dfinite(kRows);
  dx.upload(x);
  dpacked.poison();
  dfinite.poison();
  dy.poison();
  gpu::pack_rows(c.format, dx.get(), kRows, c.dim, dpacked.get(), dfinite.get());
  gpu::unpack_rows(c.format, dpacked.get(), kRows, c.dim, dy.get());
  const std::vector<uint8_t> got = dpacked.download();
  const std::vector<uint8_t> got_finite = dfinite.download();
  const std::vector<float> got_y = dy.download();

  const Mismatches bytes = parallel_check(want.size(), [&](uint64_t b, uint64_t e, Mismatches& m) {
    for (uint64_t i = b; i < e; ++i) {
      if (want[i] != got[i]) m.add(i, want[i], got[i]);
    }
  });
  Mismatches flags;
  uint64_t finite_rows = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    finite_rows += want_finite[r];
    if (want_finite[r] != got_finite[r]) flags.add(r, want_finite[r], got_finite[r]);
  }
  uint64_t nonzero_y = 0;
  const Mismatches values = compare_unpack(c.format, want, kRows, c.dim, got_y, &nonzero_y);
  const uint64_t nonzero_bytes = static_cast<uint64_t>(
      std::count_if(got.begin(), got.end(), [](uint8_t v) { return v != 0; }));

  std::printf("[ recipe   ] %s: %" PRId64 " rows x %d (%d B entries), %" PRIu64
              " finite rows; mismatches: bytes %" PRIu64 ", flags %" PRIu64 ", unpacked %" PRIu64
              "; %.1f s\n",
              c.name, kRows, c.dim, eb, finite_rows, bytes.count, flags.count, values.count,
              seconds_since(t0));
  EXPECT_GT(finite_rows, 0u) << "no finite row: the data miss the main path";
  EXPECT_LT(finite_rows, static_cast<uint64_t>(kRows)) << "no non-finite row";
  EXPECT_GT(nonzero_bytes, 0u) << "packed output is all zero";
  EXPECT_GT(nonzero_y, 0u) << "unpacked output is all zero";
  EXPECT_EQ(bytes.count, 0u) << c.name << ": first byte mismatch at row " << bytes.first / eb
                             << ", byte " << bytes.first % eb << ": host " << hex(bytes.expected)
                             << ", device " << hex(bytes.got);
  EXPECT_EQ(flags.count, 0u) << c.name << ": first finite-flag mismatch at row " << flags.first
                             << ": host " << flags.expected << ", device " << flags.got;
  EXPECT_EQ(values.count, 0u) << c.name << ": first unpacked mismatch at row "
                              << values.first / c.dim << ", element " << values.first % c.dim
                              << ": host bits " << hex(values.expected) << ", device bits "
                              << hex(values.got);
}

TEST_P(BlockRecipe, UnpackOfRandomBytesEqualsHost) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const RecipeCase c = GetParam();
  const int eb = formats::entry_bytes(c.format, c.dim);
  const uint64_t seed = test_seed() ^ mix64(std::hash<std::string>{}(c.name) + 1);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint8_t> bytes(static_cast<size_t>(kRows) * eb);
  parallel_for(kRows, [&](uint64_t r0, uint64_t r1) {
    for (uint64_t r = r0; r < r1; ++r) {
      RowRng rng{mix64(seed ^ mix64(r + 1))};
      for (int i = 0; i < eb; ++i) bytes[r * eb + i] = static_cast<uint8_t>(rng.next() >> 56);
    }
  });
  gpu::DeviceBuffer<uint8_t> din(bytes.size());
  gpu::DeviceBuffer<float> dy(static_cast<size_t>(kRows) * c.dim);
  din.upload(bytes);
  dy.poison();
  gpu::unpack_rows(c.format, din.get(), kRows, c.dim, dy.get());
  uint64_t nonzero = 0;
  const Mismatches m = compare_unpack(c.format, bytes, kRows, c.dim, dy.download(), &nonzero);
  std::printf("[ unpack   ] %s random bytes: %" PRId64 " rows, %" PRIu64 " mismatches; %.1f s\n",
              c.name, kRows, m.count, seconds_since(t0));
  EXPECT_GT(nonzero, 0u) << "unpacked output is all zero";
  EXPECT_EQ(m.count, 0u) << c.name << ": first mismatch at row " << m.first / c.dim << ", element "
                         << m.first % c.dim << ": host bits " << hex(m.expected) << ", device bits "
                         << hex(m.got);
}

INSTANTIATE_TEST_SUITE_P(CacheFormats, BlockRecipe, ::testing::ValuesIn(kRecipeCases),
                         [](const ::testing::TestParamInfo<RecipeCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(GpuDevice, ReportsName) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const std::string name = gpu::device_name(0);
  std::printf("[ device   ] %s (of %d)\n", name.c_str(), gpu::device_count());
  EXPECT_FALSE(name.empty());
}

}  // namespace
}  // namespace dsv41
