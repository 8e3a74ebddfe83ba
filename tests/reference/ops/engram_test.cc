// reference/ops/engram: the prime test, the layout (released and tiny configs) and multipliers, the
// n-gram hash ids of the oracle's prefill and decode, the history across chunks, the fp8 table
// lookup, and the gated residual against the oracle's engram_out.
//
// Oracle data (golden/oracle, the official model on the tiny config; kernels.h5 for the released
// layout): see golden/README.md. The gate test needs reference::linear (for kv = wkv(rows)); it
// is compiled in when reference/ops/linear.cc exists and skipped with a message otherwise.
#include "reference/ops/engram.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/base.h"
#include "base/error.h"
#include "golden/golden_io.h"
#include "reference/ops/config.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "tests/support/seed.h"

#if __has_include("reference/ops/linear.cc")
#define DSV41_ENGRAM_TEST_HAS_LINEAR 1
#include "reference/ops/linear.h"
#else
#define DSV41_ENGRAM_TEST_HAS_LINEAR 0
#endif

namespace dsv41::reference {
namespace {

using ::testing::HasSubstr;

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";
constexpr int kPrefillTokens = 333;
constexpr int kDecodeSteps = 8;

std::vector<int64_t> i64(const golden::H5File& f, const std::string& item) {
  return f.read<int64_t>(item + "/value").data;
}

std::string layer_name(int l) { return (l < 10 ? "layer0" : "layer") + std::to_string(l); }

// The oracle's token map (stub tokenizer: id // 2) and the prompt.
struct Prompt {
  std::vector<int64_t> token_map, tokens;
  int64_t pad = 0;
};
Prompt load_prompt() {
  const golden::H5File f(kOracle + "prefill.h5");
  Prompt p;
  p.token_map = i64(f, "prefill/state/engram/token_map");
  p.tokens = i64(f, "prefill/tokens");
  p.pad = i64(f, "prefill/state/engram/pad_id").at(0);
  return p;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& v) {
  std::vector<int64_t> out;
  for (const auto& r : v) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// ---- primes ----

// Sieve of Eratosthenes over [lo, hi) (segmented: marks multiples of every p <= sqrt(hi)).
std::vector<uint8_t> sieve_range(uint64_t lo, uint64_t hi) {
  std::vector<uint8_t> is_prime(hi - lo, 1);
  for (uint64_t n = lo; n < std::min<uint64_t>(hi, 2); ++n) is_prime[n - lo] = 0;
  for (uint64_t p = 2; p * p < hi; ++p) {
    uint64_t start = std::max(p * p, (lo + p - 1) / p * p);
    for (uint64_t m = start; m < hi; m += p) is_prime[m - lo] = 0;
  }
  return is_prime;
}

// Miller-Rabin against a sieve on [0, 2e6) and on the window the released layout draws from
// (16,000,000 +- 20,000), plus 64-bit primes and the classic strong pseudoprimes.
TEST(EngramPrimes, MillerRabinAgreesWithSieve) {
  const std::pair<uint64_t, uint64_t> ranges[] = {{0, 2000000}, {15980000, 16020000}};
  int64_t primes_seen = 0;
  for (const auto& [lo, hi] : ranges) {
    const std::vector<uint8_t> sieve = sieve_range(lo, hi);
    for (uint64_t n = lo; n < hi; ++n) {
      ASSERT_EQ(is_prime_u64(n), sieve[n - lo] != 0) << "n = " << n;
      primes_seen += sieve[n - lo];
    }
  }
  EXPECT_EQ(primes_seen,
            148933 + 2403);  // pi(2e6) = 148933; 2403 primes in the window (numpy sieve)
  EXPECT_TRUE(is_prime_u64(2305843009213693951ull));    // 2^61 - 1
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));   // largest prime below 2^64
  EXPECT_FALSE(is_prime_u64(18446744073709551615ull));  // 2^64 - 1
  EXPECT_FALSE(is_prime_u64(3215031751ull));            // strong pseudoprime to bases 2, 3, 5, 7
  EXPECT_FALSE(is_prime_u64(3825123056546413051ull));   // strong pseudoprime to bases 2..23
  EXPECT_FALSE(is_prime_u64(561));                      // Carmichael number
}

TEST(EngramPrimes, NextUnusedPrimeSkipsUsedPrimes) {
  EXPECT_EQ(next_unused_prime(299, {}), 307);
  EXPECT_EQ(next_unused_prime(299, {307, 311}), 313);
  EXPECT_EQ(next_unused_prime(307, {}), 311);  // strictly above the start
  EXPECT_EQ(next_unused_prime(15999999, {}), 16000057);
}

// ---- layout ----

// kernels.h5 engram_released: the released config (layers 1 and 14, compressed vocab 99092).
TEST(EngramLayout, ReleasedConfigMatchesOracle) {
  const EngramLayout l = EngramLayout::build(load_config("full"));
  const golden::H5File f(kOracle + "kernels.h5");
  ASSERT_EQ(l.layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(flatten(l.multipliers), i64(f, "engram_released/multipliers"));
  EXPECT_EQ(flatten(l.primes), i64(f, "engram_released/primes"));
  EXPECT_EQ(flatten(l.offsets), i64(f, "engram_released/offsets"));
  EXPECT_EQ(l.rows, i64(f, "engram_released/rows"));
  EXPECT_EQ(l.rows, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(l.n_cols(), 24);
}

// prefill.h5 prefill/state/engram: the tiny config (layers 1 and 4, compressed vocab 512).
TEST(EngramLayout, TinyConfigMatchesOracle) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const golden::H5File f(kOracle + "prefill.h5");
  ASSERT_EQ(l.layer_ids, (std::vector<int>{1, 4}));
  EXPECT_EQ(flatten(l.multipliers), i64(f, "prefill/state/engram/multipliers"));
  EXPECT_EQ(flatten(l.primes), i64(f, "prefill/state/engram/primes"));
  EXPECT_EQ(flatten(l.offsets), i64(f, "prefill/state/engram/offsets"));
  EXPECT_EQ(l.rows, (std::vector<int64_t>{4064, 4944}));
  EXPECT_EQ(l.layer_index(4), 1);
  EXPECT_THROW(l.layer_index(2), Error);
}

TEST(EngramLayout, TableSizeMismatchIsAnError) {
  ModelConfig c = load_config("tiny");
  c.engram_num_embeddings[1] += 1;
  try {
    EngramLayout::build(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("engram layer 4"));
    EXPECT_THAT(e.what(), HasSubstr("4944"));
    EXPECT_THAT(e.what(), HasSubstr("4945"));
  }
}

TEST(EngramLayout, NoEngramLayersGiveAnEmptyLayout) {
  ModelConfig c = load_config("tiny");
  c.engram_layer_ids.clear();
  c.engram_num_embeddings.clear();
  const EngramLayout l = EngramLayout::build(c);
  EXPECT_EQ(l.n_layers(), 0);
  EXPECT_TRUE(l.primes.empty());
}

// ---- hash ids ----

// An independent statement of the hash: for each order n, the n-gram's slots s < n hold the id at
// p - s unless a slot at or after it (toward the past) is out of the sequence or DEAD; the hash
// is the XOR of slot * multiplier over s < n.
int64_t direct_hash_id(const EngramLayout& l, int li, const std::vector<int64_t>& ids, int64_t pad,
                       int64_t p, int order, int head) {
  int64_t h = 0;
  for (int s = 0; s < order; ++s) {
    bool blocked = false;
    for (int r = 0; r <= s; ++r)
      blocked = blocked || p - r < 0 || ids[static_cast<size_t>(p - r)] == kEngramDead;
    const int64_t tok = blocked ? pad : ids[static_cast<size_t>(p - s)];
    h ^= tok * l.multipliers[static_cast<size_t>(li)][static_cast<size_t>(s)];
  }
  const size_t col = static_cast<size_t>((order - 2) * l.n_heads + head);
  return h % l.primes[static_cast<size_t>(li)][col] + l.offsets[static_cast<size_t>(li)][col];
}

TEST(EngramHash, PrefillMatchesOracle) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const Prompt p = load_prompt();
  EngramHistory history(p.pad);
  history.write(0, engram_compress_tokens(p.token_map, p.tokens));
  const golden::H5File f(kOracle + "prefill.h5");
  EXPECT_EQ(history.ids(), i64(f, "prefill/state/engram_compressed_token_cache"));
  for (int layer : {1, 4}) {
    const Tensor<int64_t> ids =
        engram_hash_ids(l, l.layer_index(layer), history, 0, kPrefillTokens);
    const std::vector<int64_t> want = i64(f, "prefill/" + layer_name(layer) + "/engram_hash_ids");
    ASSERT_EQ(ids.data().size(), want.size());
    int64_t equal = 0;
    for (size_t i = 0; i < want.size(); ++i) equal += ids.data()[i] == want[i];
    std::printf("[engram] prefill layer %d hash ids: %lld/%zu equal\n", layer,
                static_cast<long long>(equal), want.size());
    EXPECT_EQ(equal, static_cast<int64_t>(want.size()));
  }
}

// decode.h5: 8 one-token steps at positions 333..340 continue the prefill's history.
TEST(EngramHash, DecodeStepsContinueTheHistory) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const Prompt p = load_prompt();
  EngramHistory history(p.pad);
  history.write(0, engram_compress_tokens(p.token_map, p.tokens));
  const golden::H5File f(kOracle + "decode.h5");
  for (int step = 0; step < kDecodeSteps; ++step) {
    const std::string s = "decode/step" + std::to_string(step) + "/";
    const std::vector<int64_t> token = i64(f, s + "input_token");
    ASSERT_EQ(token.size(), 1u);
    const int64_t pos = kPrefillTokens + step;
    history.write(pos, engram_compress_tokens(p.token_map, token));
    for (int layer : {1, 4}) {
      const Tensor<int64_t> ids = engram_hash_ids(l, l.layer_index(layer), history, pos, 1);
      EXPECT_EQ(ids.data(), i64(f, s + layer_name(layer) + "/engram_hash_ids"))
          << "step " << step << " layer " << layer;
    }
  }
  EXPECT_EQ(history.ids(), i64(f, "decode/final_state/engram_compressed_token_cache"));
}

// Any split of the sequence into chunks (prefill chunks, decode steps) gives the ids of one pass,
// and they equal the direct statement of the hash, DEAD positions included.
TEST(EngramHash, ChunkedEqualsOnePassAndDirectDefinition) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const Prompt p = load_prompt();
  std::mt19937_64 rng(test::seed_for("engram/chunks/tokens=333"));
  std::vector<uint8_t> live(p.tokens.size(), 1);
  for (int64_t t : {0, 7, 8, 150, 151, 152, 332}) live[static_cast<size_t>(t)] = 0;  // image spans
  const std::vector<int64_t> ids = engram_compress_tokens(p.token_map, p.tokens, live);
  EXPECT_EQ(ids[7], kEngramDead);
  for (int li = 0; li < l.n_layers(); ++li) {
    EngramHistory whole(p.pad);
    whole.write(0, ids);
    const Tensor<int64_t> want = engram_hash_ids(l, li, whole, 0, kPrefillTokens);
    EngramHistory chunked(p.pad);
    int64_t pos = 0;
    while (pos < kPrefillTokens) {
      const int64_t n =
          std::min<int64_t>(kPrefillTokens - pos, 1 + static_cast<int64_t>(rng() % 40));
      chunked.write(pos, std::vector<int64_t>(ids.begin() + pos, ids.begin() + pos + n));
      const Tensor<int64_t> got = engram_hash_ids(l, li, chunked, pos, n);
      for (int64_t t = 0; t < n; ++t)
        for (int c = 0; c < l.n_cols(); ++c)
          ASSERT_EQ(got.at(t, c), want.at(pos + t, c)) << "layer " << li << " pos " << pos + t;
      pos += n;
    }
    for (int64_t t = 0; t < kPrefillTokens; ++t)
      for (int order = 2; order <= l.max_ngram_size; ++order)
        for (int h = 0; h < l.n_heads; ++h)
          ASSERT_EQ(want.at(t, (order - 2) * l.n_heads + h),
                    direct_hash_id(l, li, ids, p.pad, t, order, h))
              << "layer " << li << " pos " << t << " order " << order << " head " << h;
  }
}

// Slots before the sequence start hold the pad id: prefixing the pad token changes nothing.
TEST(EngramHash, SequenceStartActsLikePadTokens) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const Prompt p = load_prompt();
  const std::vector<int64_t> body = {815, 723, 294, 53, 204};
  std::vector<int64_t> padded = {2, 2, 2};  // token 2 = engram_pad_id
  padded.insert(padded.end(), body.begin(), body.end());
  EngramHistory a(p.pad), b(p.pad);
  a.write(0, engram_compress_tokens(p.token_map, body));
  b.write(0, engram_compress_tokens(p.token_map, padded));
  const Tensor<int64_t> ia = engram_hash_ids(l, 0, a, 0, 5);
  const Tensor<int64_t> ib = engram_hash_ids(l, 0, b, 3, 5);
  EXPECT_EQ(ia.data(), ib.data());
}

TEST(EngramHash, BadInputsAreErrors) {
  const EngramLayout l = EngramLayout::build(load_config("tiny"));
  const Prompt p = load_prompt();
  EngramHistory h(p.pad);
  EXPECT_THROW(h.write(1, {3}), Error);   // gap
  EXPECT_THROW(h.write(0, {-2}), Error);  // neither an id nor DEAD
  EXPECT_THROW(engram_compress_tokens(p.token_map, {1024}), Error);
  h.write(0, {3, 600});  // 600 >= compressed vocab 512
  EXPECT_THROW(engram_hash_ids(l, 0, h, 0, 2), Error);
  EXPECT_THROW(engram_hash_ids(l, 0, h, 1, 2), Error);  // beyond the history
  EXPECT_THROW(engram_hash_ids(l, 2, h, 0, 1), Error);  // no such engram layer
}

// ---- lookup ----

// Rows are code * scale (fp32), then bf16, per 32-wide block of a row. Row 0: E4M3 1.0 (0x38) and
// -1.5 (0xBC) with E8M0 2^-3 (0x7C), then 1.0 with 2^0; row 1: 448 (0x7E) with 2^0, then 448 and
// 2^-9 (0x01) with 2^-127 (0x00): 1.75 * 2^-119 (a bf16 normal) and 2^-136 (an fp32 subnormal
// that rounds to 0 in bf16).
TEST(EngramLookup, DequantizesPerBlockAndRoundsToBf16) {
  const int hd = 64;
  std::vector<uint8_t> codes(2 * hd);
  const std::vector<uint8_t> scales = {0x7C, 0x7F, 0x7F, 0x00};
  for (int d = 0; d < hd; ++d) {
    codes[static_cast<size_t>(d)] = d >= 32 ? 0x38 : (d % 2 == 0 ? 0x38 : 0xBC);
    codes[static_cast<size_t>(hd + d)] = (d >= 32 && d % 2 == 1) ? 0x01 : 0x7E;
  }
  const EngramTableRef table = engram_table(codes, scales, 2, hd);
  Tensor<int64_t> ids({1, 2}, std::vector<int64_t>{1, 0}, "ids");
  const Tensor<float> rows = engram_lookup(table, ids);  // columns: row 1, then row 0
  ASSERT_EQ(rows.shape(), (std::vector<int64_t>{1, 2 * hd}));
  EXPECT_EQ(rows.at(0, 0), 448.0f);
  EXPECT_EQ(rows.at(0, 32), std::ldexp(1.75f, -119));
  EXPECT_EQ(f32_bits(rows.at(0, 33)), 0u);  // 2^-136 -> +0 in bf16
  EXPECT_EQ(rows.at(0, hd + 0), 0.125f);
  EXPECT_EQ(rows.at(0, hd + 1), -0.1875f);
  EXPECT_EQ(rows.at(0, hd + 32), 1.0f);
  ids.at(0, 1) = 2;
  EXPECT_THROW(engram_lookup(table, ids), Error);           // id beyond the table
  EXPECT_THROW(engram_table(codes, scales, 3, hd), Error);  // sizes do not match
}

// ---- gate + residual ----

Tensor<float> bf16_tensor(const golden::H5File& f, const std::string& item,
                          std::vector<int64_t> shape) {
  const golden::Array<uint16_t> a = f.read<uint16_t>(item + "/bits");
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = f32_from_bits(static_cast<uint32_t>(a.data[i]) << 16);
  return Tensor<float>(std::move(shape), std::move(v), item);
}

// One engram layer's weights from the oracle's checkpoint.
struct EngramLayerWeights {
  checkpoint::safetensors::Entry table, table_scale;
  std::vector<float> q_weight, k_weight;
#if DSV41_ENGRAM_TEST_HAS_LINEAR
  LinearWeight wkv;
#endif
};

EngramLayerWeights load_engram_weights(const checkpoint::safetensors::SafetensorsFile& w, const ModelConfig& c,
                                       const EngramLayout& l, int layer) {
  const std::string p = "layers." + std::to_string(layer) + ".engram.";
  EngramLayerWeights e;
  e.table = w.get(p + "embed.weight");
  e.table_scale = w.get(p + "embed.scale");
  e.q_weight = w.get(p + "q_weight", DType::kBF16, {c.hc_mult, c.dim}).to_f32();
  e.k_weight = w.get(p + "k_weight", DType::kBF16, {c.hc_mult, c.dim}).to_f32();
#if DSV41_ENGRAM_TEST_HAS_LINEAR
  e.wkv = checkpoint::load_linear(w, p + "wkv", DType::kF8E4M3,
                             int64_t{c.hc_mult + 1} * c.dim, int64_t{l.n_cols()} * l.head_dim);
#else
  (void)l;
#endif
  return e;
}

// Bitwise comparison of two bf16 tensors; prints and returns the number of equal elements.
int64_t count_equal(const Tensor<float>& got, const Tensor<float>& want, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  int64_t equal = 0, nonzero = 0, max_ulp = 0;
  for (size_t i = 0; i < want.data().size(); ++i) {
    EXPECT_FALSE(std::isnan(got.data()[i])) << what << " element " << i;
    nonzero += got.data()[i] != 0.0f;
    const uint32_t a = f32_bits(got.data()[i]) >> 16, b = f32_bits(want.data()[i]) >> 16;
    equal += a == b;
    if (a != b) max_ulp = std::max<int64_t>(max_ulp, std::llabs(static_cast<int64_t>(a) - b));
  }
  EXPECT_GT(nonzero, 0) << what << " is all zero";
  std::printf("[engram] %s: %lld/%zu bf16 bitwise equal, max %lld bf16 ulp\n", what.c_str(),
              static_cast<long long>(equal), want.data().size(), static_cast<long long>(max_ulp));
  return equal;
}

// Prefill: x = the stream entering the engram layer (layer L-1's out_stream), ids = the oracle's
// hash ids, kv = linear(lookup(ids), wkv); the result must be the oracle's engram_out.
TEST(EngramGate, PrefillMatchesOracle) {
#if !DSV41_ENGRAM_TEST_HAS_LINEAR
  GTEST_SKIP() << "reference/ops/linear.cc is not in the tree: kv = wkv(rows) cannot be computed";
#else
  const ModelConfig c = load_config("tiny");
  const EngramLayout l = EngramLayout::build(c);
  const auto w = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  const golden::H5File prefill(kOracle + "prefill.h5");
  const golden::H5File streams(kOracle + "prefill_streams.h5");
  const int64_t T = kPrefillTokens;
  for (int layer : {1, 4}) {
    const EngramLayerWeights e = load_engram_weights(w, c, l, layer);
    const std::vector<int64_t> ids_v =
        i64(prefill, "prefill/" + layer_name(layer) + "/engram_hash_ids");
    const Tensor<int64_t> ids({T, l.n_cols()}, ids_v, "ids");
    const Tensor<float> x = bf16_tensor(streams, "prefill/" + layer_name(layer - 1) + "/out_stream",
                                        {T, c.hc_mult, c.dim});
    const Tensor<float> want =
        bf16_tensor(streams, "prefill/" + layer_name(layer) + "/engram_out", {T, c.hc_mult, c.dim});
    const Tensor<float> kv =
        linear(engram_lookup(checkpoint::engram_table(e.table, e.table_scale), ids), e.wkv);
    const Tensor<float> got = engram_gate_residual(x, kv, e.q_weight, e.k_weight, c.norm_eps);
    const int64_t equal = count_equal(got, want, "prefill " + layer_name(layer) + " engram_out");
    EXPECT_EQ(equal, want.numel());
  }
#endif
}

// Decode steps 0..7: T = 1 per step, x = the step's layer L-1 out_stream.
TEST(EngramGate, DecodeMatchesOracle) {
#if !DSV41_ENGRAM_TEST_HAS_LINEAR
  GTEST_SKIP() << "reference/ops/linear.cc is not in the tree: kv = wkv(rows) cannot be computed";
#else
  const ModelConfig c = load_config("tiny");
  const EngramLayout l = EngramLayout::build(c);
  const auto w = checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  const golden::H5File f(kOracle + "decode.h5");
  for (int layer : {1, 4}) {
    const EngramLayerWeights e = load_engram_weights(w, c, l, layer);
    Tensor<float> got_all({kDecodeSteps, c.hc_mult, c.dim}), want_all(got_all.shape());
    for (int step = 0; step < kDecodeSteps; ++step) {
      const std::string s = "decode/step" + std::to_string(step) + "/";
      const Tensor<int64_t> ids({1, l.n_cols()}, i64(f, s + layer_name(layer) + "/engram_hash_ids"),
                                "ids");
      const Tensor<float> x =
          bf16_tensor(f, s + layer_name(layer - 1) + "/out_stream", {1, c.hc_mult, c.dim});
      const Tensor<float> want =
          bf16_tensor(f, s + layer_name(layer) + "/engram_out", {1, c.hc_mult, c.dim});
      const Tensor<float> kv =
          linear(engram_lookup(checkpoint::engram_table(e.table, e.table_scale), ids), e.wkv);
      const Tensor<float> got = engram_gate_residual(x, kv, e.q_weight, e.k_weight, c.norm_eps);
      std::copy(got.data().begin(), got.data().end(), got_all.row(step, 0));
      std::copy(want.data().begin(), want.data().end(), want_all.row(step, 0));
    }
    const int64_t equal =
        count_equal(got_all, want_all, "decode " + layer_name(layer) + " engram_out");
    EXPECT_EQ(equal, want_all.numel());
  }
#endif
}

// Gates lie in (0, 1); a dead position (live = 0) gets gate 0 and passes through unchanged; a zero
// key gives dot = +0 and, through copysign, z = +sqrt(1e-6): a gate just above 1/2.
TEST(EngramGate, RangeDeadPositionsAndShapes) {
  const int64_t T = 5, hc = 2, dim = 64;
  Tensor<float> x({T, hc, dim}, "x"), kv({T, (hc + 1) * dim}, "kv");
  for (size_t i = 0; i < x.data().size(); ++i) x.data()[i] = float(int(i * 37 % 17) - 8) / 4.0f;
  for (size_t i = 0; i < kv.data().size(); ++i) kv.data()[i] = float(int(i * 53 % 19) - 9) / 8.0f;
  for (int d = 0; d < dim; ++d) kv.at(4, d) = 0.0f;  // token 4, copy 0: key 0 -> dot = +0
  const std::vector<float> qw(hc * dim, 1.0f), kw(hc * dim, 0.5f);
  const std::vector<uint8_t> live = {1, 0, 1, 1, 1};
  const Tensor<float> g = engram_gates(x, kv, qw, kw, 1e-20, live);
  const Tensor<float> out = engram_gate_residual(x, kv, qw, kw, 1e-20, live);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < hc; ++c) {
      if (t == 1) {
        EXPECT_EQ(g.at(t, c), 0.0f);
        for (int d = 0; d < dim; ++d) EXPECT_EQ(out.at(t, c, d), x.at(t, c, d));
      } else {
        EXPECT_GT(g.at(t, c), 0.0f);
        EXPECT_LT(g.at(t, c), 1.0f);
      }
    }
  }
  EXPECT_GT(g.at(4, 0), 0.5f);  // dot = +0: copysign(sqrt(1e-6), +0) = +1e-3
  EXPECT_THROW(engram_gates(x, Tensor<float>({T, hc * dim}, "kv"), qw, kw, 1e-20), Error);
  EXPECT_THROW(engram_gates(x, kv, std::vector<float>(3), kw, 1e-20), Error);
  EXPECT_THROW(engram_gates(x, kv, qw, kw, 1e-20, {1, 1}), Error);
}

}  // namespace
}  // namespace dsv41::reference
