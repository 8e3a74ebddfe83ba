// tests/bench/synthetic_state_test.cc: the decode-cost curve's synthetic state (bench/synthetic_state.h)
// on the tiny config with generated weights (seed 0), CPU reference: it is laid out as a prefill of
// the same context lays its state out (the same caches, entry counts, ring positions, compressor
// positions, bytes), every entry decodes, Model::forward_chunk accepts it and gives finite logits,
// the seed makes it, and bad contexts are refused naming the rule.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench/synthetic_state.h"
#include "formats/cache_format.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reference/model/model.h"
#include "reference/ops/config.h"

namespace dsv41::bench {
namespace {

using reference::model::CacheView;
using reference::model::Model;
using reference::model::ModelState;

reference::ModelConfig tiny_at(int max_seq_len) {
  reference::ModelConfig c = reference::load_config("tiny");
  c.max_seq_len = max_seq_len;
  return c;
}

Model tiny_model(const reference::ModelConfig& c) {
  return Model(c,
               reference::checkpoint::ModelWeights::load(
                   reference::checkpoint::safetensors::SafetensorsFile::from_entries(
                       "generated weights", reference::checkpoint::generate_weights(c, /*seed=*/0)),
                   c),
               reference::model::default_token_map(c));
}

// Every view of a state: caches, compressors' pending groups, DSpark rings.
std::vector<CacheView> all_views(const Model& m, const ModelState& s) {
  std::vector<CacheView> v = m.cache_views(s);
  for (auto* more : {&reference::model::compressor_views, &reference::model::dspark_views}) {
    std::vector<CacheView> w = more(s, m.ops());
    v.insert(v.end(), w.begin(), w.end());
  }
  return v;
}

TEST(SyntheticState, LaidOutAsAPrefillOfTheSameContext) {
  constexpr int64_t kContext = 256;
  const reference::ModelConfig c = tiny_at(512);
  const Model m = tiny_model(c);
  ModelState real = m.new_state();
  std::vector<int64_t> prompt(kContext);
  for (int64_t i = 0; i < kContext; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 5) % c.vocab_size;
  m.prefill(real, prompt);
  const ModelState synth = synthetic_state(m, kContext, /*seed=*/0);

  EXPECT_EQ(synth.pos, real.pos);
  const std::vector<CacheView> a = all_views(m, real), b = all_views(m, synth);
  ASSERT_EQ(a.size(), b.size());
  int caches = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].kind + " of layer " + std::to_string(a[i].layer));
    EXPECT_EQ(b[i].kind, a[i].kind);
    EXPECT_EQ(b[i].layer, a[i].layer);
    EXPECT_EQ(b[i].format, a[i].format);
    EXPECT_EQ(b[i].entries, a[i].entries);
    EXPECT_EQ(b[i].positions, a[i].positions);  // ring slots hold the last window positions
    if (b[i].kind == "compressor") continue;    // fp32 rows (none pending at a multiple of the ratios)
    const formats::EntryCheck chk = formats::check_entries(b[i].format, b[i].bytes, static_cast<int>(b[i].entries),
                                                           static_cast<int>(b[i].dim));
    EXPECT_EQ(chk.invalid, 0) << chk.why;
    for (float v : formats::unpack_rows(b[i].format, b[i].bytes, static_cast<int>(b[i].entries),
                                        static_cast<int>(b[i].dim))) {
      ASSERT_TRUE(std::isfinite(v));
    }
    caches += b[i].kind == "compressed_kv" || b[i].kind == "index_keys";
  }
  EXPECT_EQ(caches, 2 * static_cast<int>(c.kv_source_layers.size()));
  // The expected entry counts, from the ratios.
  for (const auto& ls : synth.layers) {
    if (!ls.compressed_kv) continue;
    EXPECT_EQ(ls.compressed_kv->size(), expected_entries(kContext, ls.compressed_kv->ratio()));
    EXPECT_EQ(ls.index_keys->size(), expected_entries(kContext, ls.index_keys->ratio()));
    if (ls.compressor) {
      EXPECT_EQ(ls.compressor->next_pos, kContext);
      EXPECT_EQ(ls.compressor->pending(), 0);
    }
  }
  EXPECT_EQ(synth.engram.size(), real.engram.size());
  const StateBytes rb = state_bytes(real), sb = state_bytes(synth);
  EXPECT_EQ(sb.allocated, rb.allocated);
  EXPECT_EQ(sb.held, rb.held);
  EXPECT_EQ(sb.host_metadata, rb.host_metadata);
}

TEST(SyntheticState, ForwardChunkStepsFromItWithFiniteLogits) {
  constexpr int64_t kContext = 1024;
  const reference::ModelConfig c = tiny_at(kContext + 4);
  const Model m = tiny_model(c);
  ModelState s = synthetic_state(m, kContext, /*seed=*/7);
  for (int64_t step = 0; step < 2; ++step) {
    const reference::model::StepRecord r = m.forward_chunk(s, {(step * 31 + 3) % c.vocab_size});
    ASSERT_EQ(static_cast<int64_t>(r.logits.size()), c.vocab_size);
    bool nonzero = false;
    for (float v : r.logits) {
      ASSERT_TRUE(std::isfinite(v));
      nonzero |= v != 0.0f;
    }
    EXPECT_TRUE(nonzero);
    EXPECT_FALSE(r.topk.empty());  // the index layers selected from the synthetic keys
  }
  EXPECT_EQ(s.pos, kContext + 2);
  for (const auto& ls : s.layers) {  // a ratio-1 cache gained 2 entries, a ratio-2 cache 1
    if (ls.compressed_kv) {
      EXPECT_EQ(ls.compressed_kv->size(), (kContext + 2) / ls.compressed_kv->ratio());
    }
  }
}

TEST(SyntheticState, TheSeedMakesTheState) {
  const reference::ModelConfig c = tiny_at(512);
  const Model m = tiny_model(c);
  const std::vector<CacheView> a = m.cache_views(synthetic_state(m, 128, 3));
  const std::vector<CacheView> b = m.cache_views(synthetic_state(m, 128, 3));
  const std::vector<CacheView> d = m.cache_views(synthetic_state(m, 128, 4));
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].kind << " " << a[i].layer;
    differs |= a[i].bytes != d[i].bytes;
  }
  EXPECT_TRUE(differs);
}

TEST(SyntheticState, BadContextsAreRefusedNamingTheRule) {
  const reference::ModelConfig c = tiny_at(512);
  EXPECT_EQ(context_multiple(c), 2);  // compress_ratios 2 and 1
  auto message = [&](int64_t context, int64_t steps) {
    try {
      check_synthetic_context(c, context, steps);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(255, 0).find("not a multiple of 2"), std::string::npos) << message(255, 0);
  EXPECT_NE(message(16, 0).find("at least 67 positions"), std::string::npos) << message(16, 0);
  EXPECT_NE(message(510, 4).find("exceed max_seq_len 512"), std::string::npos) << message(510, 4);
  EXPECT_EQ(message(508, 4), "(accepted)");
}

}  // namespace
}  // namespace dsv41::bench
