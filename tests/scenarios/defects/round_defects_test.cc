// tests/scenarios/defects/round_defects_test.cc: the speculative-decoding defects the self-test
// plants (scenarios/defects/round_defects.h) change what they claim, say when they fired, and are
// named by the state diff; unarmed or unfired they change nothing.
#include "scenarios/defects/round_defects.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference/model/speculative.h"
#include "reference/model/state_diff.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::scenarios::defects {
namespace {

using ::testing::HasSubstr;
using reference::model::Component;
using reference::model::DraftResult;
using reference::model::ForwardHooks;
using reference::model::Model;
using reference::model::ModelState;
using reference::checkpoint::ModelWeights;
using reference::model::Proposal;
using reference::SampleRng;
using reference::model::SpeculativeOptions;
using reference::model::SpeculativeRound;
using reference::Tensor;
using reference::model::VerifyPolicy;
using reference::model::first_state_difference;
using reference::model::speculative_round;

const Model& model() { return *test::oracle_model().model; }
int64_t vocab() { return test::oracle_model().config.vocab_size; }
int64_t argmax(const std::vector<float>& row) {
  return reference::argmax_token(row.data(), static_cast<int64_t>(row.size()));
}
int64_t step_argmax(ModelState& s, int64_t token) { return argmax(model().forward_chunk(s, {token}).logits); }
// Feeds `tokens` one at a time (forward_chunk with one token each); the logits after each.
std::vector<std::vector<float>> one_by_one(ModelState& s, const std::vector<int64_t>& tokens) {
  std::vector<std::vector<float>> rows;
  for (int64_t t : tokens) rows.push_back(model().forward_chunk(s, {t}).logits);
  return rows;
}
bool finite_not_all_zero(const Tensor<float>& t) {
  bool nonzero = false;
  for (float x : t.data()) {
    if (!std::isfinite(x)) return false;
    nonzero = nonzero || x != 0.0f;
  }
  return nonzero;
}
// Greedy rounds of a fixed policy with `defect` planted (*fired: whether it changed something).
SpeculativeOptions planted_options(const std::string& policy, RoundDefect defect, bool* fired) {
  SpeculativeOptions o;
  o.policy = VerifyPolicy::parse(policy);
  static bool ignored = false;
  o.hooks = round_defect_hooks(defect, test::oracle_model().config, fired ? fired : &ignored);
  return o;
}

// A partial accept across a compressor boundary at an even position P: verify [c, d1, d2] at P ..
// P + 2 completes the group (P, P + 1) and starts the next; d1 is wrong (m = 0), so the rollback
// keeps one pending token (position P) in slot 0, which the verify overwrote with position P + 2.
TEST(RoundDefects, CompressorNotRolledBackIsNamedByTheStateDiff) {
  std::mt19937_64 rng(test::seed_for("defects/compressor"));
  const int64_t L = 2 * (10 + static_cast<int64_t>(rng() % 50));
  std::printf("[dsv41] compressor defect: prompt of %lld tokens\n", static_cast<long long>(L));
  ModelState before = model().new_state();
  const int64_t c = argmax(model().forward_chunk(before, test::oracle_tokens(0, L)).logits);
  ModelState want = before;
  const int64_t g1 = argmax(one_by_one(want, {c})[0]);
  const Proposal p{{(g1 + 1) % vocab(), g1}, {}, {}};
  SampleRng unused(0);
  ModelState clean = before, planted = before;
  const SpeculativeRound r = speculative_round(model(), clean, c, p, planted_options("fixed:2", RoundDefect::kNone, nullptr), unused);
  bool fired = false;
  speculative_round(model(), planted, c, p, planted_options("fixed:2", RoundDefect::kCompressorNotRolledBack, &fired),
                    unused);
  EXPECT_TRUE(fired);
  ASSERT_EQ(r.accepted, 0);
  EXPECT_EQ(first_state_difference(clean, want), "");
  EXPECT_THAT(first_state_difference(planted, want),
              HasSubstr("layer 2 compressor: pending kv row 0 (position " + std::to_string(L) + ")"));
  // One more token: the group (L, L + 1) pools the wrong slot into compressed position L / 2.
  one_by_one(clean, {g1});
  one_by_one(planted, {g1});
  EXPECT_THAT(first_state_difference(planted, clean),
              HasSubstr("layer 2 compressed_kv: entry " + std::to_string(L / 2) + " "));
}

TEST(RoundDefects, AcceptOneMoreEmitsADifferentSequenceOnlyWhenADraftIsRejected) {
  ModelState s0 = model().new_state();
  const int64_t c = argmax(model().forward_chunk(s0, test::oracle_tokens(100, 45)).logits);
  ModelState g = s0;
  std::vector<int64_t> greedy = {c};
  for (int i = 0; i < 4; ++i) greedy.push_back(argmax(one_by_one(g, {greedy.back()})[0]));
  const std::vector<int64_t> want(greedy.begin() + 1, greedy.end());  // g1 .. g4
  SampleRng unused(0);
  bool fired = false;
  const auto emitted = [&](const std::vector<int64_t>& drafts, RoundDefect d) {
    ModelState s = s0;
    fired = false;
    return speculative_round(model(), s, c, Proposal{drafts, {}, {}}, planted_options("fixed:3", d, &fired), unused)
        .emitted;
  };
  const std::vector<int64_t> bad = {want[0], (want[1] + 1) % vocab(), want[2]};
  EXPECT_EQ(emitted(bad, RoundDefect::kNone), std::vector<int64_t>(want.begin(), want.begin() + 2));
  const std::vector<int64_t> planted = emitted(bad, RoundDefect::kAcceptOneMore);
  EXPECT_TRUE(fired);
  ASSERT_EQ(planted.size(), 3u);
  EXPECT_NE(planted, std::vector<int64_t>(want.begin(), want.begin() + 3));
  EXPECT_EQ(planted[1], bad[1]);  // the rejected draft was emitted
  const std::vector<int64_t> good(want.begin(), want.begin() + 3);  // nothing rejected: no effect
  EXPECT_EQ(emitted(good, RoundDefect::kAcceptOneMore), want);
  EXPECT_FALSE(fired) << "nothing was rejected: the defect changed nothing and must not count as fired";
}

// A partial accept past the rings' wrap: the rejected positions' slots held earlier positions.
TEST(RoundDefects, DSparkRingNotRolledBackIsNamedByTheStateDiffAndChangesTheNextDraft) {
  const int64_t W = test::oracle_model().config.window_size;
  ModelState before = model().new_state();
  const int64_t c = argmax(model().forward_chunk(before, test::oracle_tokens(3, W + 10)).logits);
  ModelState look = before;
  const int64_t g1 = step_argmax(look, c);
  const Proposal p{{(g1 + 1) % vocab(), 5, 6}, {}, {}};  // d_1 is wrong: m = 0
  SampleRng unused(0);
  ModelState clean = before, planted = before;
  const SpeculativeRound r = speculative_round(model(), clean, c, p, planted_options("fixed:3", RoundDefect::kNone, nullptr), unused);
  bool fired = false;
  speculative_round(model(), planted, c, p, planted_options("fixed:3", RoundDefect::kDSparkRingNotRolledBack, &fired),
                    unused);
  EXPECT_TRUE(fired);
  ASSERT_EQ(r.accepted, 0);
  EXPECT_EQ(first_state_difference(clean, look), "");
  // Position W + 11 (the first rejected) is in slot 11, which holds position 11 after the rollback.
  EXPECT_THAT(first_state_difference(planted, clean), HasSubstr("DSpark block 0 dspark_window_kv"));
  const DraftResult dc = model().draft(clean, r.next_token), dp = model().draft(planted, r.next_token);
  ASSERT_TRUE(finite_not_all_zero(dc.logits));
  EXPECT_NE(std::memcmp(dc.logits.data().data(), dp.logits.data().data(), dc.logits.data().size() * sizeof(float)), 0)
      << "the stale ring slots never reached the draft";
}

TEST(DraftDefects, RopeAtBlockStartChangesEveryRowOfTheDraftAttention) {
  ModelState s = model().new_state();
  const int64_t c = argmax(model().forward_chunk(s, test::oracle_tokens(7, 40)).logits);
  std::vector<float> good_attn, bad_attn;  // dspark_attn_out of the first block: [B, dim]
  ForwardHooks h;
  std::vector<float>* into = &good_attn;
  h.tensor = [&into](Component what, int, Tensor<float>& v) {
    if (what == Component::kDSparkAttnOut && into->empty()) *into = v.data();
  };
  const DraftRopeAtBlockStartOps ops(reference::seam::reference_ops());
  Model m(test::oracle_model().config,
          ModelWeights::load(test::kOracleDir + "weights.safetensors", test::oracle_model().config),
          test::oracle_model().token_map, ops);
  m.set_hooks(h);
  m.draft(s, c);  // unarmed: the inner ops exactly
  into = &bad_attn;
  ops.arm(true);
  m.draft(s, c);
  ops.arm(false);
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

TEST(RoundDefects, NoneAndTheDraftDefectPlantNoRoundHooks) {
  bool fired = false;
  for (RoundDefect d : {RoundDefect::kNone, RoundDefect::kDraftRopeAtBlockStart}) {
    const reference::model::RoundHooks h = round_defect_hooks(d, test::oracle_model().config, &fired);
    EXPECT_FALSE(h.decided);
    EXPECT_FALSE(h.rolled_back);
  }
  EXPECT_FALSE(fired);
}

}  // namespace
}  // namespace dsv41::scenarios::defects
