// The DSpark state and Model::draft as an API (reference/model/model.h, docs/dspark.md): what the
// other tests do not pin against the oracle.
//
//   - chunking invariance: one prefill, any chunking (chunks shorter and longer than the window)
//     and a prefill followed by one-token steps leave bit-identical DSpark rings (bytes and slot
//     positions), and the drafts after them are bit-identical;
//   - a draft reads the state only; a copy of a state is an independent snapshot;
//   - errors: a fresh state, a state whose rings do not hold the positions it claims (rolled back
//     without them), a token outside the vocab, a bad temperature;
//   - sampling: temperature 0 is the argmax with a one-hot distribution; a seed replays a
//     sampled draft exactly; the Markov chain follows a teacher-forced token;
//   - encoder replay rebuilds the DSpark rings from its tail; the precision ablation drafts too.
//
// Model: the tiny config with the official oracle weights (window 64, block 5), the oracle prompt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "base/base.h"
#include "reference/model/model.h"
#include "tests/support/error_of.h"
#include "tests/support/oracle_model.h"

namespace dsv41::reference::model {
namespace {

using ::testing::HasSubstr;
using test::error_of;

constexpr int64_t kTokens = 150;  // > window 64: the rings wrap

const Model& model() { return *test::oracle_model().model; }

// Every DSpark ring's stored bytes and slot positions.
std::vector<uint8_t> dspark_rings(const ModelState& s) {
  std::vector<uint8_t> out;
  for (const WindowKvRing& ring : s.dspark_window_kv) {
    const std::vector<uint8_t>& b = ring.bytes.data();
    out.insert(out.end(), b.begin(), b.end());
    const auto* p = reinterpret_cast<const uint8_t*>(ring.positions.data());
    out.insert(out.end(), p, p + ring.positions.size() * sizeof(int64_t));
  }
  return out;
}

// A draft's every output as bits.
std::vector<uint32_t> draft_bits(const DraftResult& r) {
  std::vector<uint32_t> out = {static_cast<uint32_t>(r.position), static_cast<uint32_t>(r.last_token)};
  for (int64_t t : r.tokens) out.push_back(static_cast<uint32_t>(t));
  for (float v : r.logits.data()) out.push_back(f32_bits(v));
  for (float v : r.probs.data()) out.push_back(f32_bits(v));
  for (float v : r.confidence) out.push_back(f32_bits(v));
  return out;
}

// The state after running `tokens` in chunks of the given sizes (their sum is tokens.size()).
ModelState run_chunks(const std::vector<int64_t>& tokens, const std::vector<int64_t>& sizes) {
  ModelState s = model().new_state();
  size_t at = 0;
  for (int64_t n : sizes) {
    const auto first = tokens.begin() + static_cast<int64_t>(at);
    model().forward_chunk(s, std::vector<int64_t>(first, first + n));
    at += static_cast<size_t>(n);
  }
  EXPECT_EQ(at, tokens.size());
  return s;
}

TEST(DSparkState, AnyChunkingGivesTheSameRingsAndDrafts) {
  const std::vector<int64_t> tokens = test::oracle_tokens(0, kTokens);
  const ModelState whole = run_chunks(tokens, {kTokens});
  ASSERT_EQ(whole.dspark_window_kv.size(), 1u);
  std::set<int64_t> held(whole.dspark_window_kv[0].positions.begin(), whole.dspark_window_kv[0].positions.end());
  EXPECT_EQ(held.size(), 64u);
  EXPECT_EQ(*held.begin(), kTokens - 64) << "the ring keeps the last window positions";
  const std::vector<uint32_t> want = draft_bits(model().draft(whole, 7));
  std::vector<int64_t> steps(kTokens - 20, 1);
  steps.insert(steps.begin(), 20);
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{30, 70, 1, 49},  // a chunk longer than the window
                                            std::vector<int64_t>{64, 64, 22}, std::vector<int64_t>{1, 2, 3, 144}, steps}) {
    const ModelState s = run_chunks(tokens, sizes);
    EXPECT_EQ(dspark_rings(s), dspark_rings(whole)) << sizes.size() << " chunks";
    EXPECT_EQ(draft_bits(model().draft(s, 7)), want) << sizes.size() << " chunks";
  }
}

TEST(DSparkState, ADraftReadsTheStateOnlyAndACopyIsASnapshot) {
  ModelState s = model().new_state();
  model().prefill(s, test::oracle_tokens(0, 90));
  const std::vector<uint8_t> before = dspark_rings(s);
  const ModelState copy = s;
  const std::vector<uint32_t> first = draft_bits(model().draft(s, 11));
  EXPECT_EQ(dspark_rings(s), before);
  EXPECT_EQ(s.pos, 90);
  EXPECT_EQ(draft_bits(model().draft(s, 11)), first) << "a draft is a function of the state";
  model().decode(s, 12);
  EXPECT_NE(dspark_rings(s), before);
  EXPECT_EQ(dspark_rings(copy), before) << "the copy shares nothing with the state it came from";
  EXPECT_EQ(draft_bits(model().draft(copy, 11)), first);
}

TEST(DSparkState, ErrorsNameWhatIsWrong) {
  const ModelState fresh = model().new_state();
  EXPECT_THAT(error_of([&] { model().draft(fresh, 5); }), HasSubstr("fresh (position 0)"));
  ModelState s = model().new_state();
  model().prefill(s, test::oracle_tokens(0, 100));
  const ModelState at100 = s;
  model().forward_chunk(s, test::oracle_tokens(100, 5));
  // Rolled back to 100 without the rings: slot 36 holds position 100, a draft after 99 needs 36.
  ModelState rolled = s;
  rolled.pos = at100.pos;
  EXPECT_THAT(error_of([&] { model().draft(rolled, 5); }),
              HasSubstr("holds position 100 in slot 36, a draft after position 99 needs position 36"));
  EXPECT_THAT(error_of([&] { model().draft(at100, 1024); }), HasSubstr("outside the vocab"));
  EXPECT_THAT(error_of([&] { model().draft(at100, 5, DraftSampling{-1.0, 0}); }), HasSubstr("temperature"));
  EXPECT_THAT(error_of([&] { model().draft(at100, 5, DraftSampling{std::nan(""), 0}); }), HasSubstr("temperature"));
}

TEST(DSparkDraft, TemperatureZeroIsTheArgmaxWithAOneHotDistribution) {
  ModelState s = model().new_state();
  model().prefill(s, test::oracle_tokens(0, 120));
  const DraftResult r = model().draft(s, 3);
  const int64_t B = test::oracle_model().config.dspark_block_size, V = test::oracle_model().config.vocab_size;
  ASSERT_EQ(static_cast<int64_t>(r.tokens.size()), B);
  ASSERT_EQ(r.logits.shape(), (std::vector<int64_t>{B, V}));
  ASSERT_EQ(r.probs.shape(), (std::vector<int64_t>{B, V}));
  ASSERT_EQ(static_cast<int64_t>(r.confidence.size()), B);
  EXPECT_EQ(r.position, 120);
  EXPECT_EQ(r.last_token, 3);
  for (int64_t i = 0; i < B; ++i) {
    const float* row = r.logits.row(i);
    EXPECT_EQ(r.tokens[static_cast<size_t>(i)], std::max_element(row, row + V) - row) << "slot " << i;
    EXPECT_EQ(r.probs.at(i, r.tokens[static_cast<size_t>(i)]), 1.0f);
    EXPECT_EQ(std::count(r.probs.row(i), r.probs.row(i) + V, 0.0f), V - 1);
    EXPECT_TRUE(std::isfinite(r.confidence[static_cast<size_t>(i)]));
  }
}

TEST(DSparkDraft, ASeedReplaysASampledDraft) {
  ModelState s = model().new_state();
  model().prefill(s, test::oracle_tokens(0, 120));
  const DraftSampling a{1.5, 42};
  EXPECT_EQ(draft_bits(model().draft(s, 3, a)), draft_bits(model().draft(s, 3, a)));
  std::set<std::vector<int64_t>> drafts;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const DraftResult r = model().draft(s, 3, DraftSampling{1.5, seed});
    drafts.insert(r.tokens);
    for (int64_t i = 0; i < r.probs.dim(0); ++i) {
      double sum = 0;
      for (int64_t v = 0; v < r.probs.dim(1); ++v) sum += r.probs.at(i, v);
      EXPECT_NEAR(sum, 1.0, 1e-5);
      EXPECT_GT(r.probs.at(i, r.tokens[static_cast<size_t>(i)]), 0.0f) << "a token the distribution cannot draw";
    }
  }
  EXPECT_GT(drafts.size(), 1u) << "8 seeds at temperature 1.5 drew one draft only";
}

// A hook that replaces the token drawn at slot 0 feeds the replacement to slot 1's Markov head,
// as teacher forcing needs; the components appear at their documented layers.
TEST(DSparkDraft, TheMarkovChainFollowsAForcedToken) {
  const test::OracleModel& o = test::oracle_model();
  Model& m = *o.model;
  ModelState s = m.new_state();
  m.prefill(s, test::oracle_tokens(0, 70));
  std::set<std::pair<std::string, int>> seen;
  std::vector<float> slot1_embed;
  ForwardHooks h;
  h.tensor = [&](Component what, int layer, Tensor<float>& v) {
    seen.insert({name(what), layer});
    if (what == Component::kDSparkMarkovEmbed && layer == 1) slot1_embed = v.data();
  };
  h.index = [&](Component what, int layer, Tensor<int32_t>& v) {
    seen.insert({name(what), layer});
    if (what == Component::kDSparkToken && layer == 0) v.at(0, 0) = 500;
  };
  m.set_hooks(h);
  const DraftResult r = m.draft(s, 3);
  m.set_hooks({});
  EXPECT_EQ(r.tokens.at(0), 500);
  const int64_t rank = o.config.dspark_markov_rank;
  const std::vector<float>& table = m.weights().dspark.markov_embed.data();
  EXPECT_EQ(slot1_embed, std::vector<float>(table.begin() + 500 * rank, table.begin() + 501 * rank));
  const int L = o.config.n_layers;
  for (const auto& [c, l] : std::vector<std::pair<std::string, int>>{
           {"dspark_embed", -1}, {"dspark_in_stream", L}, {"dspark_attn_out", L}, {"dspark_experts", L},
           {"dspark_out_stream", L}, {"dspark_norm_out", -1}, {"dspark_head_logits", -1}, {"dspark_markov_bias", 4},
           {"dspark_token", 4}, {"dspark_logits", -1}, {"dspark_confidence", -1}}) {
    EXPECT_TRUE(seen.count({c, l})) << c << " at layer " << l;
  }
}

// Encoder replay (a global-only resume) rebuilds the DSpark rings from its tail, as it does the
// SWA rings: the draft after it reads the replayed positions.
TEST(DSparkState, EncoderReplayRebuildsTheRingsFromTheTail) {
  ModelState s = model().new_state();
  model().prefill(s, test::oracle_tokens(0, 130));
  model().replay_local_state(s, test::oracle_tokens(130 - 64, 64));
  std::vector<int64_t> held = s.dspark_window_kv[0].positions;
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held.front(), 66);
  EXPECT_EQ(held.back(), 129);
  EXPECT_EQ(model().draft(s, 3).tokens.size(), 5u);
}

TEST(DSparkState, TheBf16AblationDrafts) {
  const test::OracleModel& o = test::oracle_model();
  Model m(o.config, o.model->weights(), o.token_map);
  m.set_cache_precision(CachePrecision::kBf16);
  ModelState s = m.new_state();
  EXPECT_EQ(s.dspark_window_kv.at(0).format, formats::CacheFormat::kBf16);
  m.prefill(s, test::oracle_tokens(0, 80));
  const DraftResult r = m.draft(s, 3);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_THAT(error_of([&] { model().draft(s, 3); }), HasSubstr("bf16"));
}

}  // namespace
}  // namespace dsv41::reference::model
