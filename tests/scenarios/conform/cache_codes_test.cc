// tests/scenarios/conform/cache_codes_test.cc: the quantizer-boundary check of the FP4 caches
// (scenarios/conform/conform_cache_codes.h): an order-variant quantizer input inside the chain's
// derived bound is always admissible; a code one step off far from a boundary, or a wrong scale
// byte, is not.
#include "scenarios/conform/conform_cache_codes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "formats/cache_format.h"
#include "reference/ops/config.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::conform {
namespace {

using formats::CacheFormat;
using reference::model::CacheView;

constexpr int kEntries = 8;

struct Case {
  reference::ModelConfig c = reference::load_config_preset("tiny");
  CacheFormat format;
  std::string kind;
  int dim;
  double chain;  // the derived pre-quantisation bound (relative to the entry's max)
  std::vector<float> x;  // [kEntries, dim] the reference's pre-quantisation rows
  explicit Case(CacheFormat f, uint32_t seed) : format(f) {
    kind = f == CacheFormat::kIndexKeysFp4 ? "index_keys" : "compressed_kv";
    dim = f == CacheFormat::kIndexKeysFp4 ? c.index_head_dim : c.head_dim;
    chain = judge::derived_cache_chain_bound(c, "cache." + kind)->bound;
    std::printf("cache codes seed %u (%s, dim %d, chain %g)\n", seed, kind.c_str(), dim, chain);
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    x.resize(static_cast<size_t>(kEntries * dim));
    for (float& v : x) v = g(rng);
  }
  CacheView view(const std::vector<float>& rows) const {
    CacheView v;
    v.kind = kind;
    v.layer = 2;
    v.format = format;
    v.dim = dim;
    v.entries = kEntries;
    v.entry_bytes = formats::entry_bytes(format, dim);
    v.bytes = formats::pack_rows(format, rows, kEntries, dim);
    return v;
  }
  std::vector<CacheWrite> writes() const {
    CacheWrite w;
    w.layer = 2;
    w.format = format;
    for (int e = 0; e < kEntries; ++e) w.entries.push_back(e);
    w.rows = reference::Tensor<float>({kEntries, dim}, x, "rows");
    return {w};
  }
  double excess(const CacheView& port) const {
    const std::vector<reports::MetricRow> rows = cache_code_rows(c, writes(), {view(x)}, {port}, 0, 0);
    EXPECT_EQ(rows.size(), 1u);
    return rows.empty() ? -1.0 : rows[0].value;
  }
};

class CacheCodes : public ::testing::TestWithParam<CacheFormat> {};

TEST_P(CacheCodes, OrderVariantInputsInsideTheChainBoundAreAdmissible) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Case k(GetParam(), seed);
    ASSERT_GT(k.chain, 0.0);
    std::mt19937 rng(seed + 10);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (double frac : {0.1, 0.5, 0.99}) {
      std::vector<float> moved = k.x;
      for (int e = 0; e < kEntries; ++e) {
        double xmax = 0;
        for (int i = 0; i < k.dim; ++i) xmax = std::max(xmax, double(std::fabs(k.x[e * k.dim + i])));
        for (int i = 0; i < k.dim; ++i) moved[e * k.dim + i] = static_cast<float>(k.x[e * k.dim + i] + frac * k.chain * xmax * u(rng));
      }
      const CacheView port = k.view(moved);
      size_t differ = 0;
      for (size_t i = 0; i < port.bytes.size(); ++i) differ += port.bytes[i] != k.view(k.x).bytes[i];
      if (frac > 0.4) {
        EXPECT_GT(differ, 0u) << "the noise must flip codes for the check to mean anything";
      }
      EXPECT_EQ(k.excess(port), 0.0) << "frac " << frac;
    }
  }
}

TEST_P(CacheCodes, ACodeOneStepOffFarFromABoundaryIsNot) {
  const Case k(GetParam(), 7);
  const CacheView clean = k.view(k.x);
  EXPECT_EQ(k.excess(clean), 0.0);
  const std::vector<float> dec = formats::unpack_rows(k.format, clean.bytes, kEntries, k.dim);
  ASSERT_FALSE(std::all_of(dec.begin(), dec.end(), [](float v) { return v == 0.0f; }));
  const float grid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  // Every E2M1 nibble of entry 3 moved one magnitude step up: where the reference's value lies
  // farther than the chain's bound below the rounding boundary it crossed, the check must object.
  const int e = 3;
  double xmax = 0;
  for (int i = 0; i < k.dim; ++i) xmax = std::max(xmax, double(std::fabs(k.x[e * k.dim + i])));
  const double B = k.chain * xmax;
  int far = 0, near = 0;
  for (int64_t byte = e * clean.entry_bytes; byte < (e + 1) * clean.entry_bytes; ++byte) {
    for (int shift : {0, 4}) {
      CacheView trial = clean;
      uint8_t& at = trial.bytes[static_cast<size_t>(byte)];
      const int nib = (at >> shift) & 0xF, m = nib & 0x7;
      if (m == 0 || m == 7) continue;
      at = static_cast<uint8_t>((at & ~(0xF << shift)) | (((nib & 0x8) | (m + 1)) << shift));
      std::vector<float> t;
      try {
        t = formats::unpack_rows(k.format, trial.bytes, kEntries, k.dim);
      } catch (const Error&) {
        continue;
      }
      int changed = -1, count = 0;
      for (int i = 0; i < k.dim; ++i) {
        if (t[e * k.dim + i] != dec[e * k.dim + i]) changed = i, ++count;
      }
      if (count != 1) continue;  // a scale byte, not a code
      const double s = std::fabs(dec[e * k.dim + changed]) / grid[m];
      const double boundary = 0.5 * (grid[m] + grid[m + 1]) * s;
      if (boundary - std::fabs(k.x[e * k.dim + changed]) > 1.01 * B) {
        ++far;
        EXPECT_GT(k.excess(trial), 0.0) << "element " << changed << ": " << boundary - std::fabs(k.x[e * k.dim + changed])
                                        << " below the boundary, chain bound " << B;
      } else {
        ++near;
      }
    }
  }
  std::printf("%d codes moved far from a boundary (flagged), %d near one (admissible, not asserted)\n", far, near);
  EXPECT_GT(far, 4);
}

TEST_P(CacheCodes, AnE8M0ScaleByteOneStepUpIsNotAdmissible) {
  if (GetParam() != CacheFormat::kIndexKeysFp4) {
    GTEST_SKIP() << "E4M3 scales one step apart (1/16 to 1/8) can both be admissible within the chain's bound; "
                    "decoded_block_gain judges a wrong E4M3 scale (the compressed_kv_scale_byte small bug)";
  }
  const Case k(GetParam(), 9);
  const CacheView clean = k.view(k.x);
  // Find a byte whose change moves a whole block of entry 0 by the scale's factor: try each byte of
  // the entry, keep the one that changes every decoded value of some block by one common factor.
  for (int64_t byte = 0; byte < clean.entry_bytes; ++byte) {
    CacheView trial = clean;
    trial.bytes[static_cast<size_t>(byte)] = static_cast<uint8_t>(trial.bytes[static_cast<size_t>(byte)] + 1);
    std::vector<float> a, b;
    try {
      a = formats::unpack_rows(k.format, clean.bytes, kEntries, k.dim);
      b = formats::unpack_rows(k.format, trial.bytes, kEntries, k.dim);
    } catch (const Error&) {
      continue;
    }
    int changed = 0;
    for (int i = 0; i < k.dim; ++i) changed += a[i] != b[i];
    if (changed >= formats::info(k.format).block / 2) {  // a scale byte: most of its block moved
      EXPECT_GT(k.excess(trial), 0.0) << "scale byte " << byte;
      return;
    }
  }
  FAIL() << "no scale byte found";
}

TEST_P(CacheCodes, EntriesWhoseBytesAreNotTheRecordedRowsAreSkipped) {
  const Case k(GetParam(), 11);
  std::vector<float> other = k.x;
  for (float& v : other) v = -v * 3.0f;
  // The reference's own view holds other rows: the entry numbering is not the assumed one.
  const std::vector<reports::MetricRow> rows = cache_code_rows(k.c, k.writes(), {k.view(other)}, {k.view(other)}, 0, 0);
  ASSERT_EQ(rows.size(), 0u);
  EXPECT_EQ(code_excess_tolerance(k.c, "cache." + k.kind).origin, "analytic");
}

INSTANTIATE_TEST_SUITE_P(Fp4, CacheCodes, ::testing::Values(CacheFormat::kIndexKeysFp4, CacheFormat::kCompressedKvFp4));

}  // namespace
}  // namespace dsv41::scenarios::conform
