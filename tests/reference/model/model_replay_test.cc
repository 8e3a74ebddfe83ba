// SWA bounded replay in the reference (docs/sessions.md): encoder replay after a global-only
// resume and decoder replay during prefill. Both are approximate by design; the exact cases are
// tested bit for bit, the approximate ones for what must still hold exactly (the global state)
// and for a measured divergence that is printed.
//
// Model: the tiny config with the official oracle weights and the oracle prompt tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "reference/model/model.h"
#include "reference/checkpoint/weights.h"
#include "tests/support/oracle_model.h"

namespace dsv41::reference::model {
namespace {

struct Fixture {
  const ModelConfig& config;
  const Model* model;
  const std::vector<int64_t>& tokens;  // the 333 oracle prompt tokens
};

Fixture fixture() {
  const test::OracleModel& m = test::oracle_model();
  return {m.config, m.model.get(), m.tokens};
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t first, int64_t n) {
  return {v.begin() + first, v.begin() + first + n};
}

// The global state's bytes: packed caches and the compressor's pending group.
std::vector<uint8_t> global_bytes(const ModelState& s) {
  std::vector<uint8_t> out;
  for (const LayerState& ls : s.layers) {
    if (ls.compressed_kv) {
      for (int64_t e = 0; e < ls.compressed_kv->size(); ++e)
        out.insert(out.end(), ls.compressed_kv->entry(e), ls.compressed_kv->entry(e) + ls.compressed_kv->entry_bytes());
    }
    if (ls.index_keys) {
      for (int64_t e = 0; e < ls.index_keys->size(); ++e)
        out.insert(out.end(), ls.index_keys->entry(e), ls.index_keys->entry(e) + ls.index_keys->entry_bytes());
    }
    if (ls.compressor) {
      const auto* b = reinterpret_cast<const uint8_t*>(ls.compressor->kv.data().data());
      out.insert(out.end(), b, b + ls.compressor->pending() * ls.compressor->dim * sizeof(float));
    }
  }
  return out;
}

using test::ring_bytes;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  bool nonzero = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(std::isnan(a[i]));
    nonzero |= a[i] != 0.0f;
    m = std::max(m, std::fabs(double{a[i]} - b[i]));
  }
  EXPECT_TRUE(nonzero);
  return m;
}

// A session shorter than the window: replaying all of it truncates nothing, so the rings and
// what follows are bit-identical to never having lost them.
TEST(EncoderReplay, WholeShortSessionIsExact) {
  const Fixture f = fixture();
  ModelState a = f.model->new_state();
  f.model->prefill(a, slice(f.tokens, 0, 41));
  ModelState b = a;
  f.model->replay_local_state(b, slice(f.tokens, 0, 41));
  EXPECT_EQ(ring_bytes(a), ring_bytes(b));
  EXPECT_EQ(global_bytes(a), global_bytes(b));
  const StepRecord ra = f.model->forward_chunk(a, slice(f.tokens, 41, 5));
  const StepRecord rb = f.model->forward_chunk(b, slice(f.tokens, 41, 5));
  EXPECT_EQ(max_abs_diff(ra.logits, rb.logits), 0.0);
}

// A long session: the last W tokens are replayed with windows truncated at their start. The
// global state is untouched; layer 0's ring is exact (its KV depends on the token alone); the
// continuation differs by a measured amount.
TEST(EncoderReplay, LongSessionKeepsGlobalStateAndLayerZeroExact) {
  const Fixture f = fixture();
  const int64_t W = f.config.window_size, P = 201;
  ModelState a = f.model->new_state();
  f.model->prefill(a, slice(f.tokens, 0, P));
  ModelState b = a;
  const std::vector<uint8_t> global_before = global_bytes(b);
  f.model->replay_local_state(b, slice(f.tokens, P - W, W));
  EXPECT_EQ(global_bytes(b), global_before) << "encoder replay must not write the global state";
  EXPECT_EQ(a.layers[0].window_kv.bytes.data(), b.layers[0].window_kv.bytes.data());
  EXPECT_EQ(a.layers[0].window_kv.positions, b.layers[0].window_kv.positions);
  EXPECT_NE(a.layers[3].window_kv.bytes.data(), b.layers[3].window_kv.bytes.data()) << "truncated windows must show";
  double worst = 0;
  for (int k = 0; k < 4; ++k) {
    const std::vector<int64_t> tok = slice(f.tokens, P + k, 1);
    worst = std::max(worst, max_abs_diff(f.model->forward_chunk(a, tok).logits, f.model->forward_chunk(b, tok).logits));
  }
  std::printf("encoder replay (P=%lld, W=%lld): max |logit diff| over 4 steps %.4g\n",
              static_cast<long long>(P), static_cast<long long>(W), worst);
  EXPECT_GT(worst, 0.0);
}

// Decoder replay with a tail covering every row is the plain prefill.
TEST(DecoderReplay, TailOfAllRowsIsExact) {
  const Fixture f = fixture();
  ModelState a = f.model->new_state(), b = f.model->new_state();
  const StepRecord ra = f.model->prefill(a, slice(f.tokens, 0, 120));
  StepOptions o;
  o.decoder_replay_rows = 120;
  const StepRecord rb = f.model->forward_chunk(b, slice(f.tokens, 0, 120), o);
  EXPECT_EQ(max_abs_diff(ra.logits, rb.logits), 0.0);
  EXPECT_EQ(ring_bytes(a), ring_bytes(b));
}

// A short tail: layers up to the candidate source run on every row, so the global state is
// exact; the last-token logits differ by a measured amount.
TEST(DecoderReplay, ShortTailKeepsGlobalStateExact) {
  const Fixture f = fixture();
  const int64_t T = 333, tail = f.config.window_size + 5;  // ring = W + spec (DSpark block 5)
  ModelState a = f.model->new_state(), b = f.model->new_state();
  const StepRecord ra = f.model->prefill(a, f.tokens);
  StepOptions o;
  o.decoder_replay_rows = tail;
  const StepRecord rb = f.model->forward_chunk(b, slice(f.tokens, 0, T), o);
  EXPECT_EQ(global_bytes(a), global_bytes(b));
  for (int l = 0; l <= f.config.candidate_source_layer; ++l) {
    EXPECT_EQ(a.layers[static_cast<size_t>(l)].window_kv.bytes.data(), b.layers[static_cast<size_t>(l)].window_kv.bytes.data()) << "layer " << l;
  }
  const double d = max_abs_diff(ra.logits, rb.logits);
  std::printf("decoder replay (T=%lld, tail %lld): max |last-token logit diff| %.4g\n",
              static_cast<long long>(T), static_cast<long long>(tail), d);
  EXPECT_EQ(rb.topk.at(8).dim(0), tail);  // the Reindex layer selected for the tail only
}

}  // namespace
}  // namespace dsv41::reference::model

namespace dsv41::reference::model {
namespace {

// The official batch: rows of equal length that never interact. Row b equals its own run.
TEST(ModelBatch, RowsEqualSeparateRuns) {
  const test::OracleModel& o = test::oracle_model();
  ModelConfig c2 = o.config;
  c2.max_batch_size = 2;  // the tiny config's is 1
  const Model m2(c2, checkpoint::ModelWeights::load(test::kOracleDir + "weights.safetensors", c2), o.token_map);
  const Fixture f{c2, &m2, o.tokens};
  EXPECT_THROW(o.model->prefill_batch(*std::make_unique<std::vector<ModelState>>(2, o.model->new_state()),
                                      {slice(f.tokens, 0, 5), slice(f.tokens, 5, 5)}),
               Error) << "a batch beyond max_batch_size";
  std::vector<ModelState> states = {f.model->new_state(), f.model->new_state()};
  const std::vector<std::vector<int64_t>> prompts = {slice(f.tokens, 0, 70), slice(f.tokens, 100, 70)};
  const std::vector<StepRecord> p = f.model->prefill_batch(states, prompts);
  const std::vector<StepRecord> d = f.model->decode_batch(states, {5, 723});
  for (size_t b = 0; b < 2; ++b) {
    ModelState alone = f.model->new_state();
    EXPECT_EQ(max_abs_diff(p[b].logits, f.model->prefill(alone, prompts[b]).logits), 0.0) << b;
    EXPECT_EQ(max_abs_diff(d[b].logits, f.model->decode(alone, b == 0 ? 5 : 723).logits), 0.0) << b;
    EXPECT_EQ(test::ring_bytes(alone), test::ring_bytes(states[b])) << b;
  }
  EXPECT_NE(p[0].logits, p[1].logits);
  std::vector<ModelState> uneven = {f.model->new_state(), f.model->new_state()};
  EXPECT_THROW(f.model->prefill_batch(uneven, {slice(f.tokens, 0, 5), slice(f.tokens, 0, 6)}), Error);
}

}  // namespace
}  // namespace dsv41::reference::model
