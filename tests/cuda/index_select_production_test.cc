// tests/cuda/index_select_production_test.cc: the PRODUCTION fused indexer (cuda/index_select.cu,
// backend `cuda`, CudaMode::kProduction, op "indexer") against the reference's selection.
//   1. Random FP4-QDQ queries and packed keys on the tiny config's shape (8 heads, d 64) and the
//      released one (32 heads, d 128), one row to 64 rows (decode-like reach) and prefill-like
//      causal reach, 37 to 16384 keys (clusters of 1 to 8 CTAs): for a plain index layer, the
//      candidate source and a layer inside a random pool, the top-k and the candidate mask equal
//      the reference's as SETS up to the tie rule: each score may move by the head sum's
//      reordering (both sums within gamma_{Hi-1}(u32) times the sum of |terms| of the exact one,
//      plus the final bf16 rounding on both sides); a position whose interval lies above the k-th best's must be chosen, one
//      below must not, inside the band either (the same for blocks: block score = the max of its
//      positions, the newest block pinned). Rows are ascending, -1 exactly past the reach.
//   2. Adversarial ties: zero queries (every score 0) must give exactly the reference's picks (the
//      lowest positions, lowest blocks: the tie rule), and a 3-level grid of values (scores full
//      of exact ties) passes the set rule.
//   3. Inputs the kernel cannot hold exactly (queries off the FP4 grid, a key whose block scales
//      span more than a factor 8) run the composition: the reference's bits, counted as such.
//   5. Key ranges (the merge, cuda/index_select_merge.cu): n > 65536 (65537, 2^17 + 3, 2^18 + 5
//      keys) against the reference as in 1 and, with zero queries, bit for bit against the
//      composition (ties: the lowest positions and blocks win across ranges); and at n <= 65536
//      every chosen split (ranges of 256 to 8192 keys in clusters of 1 to 8 CTAs, fewer candidates
//      per range than k included) gives the default split's top-k and mask bit for bit (the scores
//      are the same bits whatever CTA computes them, and the merge is exact under the same order);
//      so do the switches (IndexSelectArgs::prefetch, ldmatrix, warp_hist, fit_wave), the decode-shaped
//      kernel (IndexSelectArgs::decode, its default and chosen splits), and a ranged call
//      of more than 1024 rows (launched in row chunks that share the workspace).
//   0. On the CPU (no device): the kernel's key encoding (cuda/index_key_codes.h) reproduces the
//      reference's unpacked values from the packed entries bit for bit.
//   4. DSV41_CUDA_PRODUCTION_OPS without `indexer`: index_select is the composition (bit-exact);
//      "all", the default, includes it.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device_tensor.h"
#include "cuda/index_key_codes.h"
#include "cuda/index_select.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "reference/ops/indexer.h"
#include "reference/ops/kv_quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

using formats::CacheFormat;
using reference::IndexSelection;
using reference::IndexSelectSpec;
using reference::Tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();

// kProduction with the indexer on (named explicitly, whatever the default).
const gpu::CudaOps& production_ops() {
  static const gpu::CudaOps* ops = [] {  // lives as long as the test binary
    setenv("DSV41_CUDA_PRODUCTION_OPS", "linear,sparse_attn,indexer", 1);
    const gpu::CudaOps* p = new gpu::CudaOps(gpu::CudaMode::kProduction);
    unsetenv("DSV41_CUDA_PRODUCTION_OPS");
    return p;
  }();
  return *ops;
}

struct Case {
  int64_t T = 0, heads = 0, dim = 0, n = 0;
  Tensor<float> q, w;                 // [T, heads, dim] FP4-QDQ, [T, heads] bf16
  Tensor<uint8_t> keys_dev;           // packed entries on the device
  reference::CacheRows keys;
  std::vector<int64_t> reach;
};

// levels 0: normal values; > 0: integers in [-levels, levels] (many exact ties).
Tensor<float> values(std::vector<int64_t> shape, int levels, const char* name) {
  if (levels == 0) return random_bf16(std::move(shape), 1.0f, name);
  Tensor<float> t(std::move(shape), name);
  std::uniform_int_distribution<int> u(-levels, levels);
  for (float& v : t.data()) v = static_cast<float>(u(rng()));
  return t;
}

Case make_case(int64_t T, int64_t heads, int64_t dim, int64_t n, bool prefill, int levels) {
  Case c;
  c.T = T, c.heads = heads, c.dim = dim, c.n = n;
  c.q = ref_ops().qdq(CacheFormat::kIndexKeysFp4, values({T, heads, dim}, levels, "q"));
  c.w = ref_ops().index_weights(random_bf16({T, heads}, 2.0f, "proj"), static_cast<int>(dim));
  const Tensor<float> rows = values({n, dim}, levels, "keys");
  Tensor<uint8_t> storage({n + 1, formats::entry_bytes(CacheFormat::kIndexKeysFp4, static_cast<int>(dim))}, "ik");
  std::vector<int64_t> entries(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(storage, CacheFormat::kIndexKeysFp4, entries, rows);
  c.keys_dev = cuda_ops().upload(storage);
  c.keys = {CacheFormat::kIndexKeysFp4, dim, n, &c.keys_dev};
  c.reach.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    c.reach[static_cast<size_t>(t)] = prefill ? (t + 1) * n / T : n - (T - 1 - t) / 3;
  }
  return c;
}

Tensor<uint8_t> random_pool(int64_t T, int64_t n) {
  Tensor<uint8_t> m({T, n}, "pool");
  std::bernoulli_distribution b(0.3);
  for (uint8_t& v : m.data()) v = b(rng()) ? 1 : 0;
  return m;
}

double ulp_bf16(double v) {
  const double a = std::fabs(v);
  if (!(a > 0) || !std::isfinite(a)) return 0;
  return std::ldexp(1.0, std::ilogb(a) - 7);
}

// Each score's interval: the reference's score +- (the head sum's reordering + both bf16 roundings).
struct Intervals {
  std::vector<double> lo, hi;  // [T * n]
};
Intervals intervals(const Case& c, const Tensor<uint8_t>* pool) {
  Tensor<float> s = cuda_ops().download(cuda_ops().index_scores(c.q, c.keys, c.w, c.reach));  // the reference's bits
  Tensor<float> absw = c.w;
  for (float& v : absw.data()) v = std::fabs(v);
  const Tensor<float> a = cuda_ops().download(cuda_ops().index_scores(c.q, c.keys, absw, c.reach));  // ~sum |term|
  const double u = std::ldexp(1.0, -24), hm1 = static_cast<double>(c.heads - 1);
  const double gamma = hm1 * u / (1 - hm1 * u);
  Intervals iv;
  iv.lo.resize(static_cast<size_t>(c.T * c.n));
  iv.hi.resize(iv.lo.size());
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t i = static_cast<size_t>(t * c.n + j);
      double v = s.at(t, j);
      if (pool != nullptr && pool->at(t, j) == 0) v = -kInf;
      const double e = std::isfinite(v) ? 2.02 * gamma * a.at(t, j) + 2 * ulp_bf16(std::fabs(v) + gamma * a.at(t, j)) : 0;
      iv.lo[i] = v - e;
      iv.hi[i] = v + e;
    }
  }
  return iv;
}

// Whether `chosen` (item -> picked) is a correct top-k of items with intervals [lo, hi]: fewer than
// k others reach an item's lower end -> picked; k others wholly above its upper end -> not picked.
::testing::AssertionResult set_rule(const std::vector<double>& lo, const std::vector<double>& hi,
                                    const std::vector<bool>& chosen, int64_t k) {
  std::vector<double> his = hi, los = lo;
  std::sort(his.begin(), his.end());
  std::sort(los.begin(), los.end());
  int64_t picked = 0;
  for (size_t i = 0; i < lo.size(); ++i) {
    picked += chosen[i];
    // others with hi >= lo[i] (the item itself counts once when hi[i] >= lo[i])
    const int64_t reach_it = static_cast<int64_t>(his.end() - std::lower_bound(his.begin(), his.end(), lo[i])) - 1;
    const int64_t above = static_cast<int64_t>(los.end() - std::upper_bound(los.begin(), los.end(), hi[i]));
    if (reach_it < k && !chosen[i]) {
      return ::testing::AssertionFailure() << "item " << i << " certainly in the top " << k << " (score interval ["
                                           << lo[i] << ", " << hi[i] << "]) not chosen";
    }
    if (above >= k && chosen[i]) {
      return ::testing::AssertionFailure() << "item " << i << " certainly out (" << above
                                           << " others wholly above) chosen";
    }
  }
  if (picked != k) return ::testing::AssertionFailure() << picked << " picks, want " << k;
  return ::testing::AssertionSuccess();
}

// The production selection of one layer kind against the reference's scores.
void check_layer(const Case& c, const IndexSelectSpec& spec, const std::string& what) {
  const IndexSelection got = production_ops().index_select(c.q, c.keys, c.w, c.reach, spec);
  const Tensor<int32_t> topk = production_ops().download(got.topk);
  const int64_t k = std::min<int64_t>(spec.index_topk, c.n);
  ASSERT_EQ(topk.shape(), (std::vector<int64_t>{c.T, k})) << what;
  const Intervals iv = intervals(c, spec.pool);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t reach = c.reach[static_cast<size_t>(t)];
    std::vector<bool> chosen(static_cast<size_t>(c.n), false);
    int64_t prev = -1, unreachable = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t v = topk.at(t, i);
      if (v == -1) {
        ++unreachable;
        continue;
      }
      ASSERT_TRUE(v > prev && v < reach && unreachable == 0) << what << " row " << t << ": pick " << v << " after "
                                                             << prev << " (reach " << reach << ")";
      prev = v;
      chosen[static_cast<size_t>(v)] = true;
    }
    // The -1 entries stand for positions >= reach: the lowest ones, as the tie rule takes them.
    for (int64_t j = reach; j < reach + unreachable && j < c.n; ++j) chosen[static_cast<size_t>(j)] = true;
    const std::vector<double> lo(iv.lo.begin() + t * c.n, iv.lo.begin() + (t + 1) * c.n);
    const std::vector<double> hi(iv.hi.begin() + t * c.n, iv.hi.begin() + (t + 1) * c.n);
    ASSERT_TRUE(set_rule(lo, hi, chosen, k)) << what << " row " << t << " (reach " << reach << ")";
  }
  if (spec.candidate_topk_blocks <= 0) return;
  const Tensor<uint8_t> mask = production_ops().download(got.candidates);
  ASSERT_EQ(mask.shape(), (std::vector<int64_t>{c.T, c.n})) << what;
  const int64_t bs = spec.candidate_block_size, nb = (c.n + bs - 1) / bs, kb = std::min<int64_t>(spec.candidate_topk_blocks, nb);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t reach = c.reach[static_cast<size_t>(t)];
    std::vector<double> lo(static_cast<size_t>(nb), -kInf), hi(static_cast<size_t>(nb), -kInf);
    std::vector<bool> chosen(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t j = b * bs; j < std::min(c.n, (b + 1) * bs); ++j) {
        lo[static_cast<size_t>(b)] = std::max(lo[static_cast<size_t>(b)], iv.lo[static_cast<size_t>(t * c.n + j)]);
        hi[static_cast<size_t>(b)] = std::max(hi[static_cast<size_t>(b)], iv.hi[static_cast<size_t>(t * c.n + j)]);
        ASSERT_EQ(mask.at(t, j), mask.at(t, b * bs)) << what << ": a block kept in part";
      }
      if (reach > 0 && b == (reach - 1) / bs) lo[static_cast<size_t>(b)] = hi[static_cast<size_t>(b)] = kInf;
      chosen[static_cast<size_t>(b)] = mask.at(t, b * bs) != 0;
    }
    // A chosen block of -inf (a filler) is dropped: count it as chosen if the reference could pick it.
    int64_t kept = 0;
    for (int64_t b = 0; b < nb; ++b) kept += chosen[static_cast<size_t>(b)];
    for (int64_t b = 0; b < nb && kept < kb; ++b) {
      if (!chosen[static_cast<size_t>(b)] && hi[static_cast<size_t>(b)] == -kInf) chosen[static_cast<size_t>(b)] = true, ++kept;
    }
    ASSERT_TRUE(set_rule(lo, hi, chosen, kb)) << what << " blocks of row " << t;
  }
}

IndexSelectSpec plain_spec(int k) {
  IndexSelectSpec s;
  s.index_topk = k;
  return s;
}

void check_kinds(const Case& c, int k, int topk_blocks, const std::string& what) {
  check_layer(c, plain_spec(k), what + " plain");
  IndexSelectSpec source = plain_spec(k);
  source.candidate_topk_blocks = topk_blocks;
  source.candidate_block_size = 8;
  check_layer(c, source, what + " source");
  const Tensor<uint8_t> pool = random_pool(c.T, c.n);
  IndexSelectSpec inside = plain_spec(k);
  inside.pool = &pool;
  check_layer(c, inside, what + " pool");
}

int64_t kernel_calls() {
  const auto counts = production_ops().counts();
  const auto it = counts.find("index_select");
  return it == counts.end() ? 0 : it->second.gpu;
}

// The kernel's key encoding (cuda/index_key_codes.h, host and device) against the reference's
// unpack, on the CPU (no device needed): every channel of every encodable key is code * 2^(s_min -
// 128) exactly, |code| <= 96; keys with all-zero blocks (any scale) and -0 codes encode; a key whose
// nonzero blocks' scales span x16 or more does not.
TEST(IndexKeyCodes, CodesTimesTheKeyExponentAreTheUnpackedValues) {
  for (int64_t dim : {64, 128}) {
    const int64_t n = 400, blocks = dim / 32;
    Tensor<float> rows = random_bf16({n, dim}, 1.0f, "keys");
    for (int64_t i = 0; i < 32; ++i) rows.at(1, i) = 0.0f;                // an all-zero block
    for (int64_t i = 0; i < dim; ++i) rows.at(2, i) = i % 2 ? -0.0f : 0.0f;  // an all-zero key
    for (int64_t i = 0; i < 32; ++i) rows.at(3, i) *= 64.0f;              // scales spanning x64
    for (int64_t i = 32; i < 64; ++i) rows.at(4, i) *= 4.0f;              // x4: still encodable
    Tensor<uint8_t> storage({n, formats::entry_bytes(CacheFormat::kIndexKeysFp4, static_cast<int>(dim))}, "ik");
    std::vector<int64_t> entries(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) entries[static_cast<size_t>(i)] = i;
    reference::write_entries(storage, CacheFormat::kIndexKeysFp4, entries, rows);
    const Tensor<float> want = reference::read_all_entries({CacheFormat::kIndexKeysFp4, dim, n, &storage});
    int64_t encodable = 0;
    for (int64_t key = 0; key < n; ++key) {
      const uint8_t* e = storage.row(key);
      std::vector<std::array<uint32_t, 4>> words(static_cast<size_t>(blocks));
      int smin = 255, smax = 0;
      bool nan = false;
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w[4];
        std::memcpy(w, e + b * 16, 16);
        std::copy(w, w + 4, words[static_cast<size_t>(b)].begin());
        const int s = e[dim / 2 + b];
        nan = nan || s == 255;
        if (gpu::index_key_codes::block_nonzero(w)) smin = std::min(smin, s), smax = std::max(smax, s);
      }
      const bool ok = gpu::index_key_codes::key_encodable(smin, smax, nan);
      if (key == 3) {
        EXPECT_FALSE(ok) << "dim " << dim << ": scales spanning x64 encoded";
        continue;
      }
      ASSERT_TRUE(ok) << "dim " << dim << " key " << key;
      ++encodable;
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w[4], out[8];
        std::copy(words[static_cast<size_t>(b)].begin(), words[static_cast<size_t>(b)].end(), w);
        const int s = e[dim / 2 + b];
        gpu::index_key_codes::expand_block(w, gpu::index_key_codes::block_nonzero(w) ? s - smin : 0, out);
        for (int c = 0; c < 32; ++c) {
          const int8_t code = static_cast<int8_t>((out[c / 4] >> (8 * (c % 4))) & 0xFFu);
          ASSERT_LE(std::abs(static_cast<int>(code)), 96);
          const float got = std::ldexp(static_cast<float>(code), smin - 128);
          ASSERT_EQ(got, want.at(key, b * 32 + c)) << "dim " << dim << " key " << key << " channel " << b * 32 + c;
        }
      }
    }
    EXPECT_EQ(encodable, n - 1);
  }
}

TEST(IndexSelectProduction, RandomSelectionsAreTheReferencesUpToTies) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const int64_t before = kernel_calls();
  struct Shape { int64_t T, heads, dim, n; bool prefill; int k, blocks; };
  for (const Shape& s : std::vector<Shape>{{1, 8, 64, 37, false, 32, 6},
                                           {5, 8, 64, 300, true, 32, 6},
                                           {3, 32, 128, 1000, false, 512, 20},
                                           {64, 32, 128, 16384, false, 512, 2048},
                                           {9, 32, 128, 5000, false, 512, 300},
                                           {256, 32, 128, 2048, true, 512, 100}}) {
    const Case c = make_case(s.T, s.heads, s.dim, s.n, s.prefill, 0);
    check_kinds(c, s.k, s.blocks, "T " + std::to_string(s.T) + " heads " + std::to_string(s.heads) + " n " +
                                      std::to_string(s.n));
  }
  EXPECT_EQ(kernel_calls() - before, 18) << "every call ran the fused kernel";
}

// The candidate source (top-k 512, `blocks` blocks of 8) on c: the production op's top-k and mask
// equal the exact op's bit for bit (zero queries: every score ties, so the picks are the tie rule's).
void expect_source_picks_of_the_exact_op(const Case& c, int blocks, int64_t T, int64_t n) {
  IndexSelectSpec source = plain_spec(512);
  source.candidate_topk_blocks = blocks;
  source.candidate_block_size = 8;
  const IndexSelection want = cuda_ops().index_select(c.q, c.keys, c.w, c.reach, source);
  const IndexSelection got = production_ops().index_select(c.q, c.keys, c.w, c.reach, source);
  EXPECT_TRUE(same_bits(cuda_ops().download(want.topk), got.topk)) << "T " << T << " n " << n;
  EXPECT_TRUE(same_bits(cuda_ops().download(want.candidates), got.candidates)) << "T " << T << " n " << n;
}

// A layer inside a random pool on c: the production op's top-k equals the exact op's bit for bit.
void expect_pool_picks_of_the_exact_op(const Case& c, int64_t T, int64_t n) {
  const Tensor<uint8_t> pool = random_pool(T, n);
  IndexSelectSpec inside = plain_spec(512);
  inside.pool = &pool;
  EXPECT_TRUE(same_bits(cuda_ops().download(cuda_ops().index_select(c.q, c.keys, c.w, c.reach, inside).topk),
                        production_ops().index_select(c.q, c.keys, c.w, c.reach, inside).topk))
      << "pool, T " << T << " n " << n;
}

TEST(IndexSelectProduction, TiesFollowTheTieRule) {
  DSV41_SKIP_WITHOUT_DEVICE();
  // Zero queries: every reachable score is 0, so the picks are exactly the reference's (the tie
  // rule: lowest positions, lowest blocks; the newest block pinned). cuda_ops() is the exact twin.
  for (const auto& [T, n] : std::vector<std::pair<int64_t, int64_t>>{{3, 100}, {64, 16384}, {7, 5000}}) {
    Case c = make_case(T, 32, 128, n, false, 0);
    for (float& v : c.q.data()) v = 0.0f;
    for (int blocks : {6, 2048}) {
      expect_source_picks_of_the_exact_op(c, blocks, T, n);
      expect_pool_picks_of_the_exact_op(c, T, n);
    }
  }
  // A 3-level grid: scores full of exact ties (and the set rule still holds).
  for (const auto& [T, n] : std::vector<std::pair<int64_t, int64_t>>{{4, 700}, {64, 16384}}) {
    const Case c = make_case(T, 32, 128, n, false, 1);
    check_kinds(c, 512, 64, "grid T " + std::to_string(T) + " n " + std::to_string(n));
  }
}

TEST(IndexSelectProduction, InputsTheCodesCannotHoldRunTheComposition) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const auto composed = [] {
    const auto counts = production_ops().counts();
    const auto it = counts.find("index_select (composed: not encodable)");
    return it == counts.end() ? 0 : it->second.gpu;
  };
  // Queries off the FP4 grid (plain bf16: 8 significant bits).
  Case c = make_case(5, 32, 128, 900, false, 0);
  Case off = c;
  off.q = random_bf16({5, 32, 128}, 1.0f, "q");
  int64_t before = composed();
  IndexSelectSpec source = plain_spec(64);
  source.candidate_topk_blocks = 10;
  source.candidate_block_size = 8;
  IndexSelection want = cuda_ops().index_select(off.q, off.keys, off.w, off.reach, source);
  IndexSelection got = production_ops().index_select(off.q, off.keys, off.w, off.reach, source);
  EXPECT_TRUE(same_bits(cuda_ops().download(want.topk), got.topk));
  EXPECT_TRUE(same_bits(cuda_ops().download(want.candidates), got.candidates));
  EXPECT_EQ(composed() - before, 1);
  // A key whose first block is 2^5 times larger than its others (scales span a factor 32).
  Tensor<float> rows = random_bf16({900, 128}, 1.0f, "keys");
  for (int64_t i = 0; i < 32; ++i) rows.at(17, i) *= 32.0f;
  Tensor<uint8_t> storage({900, 68}, "ik");
  std::vector<int64_t> entries(900);
  for (int64_t i = 0; i < 900; ++i) entries[static_cast<size_t>(i)] = i;
  reference::write_entries(storage, CacheFormat::kIndexKeysFp4, entries, rows);
  c.keys_dev = cuda_ops().upload(storage);
  c.keys.bytes = &c.keys_dev;
  before = composed();
  want = cuda_ops().index_select(c.q, c.keys, c.w, c.reach, plain_spec(64));
  got = production_ops().index_select(c.q, c.keys, c.w, c.reach, plain_spec(64));
  EXPECT_TRUE(same_bits(cuda_ops().download(want.topk), got.topk));
  EXPECT_EQ(composed() - before, 1);
  // Inputs the reference rejects raise its error.
  EXPECT_THROW(production_ops().index_select(c.q, c.keys, c.w, std::vector<int64_t>(5, 901), plain_spec(64)), Error);
}

TEST(IndexSelectProduction, WithoutIndexerInTheProductionListItIsTheComposition) {
  DSV41_SKIP_WITHOUT_DEVICE();
  setenv("DSV41_CUDA_PRODUCTION_OPS", "linear,sparse_attn", 1);
  const gpu::CudaOps ops(gpu::CudaMode::kProduction);
  unsetenv("DSV41_CUDA_PRODUCTION_OPS");
  EXPECT_FALSE(ops.production("indexer"));
  EXPECT_TRUE(production_ops().production("indexer"));
  const gpu::CudaOps by_default(gpu::CudaMode::kProduction);  // "all": every production op
  EXPECT_TRUE(by_default.production("indexer"));
  EXPECT_TRUE(by_default.production("sparse_attn"));
  const Case c = make_case(6, 32, 128, 3000, false, 0);
  const IndexSelection got = ops.index_select(c.q, c.keys, c.w, c.reach, plain_spec(512));
  EXPECT_TRUE(same_bits(cuda_ops().download(cuda_ops().index_select(c.q, c.keys, c.w, c.reach, plain_spec(512)).topk),
                        got.topk));
  EXPECT_EQ(ops.counts().count("index_select"), 0u);
}

TEST(IndexSelectProduction, MoreThan65536KeysAreRangedAndMerged) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const int64_t before = kernel_calls();
  struct Shape { int64_t T, heads, dim, n; bool prefill; int k, blocks; };
  for (const Shape& s : std::vector<Shape>{{3, 32, 128, 65537, false, 512, 2048},      // a last range of 1 key
                                           {5, 32, 128, 131075, true, 512, 300},      // 2^17 + 3, causal reach
                                           {2, 8, 64, 262149, false, 64, 50}}) {      // 2^18 + 5, 5 ranges
    const Case c = make_case(s.T, s.heads, s.dim, s.n, s.prefill, 0);
    check_kinds(c, s.k, s.blocks, "ranged T " + std::to_string(s.T) + " n " + std::to_string(s.n));
  }
  EXPECT_EQ(kernel_calls() - before, 9) << "every call ran the fused kernels";
  // Zero queries: every reachable score is 0; the picks are exactly the composition's (the lowest
  // positions and blocks, which lie in the first range: the merge must prefer them to the others').
  for (const auto& [T, n, prefill] : std::vector<std::tuple<int64_t, int64_t, bool>>{{3, 65537, false},
                                                                                      {4, 131075, true}}) {
    Case c = make_case(T, 32, 128, n, prefill, 0);
    for (float& v : c.q.data()) v = 0.0f;
    for (int blocks : {6, 2048}) expect_source_picks_of_the_exact_op(c, blocks, T, n);
    expect_pool_picks_of_the_exact_op(c, T, n);
  }
}

// gpu::index_select on a Case with a chosen split (range_keys, cluster; 0, 0 = the default).
struct Picks {
  std::vector<int32_t> topk;
  std::vector<uint8_t> mask;
};
Picks select_split(const Case& c, const IndexSelectSpec& spec, int64_t range_keys, int64_t cluster,
                   bool prefetch = false, bool fit_wave = false, bool ldmatrix = false, bool warp_hist = false,
                   bool decode = false) {
  const int64_t k = std::min<int64_t>(spec.index_topk, c.n);
  const bool source = spec.candidate_topk_blocks > 0;
  const Tensor<float> q = cuda_ops().upload(c.q), w = cuda_ops().upload(c.w);
  const Tensor<int64_t> reach = cuda_ops().upload(Tensor<int64_t>({c.T}, c.reach, "reach"));
  const Tensor<uint8_t> pool = spec.pool != nullptr ? cuda_ops().upload(*spec.pool) : Tensor<uint8_t>();
  gpu::DeviceBuffer<int32_t> topk(static_cast<size_t>(c.T * k));
  gpu::DeviceBuffer<uint8_t> mask(static_cast<size_t>(source ? c.T * c.n : 1));
  topk.poison();
  mask.poison();
  gpu::IndexSelectArgs a;
  a.q = gpu::dev(q), a.w = gpu::dev(w), a.keys = gpu::dev(c.keys_dev), a.reach = gpu::dev(reach);
  a.pool = spec.pool != nullptr ? gpu::dev(pool) : nullptr;
  a.T = c.T, a.heads = c.heads, a.dim = c.dim, a.n = c.n, a.k = k;
  a.topk_blocks = source ? spec.candidate_topk_blocks : 0, a.block_size = source ? spec.candidate_block_size : 0;
  a.topk = topk.get(), a.mask = source ? mask.get() : nullptr;
  a.range_keys = range_keys, a.cluster = cluster, a.prefetch = prefetch, a.fit_wave = fit_wave, a.ldmatrix = ldmatrix;
  a.warp_hist = warp_hist, a.decode = decode;
  // The decode kernel must really run (its splits here all fit it), not the streaming fallback.
  if (decode) {
    EXPECT_TRUE(gpu::index_select_split(a).decode) << "range_keys " << range_keys << ", cluster " << cluster;
  }
  gpu::DeviceBuffer<uint8_t> ws(static_cast<size_t>(gpu::index_select_workspace_bytes(a)));
  a.workspace = ws.get();
  gpu::index_select(a);
  EXPECT_FALSE(gpu::index_select_flagged(ws.get()));
  return {topk.download(), source ? mask.download() : std::vector<uint8_t>()};
}

TEST(IndexSelectProduction, EverySplitGivesTheSamePicks) {
  DSV41_SKIP_WITHOUT_DEVICE();
  struct Shape { int64_t T, heads, dim, n; bool prefill; int k, blocks, levels; };
  for (const Shape& s : std::vector<Shape>{{64, 32, 128, 16384, false, 512, 2048, 0},
                                           {9, 32, 128, 5000, false, 512, 300, 0},
                                           {67, 32, 128, 2048, true, 512, 100, 0},
                                           {5, 8, 64, 3001, true, 32, 6, 0},
                                           {6, 32, 128, 9000, false, 512, 64, 1},     // exact ties
                                           {1100, 32, 128, 2048, true, 512, 100, 0}}) {  // ranged: 2 row chunks
    const Case c = make_case(s.T, s.heads, s.dim, s.n, s.prefill, s.levels);
    const Tensor<uint8_t> pool = random_pool(c.T, c.n);
    IndexSelectSpec source = plain_spec(s.k), inside = plain_spec(s.k);
    source.candidate_topk_blocks = s.blocks;
    source.candidate_block_size = 8;
    inside.pool = &pool;
    for (const auto& [kind, spec] : std::vector<std::pair<std::string, IndexSelectSpec>>{
             {"plain", plain_spec(s.k)}, {"source", source}, {"pool", inside}}) {
      const std::string what = kind + " T " + std::to_string(s.T) + " n " + std::to_string(s.n);
      const Picks want = select_split(c, spec, 0, 0);
      int64_t real = 0;
      for (int32_t v : want.topk) real += v >= 0;
      ASSERT_GT(real, 0) << what << ": no picks at all";
      const Picks pre = select_split(c, spec, 0, 0, true);  // the prefetching kernel
      EXPECT_EQ(pre.topk, want.topk) << what << ", prefetching";
      EXPECT_EQ(pre.mask, want.mask) << what << " (mask), prefetching";
      const Picks ldsm = select_split(c, spec, 0, 0, false, false, true);  // fragments by ldmatrix
      EXPECT_EQ(ldsm.topk, want.topk) << what << ", ldmatrix";
      EXPECT_EQ(ldsm.mask, want.mask) << what << " (mask), ldmatrix";
      const Picks hist = select_split(c, spec, 0, 0, false, false, false, true);  // warp-aggregated histograms
      EXPECT_EQ(hist.topk, want.topk) << what << ", warp_hist";
      EXPECT_EQ(hist.mask, want.mask) << what << " (mask), warp_hist";
      const Picks fit = select_split(c, spec, 0, 0, true, true, true, true);  // all, clusters fitted to one wave
      EXPECT_EQ(fit.topk, want.topk) << what << ", prefetch + fit_wave + ldmatrix + warp_hist";
      EXPECT_EQ(fit.mask, want.mask) << what << " (mask), prefetch + fit_wave + ldmatrix + warp_hist";
      for (const auto& [R, S] : std::vector<std::pair<int64_t, int64_t>>{{256, 1}, {2048, 1}, {4096, 2}, {8192, 4},
                                                                         {1024, 8}, {16384, 8}}) {
        const Picks got = select_split(c, spec, R, S, R == 4096, false, R == 8192 || R == 256, R == 2048 || R == 256);
        EXPECT_EQ(got.topk, want.topk) << what << ", ranges of " << R << " keys in clusters of " << S;
        EXPECT_EQ(got.mask, want.mask) << what << " (mask), ranges of " << R << " keys in clusters of " << S;
      }
      // The decode-shaped kernel (keys resident per CTA, 16 rows per CTA): its default split and
      // chosen ones (128 to 1024 keys per CTA), with and without warp_hist.
      for (const auto& [R, S] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {256, 1}, {1024, 1}, {2048, 4},
                                                                         {1024, 8}, {4096, 4}, {8192, 8}}) {
        const Picks got = select_split(c, spec, R, S, false, false, false, R == 2048 || R == 256, true);
        EXPECT_EQ(got.topk, want.topk) << what << ", decode kernel, ranges of " << R << " keys in clusters of " << S;
        EXPECT_EQ(got.mask, want.mask) << what << " (mask), decode kernel, ranges of " << R << " keys in clusters of " << S;
      }
      const Picks dec_hist = select_split(c, spec, 0, 0, false, false, false, true, true);
      EXPECT_EQ(dec_hist.topk, want.topk) << what << ", decode kernel + warp_hist";
      EXPECT_EQ(dec_hist.mask, want.mask) << what << " (mask), decode kernel + warp_hist";
    }
  }
  // A split the kernels cannot run is refused with an error.
  const Case c = make_case(2, 8, 64, 1000, false, 0);
  EXPECT_THROW(select_split(c, plain_spec(32), 1000, 3), Error);
}

}  // namespace
}  // namespace dsv41::test
