// reference/model/speculative: the verify-length policies, the accept rule (greedy; sampling with residual
// resampling), rollback and whole rounds on the tiny oracle model (window 64, ratio-2 compressors
// in layers 2 and 4); and reference/model/state_diff, which the rollback checks use. Uses rapidcheck.
// Seeds: the printed data seed (DSV41_SEED=<n>); rapidcheck prints its own (RC_PARAMS="seed=<n>").
// Expected values come from the definitions in reference/model/speculative.h or from the model run one
// token at a time, never from the rule under test.
//
// Distribution preservation (AcceptDraftsSampling): 6 tokens, a target p_t that gives token 5 no
// mass, drafts q that differ (token 5: 0.2). kTrials = 100000 rounds per k in {1, 2}; Pearson
// chi-square of the first emitted token against p_t (5 cells, df 4, critical 33.38) and of the
// first two against p_t(x1) p_t(x2 | x1) (30 cells, df 29, critical 80.44; a round that emits one
// token gets its second from p_t(. | x1), as the next round would); alpha = 1e-6 (boost::math).
// Power: at N = 1e5 the df-4 test rejects, with probability >= 0.99, any first-token law with
// sum (p_w - p_t)^2 / p_t >= 6.2e-4 (non-centrality 62; e.g. 0.011 of mass moved from token 0 to
// token 2). Two wrong rules, run through the same statistic and required to be rejected: the
// rejection resampled from p_t instead of the residual (lambda 5417) and acceptance with
// probability p_t(d) instead of min(1, p_t(d)/q(d)) (lambda 10607); P(miss) < 1e-300 for both. A
// third (the bonus drawn from row k-1) keeps the first token exact: only the k=1 joint test sees it.
// (Accepting with p_t/q "without the min" is no wrong rule: u < 1 accepts exactly as the min does.)
#include "reference/model/speculative.h"
#include "reference/model/state_diff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/non_central_chi_squared.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::reference::model {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using Rows = std::vector<std::vector<double>>;

// ---------------------------------------------------------------- VerifyPolicy
TEST(VerifyPolicyParse, AcceptsTheThreeFormsAndRoundTrips) {
  using K = VerifyPolicy::Kind;
  const struct { const char* spec; K kind; double value; } cases[] = {
      {"fixed:3", K::kFixed, 3},           {"fixed:1", K::kFixed, 1},         {"fixed:64", K::kFixed, 64},
      {"threshold:0.375", K::kThreshold, 0.375}, {"threshold:0", K::kThreshold, 0}, {"survival:0.25", K::kSurvival, 0.25},
      {"survival:1", K::kSurvival, 1}};
  for (const auto& c : cases) {
    for (const VerifyPolicy& p : {VerifyPolicy::parse(c.spec), VerifyPolicy::parse(VerifyPolicy::parse(c.spec).str())}) {
      EXPECT_EQ(p.kind, c.kind) << c.spec;
      EXPECT_EQ(c.kind == K::kFixed ? p.k : p.threshold, c.value) << c.spec << " -> " << p.str();
    }
  }
}

TEST(VerifyPolicyParse, RejectsBadSpecsNamingThem) {
  for (const std::string spec : {"", "fixed", "fixed:", "fixed:0", "fixed:65", "fixed:2.5", "fixed:-1", "fixed:4x",
                                 "threshold:1.5", "threshold:-0.1", "threshold:abc", "survival:nan", "survival:inf",
                                 "greedy:3", ":3", "Fixed:3"}) {
    EXPECT_THAT(error_of([&] { VerifyPolicy::parse(spec); }), HasSubstr("'" + spec + "'")) << spec;
  }
}

std::vector<float> logits_of(const std::vector<double>& c) {  // sigmoid^-1 of each
  std::vector<float> l;
  for (double v : c) l.push_back(static_cast<float>(std::log(v / (1 - v))));
  return l;
}

TEST(VerifyPolicyChoose, FixedCapsAtTheDraftsOffered) {
  const VerifyPolicy p = VerifyPolicy::parse("fixed:3");
  EXPECT_EQ(p.choose({}, 5), 3);
  EXPECT_EQ(p.choose({}, 2), 2);
  EXPECT_EQ(p.choose(logits_of({0.01, 0.01, 0.01, 0.01}), 4), 3);  // confidences do not matter
  EXPECT_EQ(p.choose({}, 0), 0);
}

TEST(VerifyPolicyChoose, ThresholdStopsAtTheFirstConfidenceBelowTauAtLeastOne) {
  const VerifyPolicy p = VerifyPolicy::parse("threshold:0.5");
  EXPECT_EQ(p.choose(logits_of({0.9, 0.8, 0.3, 0.9}), 4), 2);
  EXPECT_EQ(p.choose(logits_of({0.9, 0.6, 0.7, 0.9}), 4), 4);
  EXPECT_EQ(p.choose(logits_of({0.9, 0.6, 0.7, 0.9}), 3), 3);  // capped at n
  EXPECT_EQ(p.choose(logits_of({0.2, 0.9, 0.9}), 3), 1);       // at least one
  EXPECT_EQ(VerifyPolicy::parse("threshold:0.6").choose(logits_of({0.9, 0.8, 0.9, 0.9}), 4), 4);
  EXPECT_THAT(error_of([&] { p.choose(logits_of({0.9}), 2); }), HasSubstr("1 confidence values for 2 drafts"));
}

TEST(VerifyPolicyChoose, SurvivalStopsWhenTheRunningProductFallsBelowSAtLeastOne) {
  // c = 0.9 0.8 0.9 0.9: S = 0.9, 0.72, 0.648, 0.5832 (the threshold rule at 0.6 would take all 4)
  const std::vector<float> c = logits_of({0.9, 0.8, 0.9, 0.9});
  EXPECT_EQ(VerifyPolicy::parse("survival:0.6").choose(c, 4), 3);
  EXPECT_EQ(VerifyPolicy::parse("survival:0.5").choose(c, 4), 4);
  EXPECT_EQ(VerifyPolicy::parse("survival:0.7").choose(c, 4), 2);
  EXPECT_EQ(VerifyPolicy::parse("survival:0.95").choose(c, 4), 1);  // at least one
}

// ---------------------------------------------------------------- accept_drafts, greedy
TEST(AcceptDraftsGreedy, AllAcceptedGivesTheBonusElseTheTargetArgmaxAtTheFirstMismatch) {
  const Rows pt = {{0.1, 0.6, 0.3}, {0.4, 0.2, 0.4}, {0.2, 0.2, 0.6}};  // row 1: tokens 0 and 2 tie
  SampleRng rng(1);
  const Acceptance all = accept_drafts(pt, {1, 0}, {}, /*greedy=*/true, rng);
  EXPECT_EQ(all.accepted, 2);
  EXPECT_EQ(all.next_token, 2);  // the bonus: argmax of row k
  EXPECT_EQ(all.accept_prob, (std::vector<double>{1, 1}));
  const Acceptance a = accept_drafts(pt, {1, 2}, {}, true, rng);  // 2 ties the max, but 0 is the argmax
  EXPECT_EQ(a.accepted, 1);
  EXPECT_EQ(a.next_token, 0);
  EXPECT_EQ(a.accept_prob, (std::vector<double>{1, 0}));
  const Acceptance b = accept_drafts(pt, {2, 0}, {}, true, rng);
  EXPECT_EQ(b.accepted, 0);
  EXPECT_EQ(b.next_token, 1);
}

// ---------------------------------------------------------------- accept_drafts, sampling
constexpr int kV = 6;
constexpr int64_t kTrials = 100000;
constexpr double kAlpha = 1e-6;
const std::vector<double> kP0 = {0.30, 0.05, 0.25, 0.10, 0.30, 0.00};  // target, first position
const std::vector<double> kQ0 = {0.10, 0.30, 0.10, 0.20, 0.10, 0.20};  // draft, first position
const std::vector<double> kP1 = {0.35, 0.05, 0.15, 0.20, 0.10, 0.15};  // later positions, rotated
const std::vector<double> kQ1 = {0.05, 0.40, 0.10, 0.05, 0.30, 0.10};
std::vector<double> rotated(const std::vector<double>& p, int64_t by) {
  std::vector<double> q(p.size());
  for (size_t i = 0; i < p.size(); ++i) q[(i + static_cast<size_t>(by)) % p.size()] = p[i];
  return q;
}
std::vector<double> p1(int64_t x1) { return rotated(kP1, x1); }                  // p_t(. | x1)
std::vector<double> q1(int64_t x1) { return rotated(kQ1, x1 + 2); }              // q(. | x1)
std::vector<double> p2(int64_t x1, int64_t x2) { return rotated(kP1, 3 * x1 + x2); }

// The rule of speculative.h restated, with a flaw to plant: emits d_1..d_m, next.
enum class Flaw { kNone, kResampleFromTarget, kAcceptWithTargetProb, kBonusFromPreviousRow };
std::vector<int64_t> restated_rule(const Rows& pt, const std::vector<int64_t>& d, const Rows& q, SampleRng& rng, Flaw f) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < d.size(); ++i) {
    const auto x = static_cast<size_t>(d[i]);
    const double prob = f == Flaw::kAcceptWithTargetProb ? pt[i][x] : std::min(1.0, pt[i][x] / std::max(q[i][x], 1e-8));
    if (!(rng.uniform() < prob)) {
      std::vector<double> res(pt[i].size());
      double mass = 0;
      for (size_t j = 0; j < res.size(); ++j) mass += res[j] = std::max(0.0, pt[i][j] - q[i][j]);
      out.push_back(sample_from(mass > 0 && f != Flaw::kResampleFromTarget ? res : pt[i], rng));
      return out;
    }
    out.push_back(d[i]);
  }
  out.push_back(sample_from(f == Flaw::kBonusFromPreviousRow ? pt[d.size() - 1] : pt.back(), rng));
  return out;
}

struct Chi2 {
  double stat = 0, critical = 0;
  int df = 0;
  bool rejected() const { return !(stat < critical); }
};
// Pearson's statistic over the cells with mass; a count in a cell without mass is infinite.
Chi2 chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  Chi2 c;
  int cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      if (counts[i] > 0) c.stat = INFINITY;
      continue;
    }
    const double e = static_cast<double>(n) * p[i], d = static_cast<double>(counts[i]) - e;
    c.stat += d * d / e;
    ++cells;
  }
  c.df = cells - 1;
  c.critical = boost::math::quantile(boost::math::complement(boost::math::chi_squared(c.df), kAlpha));
  return c;
}

// kTrials rounds with k drafts; the first token's and the first two tokens' chi-square.
std::pair<Chi2, Chi2> run_rounds(int k, Flaw flaw, uint64_t seed) {
  SampleRng draft(seed), accept(seed ^ 0xACCE97), extra(seed ^ 0xE47A);
  std::vector<int64_t> first(kV, 0), joint(kV * kV, 0);
  std::vector<double> want_joint(kV * kV);
  for (int64_t a = 0; a < kV; ++a) {
    for (int64_t b = 0; b < kV; ++b) want_joint[static_cast<size_t>(a * kV + b)] = kP0[size_t(a)] * p1(a)[size_t(b)];
  }
  for (int64_t t = 0; t < kTrials; ++t) {
    std::vector<int64_t> d = {sample_from(kQ0, draft)};
    Rows pt = {kP0, p1(d[0])}, q = {kQ0};
    if (k == 2) {
      d.push_back(sample_from(q1(d[0]), draft));
      pt.push_back(p2(d[0], d[1]));
      q.push_back(q1(d[0]));
    }
    std::vector<int64_t> out;
    if (flaw == Flaw::kNone) {
      const Acceptance a = accept_drafts(pt, d, q, /*greedy=*/false, accept);
      out.assign(d.begin(), d.begin() + a.accepted);
      out.push_back(a.next_token);
    } else {
      out = restated_rule(pt, d, q, accept, flaw);
    }
    if (out.size() == 1) out.push_back(sample_from(p1(out[0]), extra));  // what the next round emits
    ++first[static_cast<size_t>(out[0])];
    ++joint[static_cast<size_t>(out[0] * kV + out[1])];
  }
  return {chi_square(first, kP0, kTrials), chi_square(joint, want_joint, kTrials)};
}

TEST(AcceptDraftsSampling, MatchesTheRuleOfTheHeaderDrawForDraw) {
  SampleRng draft(test::seed_for("accept/restated")), a(7), b(7);
  for (int t = 0; t < 20000; ++t) {
    std::vector<int64_t> d = {sample_from(kQ0, draft)};
    d.push_back(sample_from(q1(d[0]), draft));
    const Rows pt = {kP0, p1(d[0]), p2(d[0], d[1])}, q = {kQ0, q1(d[0])};
    const Acceptance x = accept_drafts(pt, d, q, false, a);
    std::vector<int64_t> got(d.begin(), d.begin() + x.accepted);
    got.push_back(x.next_token);
    ASSERT_EQ(got, restated_rule(pt, d, q, b, Flaw::kNone)) << "trial " << t;
    ASSERT_EQ(x.accept_prob.size(), static_cast<size_t>(std::min<int64_t>(x.accepted + 1, 2)));
    ASSERT_EQ(x.accept_prob[0], std::min(1.0, kP0[size_t(d[0])] / kQ0[size_t(d[0])]));
  }
}

TEST(AcceptDraftsSampling, EmittedTokensAreDistributedAsTheTargetForK1AndK2) {
  const uint64_t seed = test::seed_for("accept/chi_square");
  std::printf("[dsv41] accept_drafts chi-square seed %llu, %lld rounds per k\n", (unsigned long long)seed,
              (long long)kTrials);
  for (int k : {1, 2}) {
    const auto [first, joint] = run_rounds(k, Flaw::kNone, seed + static_cast<uint64_t>(k));
    std::printf("[dsv41] k=%d: first token chi2 %.2f (df %d, critical %.2f); first two chi2 %.2f (df %d, critical %.2f)\n",
                k, first.stat, first.df, first.critical, joint.stat, joint.df, joint.critical);
    EXPECT_FALSE(first.rejected()) << "k=" << k;
    EXPECT_FALSE(joint.rejected()) << "k=" << k;
  }
}

// The exact first-token law of a wrong rule, for the power statement.
std::vector<double> wrong_first_token_law(Flaw f) {
  std::vector<double> accept(kV), res(kV), law(kV);
  double accepted = 0, res_mass = 0;
  for (size_t x = 0; x < kV; ++x) {
    accept[x] = kQ0[x] * (f == Flaw::kAcceptWithTargetProb ? kP0[x] : std::min(1.0, kP0[x] / kQ0[x]));
    accepted += accept[x];
    res_mass += res[x] = std::max(0.0, kP0[x] - kQ0[x]);
  }
  for (size_t x = 0; x < kV; ++x) {
    law[x] = accept[x] + (1 - accepted) * (f == Flaw::kResampleFromTarget ? kP0[x] : res[x] / res_mass);
  }
  return law;
}

TEST(AcceptDraftsSampling, TheSameChiSquareTestRejectsWrongRules) {
  const uint64_t seed = test::seed_for("accept/power");
  for (Flaw f : {Flaw::kResampleFromTarget, Flaw::kAcceptWithTargetProb}) {
    const std::vector<double> law = wrong_first_token_law(f);
    double lambda = 0;
    for (size_t x = 0; x < kV; ++x) {
      if (kP0[x] > 0) lambda += static_cast<double>(kTrials) * (law[x] - kP0[x]) * (law[x] - kP0[x]) / kP0[x];
    }
    const Chi2 ref = chi_square(std::vector<int64_t>(kV, 0), kP0, 1);  // df and critical value
    const double miss = boost::math::cdf(boost::math::non_central_chi_squared(ref.df, lambda), ref.critical);
    std::printf("[dsv41] wrong rule %d: lambda %.0f, P(not rejected) %.3g\n", static_cast<int>(f), lambda, miss);
    EXPECT_LT(miss, 1e-9) << "the test lost its power: raise kTrials";
  }
  for (int k : {1, 2}) {
    for (Flaw f : {Flaw::kResampleFromTarget, Flaw::kAcceptWithTargetProb, Flaw::kBonusFromPreviousRow}) {
      const auto [first, joint] = run_rounds(k, f, seed + static_cast<uint64_t>(k));
      std::printf("[dsv41] k=%d wrong rule %d: first token chi2 %.1f, first two chi2 %.1f (critical %.2f, %.2f)\n", k,
                  static_cast<int>(f), first.stat, joint.stat, first.critical, joint.critical);
      // The bonus flaw leaves the first token exact, and for k = 2 the first two.
      EXPECT_EQ(first.rejected(), f != Flaw::kBonusFromPreviousRow) << "k=" << k << " flaw " << int(f);
      EXPECT_EQ(joint.rejected(), f != Flaw::kBonusFromPreviousRow || k == 1) << "k=" << k << " flaw " << int(f);
    }
  }
}

// ---------------------------------------------------------------- the model
const Model& model() { return *test::oracle_model().model; }
int64_t vocab() { return test::oracle_model().config.vocab_size; }

// Feeds `tokens` one at a time (forward_chunk with one token each); the logits after each.
std::vector<std::vector<float>> one_by_one(ModelState& s, const std::vector<int64_t>& tokens) {
  std::vector<std::vector<float>> rows;
  for (int64_t t : tokens) rows.push_back(model().forward_chunk(s, {t}).logits);
  return rows;
}
int64_t argmax(const std::vector<float>& l) { return argmax_token(l.data(), static_cast<int64_t>(l.size())); }
bool same_bits(const float* a, const std::vector<float>& b) { return std::memcmp(a, b.data(), b.size() * 4) == 0; }
bool finite_not_all_zero(const std::vector<float>& l) {
  return std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); }) &&
         std::any_of(l.begin(), l.end(), [](float v) { return v != 0; });
}

SpeculativeOptions greedy_fixed(int k) { return {VerifyPolicy::parse("fixed:" + std::to_string(k)), {}, {}}; }
std::string hex(int v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}

// ---- first_state_difference
TEST(StateDiff, EqualStatesAndStaleBytesGiveEmptyEveryStateByteIsNamed) {
  ModelState a = model().new_state();
  model().forward_chunk(a, test::oracle_tokens(0, 37));  // odd: a pending ratio-2 slot; slots 37.. empty
  ASSERT_EQ(first_state_difference(a, a), "");
  const auto changed = [&a](auto&& plant) {
    ModelState b = a;
    plant(b);
    return first_state_difference(a, b);
  };
  // Stale: an empty ring slot, the compressor's non-pending slot.
  EXPECT_EQ(changed([](ModelState& b) { b.layers[3].window_kv.bytes.data().back() ^= 1; }), "");
  EXPECT_EQ(changed([](ModelState& b) { b.layers[2].compressor->kv.row(1)[0] += 1; }), "");
  // State.
  const uint8_t ring = a.layers[3].window_kv.bytes.row(5)[7];
  EXPECT_EQ(changed([](ModelState& b) { b.layers[3].window_kv.bytes.row(5)[7] ^= 0x10; }),
            "layer 3 window_kv: slot 5 (position 5) differs at byte offset 7 of " +
                std::to_string(a.layers[3].window_kv.entry_bytes()) + ": " + hex(ring) + " vs " + hex(ring ^ 0x10));
  EXPECT_THAT(changed([](ModelState& b) { b.layers[0].window_kv.positions[40] = 40; }),
              HasSubstr("layer 0 window_kv: slot 40 holds position -1 vs 40"));
  EXPECT_THAT(changed([](ModelState& b) { reinterpret_cast<uint8_t*>(b.layers[4].compressor->score.row(0))[9] ^= 1; }),
              HasSubstr("layer 4 compressor: pending score row 0 (position 36) differs at byte offset 9 of " +
                        std::to_string(a.layers[4].compressor->dim * 4)));
  EXPECT_THAT(changed([](ModelState& b) { b.layers[2].compressor->next_pos += 1; }), HasSubstr("layer 2 compressor next_pos"));
  for (const char* cache : {"compressed_kv", "index_keys"}) {
    const bool kv = std::string(cache) == "compressed_kv";
    const PackedCache& c = kv ? *a.layers[4].compressed_kv : *a.layers[4].index_keys;
    std::vector<uint8_t> bytes(c.entry(0), c.entry(0) + c.size() * c.entry_bytes());
    bytes[static_cast<size_t>(11 * c.entry_bytes() + 3)] ^= 0x22;  // a code byte of entry 11
    const auto restore = [&](int64_t n) {
      return [&, n](ModelState& b) { (kv ? *b.layers[4].compressed_kv : *b.layers[4].index_keys).restore(bytes.data(), n); };
    };
    EXPECT_THAT(changed(restore(c.size())), HasSubstr(std::string("layer 4 ") + cache +
                                                      ": entry 11 (compressed position 11) differs at byte offset 3"));
    EXPECT_THAT(changed(restore(c.size() - 1)), HasSubstr(std::string("layer 4 ") + cache + " entry count (size) differs: " +
                                                          std::to_string(c.size()) + " vs " + std::to_string(c.size() - 1)));
  }
  EXPECT_THAT(changed([](ModelState& b) { b.engram.write(36, {b.engram.at(36) + 1}); }), HasSubstr("Engram history: position 36"));
  EXPECT_THAT(changed([](ModelState& b) { b.recent_tokens[3] = -7; }), HasSubstr("recent tokens: slot 3"));
  EXPECT_THAT(changed([](ModelState& b) { b.pos = 36; }), HasSubstr("pos differs: 37 vs 36"));
}

// ---- rollback, greedy
// Rounds on the tiny oracle model with drafts = the model's own greedy tokens, corrupted at a
// chosen position, so m is chosen: m = 0, m = k, 0 < m < k in turn (k in 1..4 and m random within
// that). After each round the state must equal decoding [c, d_1..d_m] one token at a time, and the
// accepted rows' logits those of that decoding. 4 prompts x 6 rounds, prompt lengths from the data
// seed: early (1..8: the ring not yet full), at the first ring wrap (60..63; its first round has
// k = 4 and m <= 63 - L, so rejected positions >= 64 overwrite live slots and must be restored),
// past it (118..126: every write overwrites a live slot; the rounds run on past 128) and anywhere
// (1..140). Ratio-2 compressors (layers 2, 4): the counts printed check that rejected positions
// completed groups (compressed_kv / index_keys entries to drop), that rollbacks left 0 and 1
// pending tokens, and that rejected writes overwrote live ring slots.
TEST(SpeculativeRollback, StateAndAcceptedLogitsEqualOneTokenDecodingAcrossGroupAndRingBoundaries) {
  const uint64_t seed = test::seed_for("rollback/greedy");
  std::printf("[dsv41] rollback seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int64_t W = test::oracle_model().config.window_size;
  struct Range { int64_t lo, hi; };
  int rounds = 0, rejected_group = 0, pending[2] = {0, 0}, ring_live_overwritten = 0, wrap_in_round = 0, m0 = 0,
      mmid = 0, mk = 0;
  for (const Range range : {Range{1, 8}, Range{60, 63}, Range{118, 126}, Range{1, 140}}) {
    const int64_t L = range.lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(range.hi - range.lo + 1));
    ModelState spec = model().new_state();
    int64_t c = argmax(model().forward_chunk(spec, test::oracle_tokens(static_cast<int64_t>(rng() % 150), L)).logits);
    ModelState ref = spec;
    for (int round = 0; round < 6; ++round) {
      const int64_t P = spec.pos;
      const bool forced = range.lo == 60 && round == 0;
      const int kind = round % 3;  // m = 0, m = k, 0 < m < k in turn; k and m random within that
      const int64_t k = forced ? 4 : (kind == 2 ? 2 : 1) + static_cast<int64_t>(rng() % (kind == 2 ? 3 : 4));
      const int64_t m = forced ? static_cast<int64_t>(rng() % static_cast<uint64_t>(W - L))
                               : kind == 0 ? 0 : kind == 1 ? k : 1 + static_cast<int64_t>(rng() % uint64_t(k - 1));
      ModelState next_ref = ref;  // [c, g_1..g_m] one at a time; g_{i+1} = argmax of the row after g_i
      std::vector<int64_t> fed = {c};
      std::vector<std::vector<float>> rows;
      for (int64_t i = 0; i <= m; ++i) {
        rows.push_back(one_by_one(next_ref, {fed.back()})[0]);
        fed.push_back(argmax(rows.back()));
      }
      const std::vector<int64_t> g(fed.begin() + 1, fed.end());  // g_1 .. g_{m+1}
      Proposal p;
      p.tokens.assign(g.begin(), g.begin() + m);
      if (m < k) p.tokens.push_back((g[size_t(m)] + 1 + static_cast<int64_t>(rng() % (vocab() - 1))) % vocab());
      while (static_cast<int64_t>(p.tokens.size()) < k) p.tokens.push_back(static_cast<int64_t>(rng() % vocab()));
      SampleRng unused(0);
      const std::string where = "L " + std::to_string(L) + " round " + std::to_string(round) + " P " +
                                std::to_string(P) + " k " + std::to_string(k) + " m " + std::to_string(m);
      const SpeculativeRound r = speculative_round(model(), spec, c, p, greedy_fixed(static_cast<int>(k)), unused);
      ASSERT_EQ(r.accepted, m) << where;
      ASSERT_EQ(r.emitted, g) << where;
      ASSERT_EQ(r.verify.all_logits.dim(0), k + 1) << where;
      for (int64_t i = 0; i <= m; ++i) {
        ASSERT_TRUE(finite_not_all_zero(rows[size_t(i)])) << where;
        ASSERT_TRUE(same_bits(r.verify.all_logits.row(i), rows[size_t(i)])) << where << ": logits of row " << i;
      }
      ASSERT_EQ(first_state_difference(spec, next_ref), "") << where;
      ++rounds;
      for (int64_t q = P + m + 1; q <= P + k; ++q) rejected_group += q % 2 == 1;
      ++pending[(P + m + 1) % 2];
      ring_live_overwritten += m < k && P + k >= W;
      wrap_in_round += m < k && (P + m) / W != (P + k) / W;
      (m == 0 ? m0 : m == k ? mk : mmid) += 1;
      ref = std::move(next_ref);
      c = g.back();
    }
  }
  std::printf("[dsv41] %d rounds: rejected positions completed %d groups; pending after the round 0: %d, 1: %d; "
              "rejected verify writes over live ring slots: %d rounds (crossing a multiple of 64: %d); m=0: %d, "
              "0<m<k: %d, m=k: %d\n", rounds, rejected_group, pending[0], pending[1], ring_live_overwritten,
              wrap_in_round, m0, mmid, mk);
  EXPECT_TRUE(rejected_group > 0 && pending[0] > 0 && pending[1] > 0 && ring_live_overwritten > 0 &&
              wrap_in_round > 0 && m0 > 0 && mmid > 0 && mk > 0) << "a case the test claims did not occur";
}

// ---- greedy speculative decoding = plain greedy decoding (rapidcheck)
// kCases cases (RC_PARAMS "max_success=<n>" sets the count, "reproduce=..." replays): a prompt of
// 1..96 random tokens, a policy (fixed:1..5, threshold:TAU or survival:S, TAU, S in [0.05, 0.95],
// confidence logits in [-3, 3]), 1..5 drafts per round = the true greedy continuation with 0..2
// tokens corrupted at random positions; rounds until 10 tokens are emitted. The tokens must be
// plain greedy decoding's (one token at a time, argmax of each step), each round must accept
// exactly the verified drafts before the first corrupted one, and the final state must equal the
// plain run's at the same position.
constexpr int kCases = 20;
constexpr int64_t kEmit = 10;

void check_some(int cases, const std::function<void()>& property) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  const std::string env = std::getenv("RC_PARAMS") ? std::getenv("RC_PARAMS") : "";
  const bool as_configured = env.find("max_success") != std::string::npos || env.find("reproduce") != std::string::npos;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  rc::detail::TestMetadata meta{std::string(info->test_suite_name()) + "/" + info->name(), info->name()};
  params.maxSuccess = cases;
  const auto result =
      as_configured ? rc::detail::checkTestable(property, meta) : rc::detail::checkTestable(property, meta, params);
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  std::printf("[dsv41] rapidcheck seed %llu: %s\n", static_cast<unsigned long long>(params.seed), os.str().c_str());
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << os.str();
}

TEST(SpeculativeGreedyProperty, EmitsExactlyThePlainGreedySequence) {
  const int64_t V = vocab();
  check_some(kCases, [V] {
    const auto prompt = *rc::gen::container<std::vector<int64_t>>(
        static_cast<size_t>(*rc::gen::inRange(1, 97)), rc::gen::inRange<int64_t>(0, V));
    const int kind = *rc::gen::inRange(0, 3);
    const double tau = *rc::gen::inRange(5, 96) / 100.0;
    SpeculativeOptions o = greedy_fixed(*rc::gen::inRange(1, 6));
    if (kind > 0) o.policy = VerifyPolicy::parse((kind == 1 ? "threshold:" : "survival:") + std::to_string(tau));
    // Plain greedy, with the state after every token.
    ModelState g = model().new_state();
    std::vector<int64_t> seq = {argmax(model().forward_chunk(g, prompt).logits)};
    std::vector<ModelState> after = {g};
    while (static_cast<int64_t>(seq.size()) < kEmit + 6) {
      seq.push_back(argmax(one_by_one(g, {seq.back()})[0]));
      after.push_back(g);
    }
    ModelState s = after[0];
    std::vector<int64_t> emitted = {seq[0]};
    SampleRng unused(0);
    while (static_cast<int64_t>(emitted.size()) < kEmit) {
      const size_t j = emitted.size() - 1;  // seq[j] is the current token
      const int64_t n = *rc::gen::inRange(1, 6);
      Proposal p;
      p.tokens.assign(seq.begin() + int64_t(j) + 1, seq.begin() + int64_t(j) + 1 + n);
      int64_t first_bad = n;
      for (int c = *rc::gen::inRange(0, 3); c > 0; --c) {
        const int64_t at = *rc::gen::inRange<int64_t>(0, n);
        p.tokens[size_t(at)] = (p.tokens[size_t(at)] + *rc::gen::inRange<int64_t>(1, V)) % V;
        first_bad = std::min(first_bad, at);
      }
      for (int64_t i = 0; i < n; ++i) p.confidence_logits.push_back(*rc::gen::inRange(-30, 31) / 10.0f);
      const SpeculativeRound r = speculative_round(model(), s, emitted.back(), p, o, unused);
      RC_ASSERT(static_cast<int64_t>(r.verified.size()) == o.policy.choose(p.confidence_logits, n));
      RC_ASSERT(r.accepted == std::min<int64_t>(first_bad, static_cast<int64_t>(r.verified.size())));
      emitted.insert(emitted.end(), r.emitted.begin(), r.emitted.end());
    }
    RC_ASSERT(emitted == std::vector<int64_t>(seq.begin(), seq.begin() + static_cast<int64_t>(emitted.size())));
    RC_ASSERT(first_state_difference(s, after[emitted.size() - 1]) == "");
  });
}

// ---- sampling mode
// 6 rounds at temperature 0.8, top-p 0.9, from a 30-token prompt; 3 drafts per round drawn from
// the prompt's last-position distribution at temperature 1.5 (a poor drafter: most drafts are
// rejected, which exercises the residual). Same seed: the same tokens, accept probabilities and
// state bit for bit; another seed: other tokens. Each emitted token has mass in its row's target
// distribution, and the state equals decoding the emitted tokens one at a time.
struct SampledRun {
  std::vector<int64_t> tokens;  // the current token, then every emitted one
  std::vector<double> accept_prob;
  ModelState state;
};

SampledRun sampled_run(uint64_t seed) {
  ModelState s = model().new_state();
  const std::vector<float> last = model().forward_chunk(s, test::oracle_tokens(200, 30)).logits;
  const std::vector<double> q = target_distribution(last.data(), vocab(), {1.5, 1.0});
  SpeculativeOptions o = greedy_fixed(3);
  o.sampling = {0.8, 0.9};
  SampleRng rng(seed), draft(seed ^ 0xD4AF7);
  SampledRun run{{argmax(last)}, {}, model().new_state()};
  for (int round = 0; round < 6; ++round) {
    Proposal p;
    for (int i = 0; i < 3; ++i) p.tokens.push_back(sample_from(q, draft));
    p.probs.assign(3, q);
    const SpeculativeRound r = speculative_round(model(), s, run.tokens.back(), p, o, rng);
    for (size_t i = 0; i < r.emitted.size(); ++i) {
      const std::vector<double> pt = target_distribution(r.verify.all_logits.row(int64_t(i)), vocab(), o.sampling);
      EXPECT_GT(pt[size_t(r.emitted[i])], 0.0) << "round " << round << " token " << i;
    }
    run.tokens.insert(run.tokens.end(), r.emitted.begin(), r.emitted.end());
    run.accept_prob.insert(run.accept_prob.end(), r.accept_prob.begin(), r.accept_prob.end());
  }
  run.state = std::move(s);
  return run;
}

TEST(SpeculativeSampling, ReplaysBitExactlyWithTheSameSeedAndDiffersWithAnother) {
  const uint64_t seed = test::seed_for("sampling/replay");
  std::printf("[dsv41] sampling-mode seeds %llu and %llu\n", (unsigned long long)seed, (unsigned long long)(seed + 1));
  const SampledRun a = sampled_run(seed), b = sampled_run(seed), other = sampled_run(seed + 1);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.accept_prob, b.accept_prob);
  EXPECT_EQ(first_state_difference(a.state, b.state), "");
  EXPECT_NE(a.tokens, other.tokens);
  ModelState one = model().new_state();
  model().forward_chunk(one, test::oracle_tokens(200, 30));
  one_by_one(one, std::vector<int64_t>(a.tokens.begin(), a.tokens.end() - 1));
  EXPECT_EQ(first_state_difference(a.state, one), "");
  std::printf("[dsv41] sampling mode: %zu tokens emitted in 6 rounds (%zu drafts decided)\n", a.tokens.size() - 1,
              a.accept_prob.size());
}

}  // namespace
}  // namespace dsv41::reference::model
