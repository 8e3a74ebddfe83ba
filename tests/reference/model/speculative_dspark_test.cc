// Speculative decoding with the DSpark drafter on the tiny oracle model (reference/model/speculative.h,
// Model::draft): greedy rounds whose proposals are DSpark drafts emit exactly plain greedy
// decoding's tokens and leave the state (DSpark rings included) of the one-token-at-a-time run;
// the two draft-side defects of the verifier's self-test change what they claim and nothing else.
// Seeds: printed; DSV41_SEED=<n> overrides the data seed.
//
// Random-weight DSpark heads almost never propose the target's argmax, so the DSpark drafts alone
// would only exercise m = 0: each round also splices a prefix of the true greedy continuation
// (0 .. B tokens, random) in front of the DSpark tokens, so every accept length occurs while the
// drafts past it are the DSpark head's own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "reference/model/speculative.h"
#include "reference/model/state_diff.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::reference::model {
namespace {

using ::testing::HasSubstr;

const Model& model() { return *test::oracle_model().model; }

int64_t argmax(const std::vector<float>& row) {
  return argmax_token(row.data(), static_cast<int64_t>(row.size()));
}

// One token at a time from `s`: the argmax after each.
int64_t step_argmax(ModelState& s, int64_t token) { return argmax(model().forward_chunk(s, {token}).logits); }

bool finite_not_all_zero(const Tensor<float>& t) {
  bool nonzero = false;
  for (float x : t.data()) {
    if (!std::isfinite(x)) return false;
    nonzero = nonzero || x != 0.0f;
  }
  return nonzero;
}

SpeculativeOptions greedy(const std::string& policy) {
  SpeculativeOptions o;
  o.policy = VerifyPolicy::parse(policy);
  return o;
}

TEST(SpeculativeDSpark, GreedyRoundsWithDSparkDraftsEmitPlainGreedyTokensAndState) {
  const uint64_t seed = test::seed_for("speculative/dspark_greedy");
  std::printf("[dsv41] speculative dspark seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int64_t B = test::oracle_model().config.dspark_block_size;
  int rounds = 0, partial = 0, full = 0, dspark_drafts_verified = 0;
  for (const char* policy : {"fixed:5", "fixed:2", "threshold:0.4", "survival:0.1"}) {
    const int64_t L = 20 + static_cast<int64_t>(rng() % 100);
    ModelState spec = model().new_state();
    int64_t c = argmax(model().forward_chunk(spec, test::oracle_tokens(static_cast<int64_t>(rng() % 200), L)).logits);
    ModelState plain = spec;
    std::vector<int64_t> want = {c}, got = {c};  // plain greedy's tokens, the rounds'
    const int64_t kTokens = 16;
    while (static_cast<int64_t>(got.size()) < kTokens) {
      // The true continuation from here, on a copy of the plain state.
      ModelState look = plain;
      std::vector<int64_t> truth;
      for (int64_t t = got.back(); static_cast<int64_t>(truth.size()) < B;) truth.push_back(t = step_argmax(look, t));
      const DraftResult d = model().draft(spec, got.back());
      ASSERT_EQ(static_cast<int64_t>(d.tokens.size()), B);
      ASSERT_TRUE(finite_not_all_zero(d.logits));
      Proposal p;
      const int64_t spliced = static_cast<int64_t>(rng() % static_cast<uint64_t>(B + 1));
      p.tokens.assign(truth.begin(), truth.begin() + spliced);
      p.tokens.insert(p.tokens.end(), d.tokens.begin() + spliced, d.tokens.end());
      p.confidence_logits = d.confidence;
      SampleRng unused(0);
      const SpeculativeRound r = speculative_round(model(), spec, got.back(), p, greedy(policy), unused);
      // The expected accept length: the verified drafts before the first that is not the truth.
      const int64_t k = static_cast<int64_t>(r.verified.size());
      int64_t m = 0;
      while (m < k && p.tokens[static_cast<size_t>(m)] == truth[static_cast<size_t>(m)]) ++m;
      ASSERT_EQ(r.accepted, m) << policy << " round " << rounds;
      for (int64_t i = spliced; i < k; ++i) dspark_drafts_verified += 1;
      got.insert(got.end(), r.emitted.begin(), r.emitted.end());
      for (int64_t i = 0; i <= m; ++i) want.push_back(step_argmax(plain, want.back()));
      ASSERT_EQ(got, want) << policy << " round " << rounds;
      ASSERT_EQ(first_state_difference(spec, plain), "") << policy << " round " << rounds;
      ++rounds;
      (m < k ? partial : full) += 1;
    }
  }
  std::printf("[dsv41] %d rounds (%d partial, %d whole), %d DSpark drafts verified\n", rounds, partial, full,
              dspark_drafts_verified);
  EXPECT_GT(partial, 0);
  EXPECT_GT(full, 0);
  EXPECT_GT(dspark_drafts_verified, 0);
}

}  // namespace
}  // namespace dsv41::reference::model
