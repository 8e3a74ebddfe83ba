// Speculative decoding with the DSpark drafter on the tiny oracle model (reference/speculative.h,
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

#include "reference/speculative.h"
#include "reference/state_diff.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

using ::testing::HasSubstr;

const Model& model() { return *test::oracle_model().model; }
int64_t vocab() { return test::oracle_model().config.vocab_size; }

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

SpeculativeOptions greedy(const std::string& policy, RoundDefect defect = RoundDefect::kNone) {
  SpeculativeOptions o;
  o.policy = VerifyPolicy::parse(policy);
  o.defect = defect;
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

// A partial accept past the rings' wrap: the rejected positions' slots held earlier positions.
TEST(SpeculativeDSpark, RingNotRolledBackIsNamedByTheStateDiffAndChangesTheNextDraft) {
  const int64_t W = test::oracle_model().config.window_size;
  ModelState before = model().new_state();
  const int64_t c = argmax(model().forward_chunk(before, test::oracle_tokens(3, W + 10)).logits);
  ModelState look = before;
  const int64_t g1 = step_argmax(look, c);
  const Proposal p{{(g1 + 1) % vocab(), 5, 6}, {}, {}};  // d_1 is wrong: m = 0
  SampleRng unused(0);
  ModelState clean = before, planted = before;
  const SpeculativeRound r = speculative_round(model(), clean, c, p, greedy("fixed:3"), unused);
  speculative_round(model(), planted, c, p, greedy("fixed:3", RoundDefect::kDSparkRingNotRolledBack), unused);
  ASSERT_EQ(r.accepted, 0);
  EXPECT_EQ(first_state_difference(clean, look), "");
  // Position W + 11 (the first rejected) is in slot 11, which holds position 11 after the rollback.
  EXPECT_THAT(first_state_difference(planted, clean), HasSubstr("DSpark block 0 dspark_window_kv"));
  const DraftResult dc = model().draft(clean, r.next_token), dp = model().draft(planted, r.next_token);
  ASSERT_TRUE(finite_not_all_zero(dc.logits));
  EXPECT_NE(std::memcmp(dc.logits.data().data(), dp.logits.data().data(), dc.logits.data().size() * sizeof(float)), 0)
      << "the stale ring slots never reached the draft";
}

TEST(SpeculativeDSpark, RopeAtBlockStartChangesEveryRowOfTheDraftAttention) {
  ModelState s = model().new_state();
  const int64_t c = argmax(model().forward_chunk(s, test::oracle_tokens(7, 40)).logits);
  std::vector<float> good_attn, bad_attn;  // dspark_attn_out of the first block: [B, dim]
  ForwardHooks h;
  std::vector<float>* into = &good_attn;
  h.tensor = [&into](Component what, int, Tensor<float>& v) {
    if (what == Component::kDSparkAttnOut && into->empty()) *into = v.data();
  };
  Model m(test::oracle_model().config,
          ModelWeights::load(test::kOracleDir + "weights.safetensors", test::oracle_model().config),
          test::oracle_model().token_map);
  m.set_hooks(h);
  m.draft(s, c);
  into = &bad_attn;
  m.draft(s, c, {}, DraftDefect::kRopeAtBlockStart);
  const int64_t dim = test::oracle_model().config.dim, B = test::oracle_model().config.dspark_block_size;
  ASSERT_EQ(static_cast<int64_t>(good_attn.size()), B * dim);
  ASSERT_EQ(good_attn.size(), bad_attn.size());
  ASSERT_TRUE(std::any_of(good_attn.begin(), good_attn.end(), [](float x) { return x != 0.0f; }));
  // Row 0 attends with the same rotation (its own position); every later row's q and own K differ.
  // Row 0 still differs: it attends over the block's rows 1+, whose keys moved.
  int rows_changed = 0;
  for (int64_t i = 0; i < B; ++i) {
    rows_changed += std::memcmp(good_attn.data() + i * dim, bad_attn.data() + i * dim, dim * sizeof(float)) != 0;
  }
  EXPECT_EQ(rows_changed, B) << "a bidirectional block: every row reads the moved keys";
}

}  // namespace
}  // namespace dsv41::reference
