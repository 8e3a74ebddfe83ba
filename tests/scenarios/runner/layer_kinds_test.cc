// The released-layer kinds (scenarios/runner/layer_kinds.h, docs/released-dims.md): each derived config
// keeps the base's dims and gives its target layer the claimed role (the expected table here is
// written from research/semantics.md's schedule, not from the code); packed F4 weights give the same
// bits as F4 values in every linear and in a whole forward of every kind (scaled dims).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/config.h"
#include "reference/ops/engram.h"
#include "reference/ops/linear.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/runner/layer_kinds.h"

namespace dsv41::scenarios::runner {
namespace {

using reference::LayerRole;
using reference::ModelConfig;

struct Expected {
  int n_layers, n_mtp;
  int target;
  LayerRole role;
  int ratio;
};

const std::map<std::string, Expected>& expected() {
  static const std::map<std::string, Expected> e = {
      {"swa", {1, 0, 0, LayerRole::kSwaOnly, 0}},     {"full2", {1, 0, 0, LayerRole::kFull, 2}},
      {"full1", {1, 0, 0, LayerRole::kFull, 1}},      {"reuse2", {2, 0, 1, LayerRole::kReuse, 2}},
      {"reuse1", {2, 0, 1, LayerRole::kReuse, 1}},    {"reindex", {2, 0, 1, LayerRole::kReindex, 1}},
      {"engram", {1, 0, 0, LayerRole::kSwaOnly, 0}},  {"dspark", {1, 1, 1, LayerRole::kDSpark, 0}},
  };
  return e;
}

TEST(LayerKinds, EveryKindOfTheFullPresetKeepsTheReleasedDims) {
  const ModelConfig full = reference::load_config("full");
  ASSERT_EQ(layer_kinds().size(), expected().size());
  for (const LayerKind& k : layer_kinds()) {
    SCOPED_TRACE(k.name);
    ASSERT_TRUE(expected().count(k.name));
    const Expected& x = expected().at(k.name);
    const ModelConfig c = kind_config(full, k, "preset 'full'");
    EXPECT_EQ(c.dim, 5120);
    EXPECT_EQ(c.n_heads, 64);
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.n_routed_experts, 384);
    EXPECT_EQ(c.n_activated_experts, 6);
    EXPECT_EQ(c.moe_inter_dim, 2304);
    EXPECT_EQ(c.index_n_heads, 32);
    EXPECT_EQ(c.index_head_dim, 128);
    EXPECT_EQ(c.index_topk, 512);
    EXPECT_EQ(c.window_size, 128);
    EXPECT_EQ(c.vocab_size, 129280);
    EXPECT_EQ(c.hc_mult, 4);
    EXPECT_EQ(c.n_layers, x.n_layers);
    EXPECT_EQ(c.n_mtp_layers, x.n_mtp);
    EXPECT_EQ(k.target, x.target);
    const std::vector<reference::LayerInfo> s = reference::layer_schedule(c);
    ASSERT_EQ(static_cast<int>(s.size()), x.n_layers + x.n_mtp);
    const reference::LayerInfo& t = s[static_cast<size_t>(x.target)];
    EXPECT_EQ(t.role, x.role);
    EXPECT_EQ(t.ratio, x.ratio);
    if (x.role == LayerRole::kReuse || x.role == LayerRole::kReindex) {
      EXPECT_EQ(s[0].role, LayerRole::kFull);  // the source runs first at the same dims
      EXPECT_EQ(t.kv_owner, 0);
      EXPECT_EQ(t.topk_owner, x.role == LayerRole::kReuse ? 0 : 1);
    }
    EXPECT_EQ(t.candidate_source, k.name == "full1");
    EXPECT_EQ(t.uses_candidates, k.name == "reindex");  // layers 24..36 after the candidate source 20
    EXPECT_EQ(t.engram, k.name == "engram");
    if (k.name == "dspark") {
      EXPECT_EQ(c.dspark_n_routed_experts, 128);
      EXPECT_EQ(c.dspark_target_layer_ids, std::vector<int>{0});
    }
    if (k.name == "engram") {  // the bucket base capped; the layout is the official one for it
      EXPECT_EQ(c.engram_vocab_size, kEngramVocabCap);
      EXPECT_EQ(c.engram_head_dim, 256);
      const reference::EngramLayout l = reference::EngramLayout::build(c);
      ASSERT_EQ(l.rows.size(), 1u);
      EXPECT_GT(l.rows[0], 24 * kEngramVocabCap);
      EXPECT_LT(l.rows[0], 25 * kEngramVocabCap);
    }
    // Why packed F4: the routed experts of one layer as fp32 values do not fit the device
    // machine's 128 GiB twice; packed they are 1/8.
    const WeightBytes plain = weight_bytes(c, false), packed = weight_bytes(c, true);
    const double per_layer = 384.0 * 3 * 2304 * 5120;  // routed expert values of one backbone layer
    EXPECT_GE(plain.routed_experts_held, 4.0 * per_layer * x.n_layers);
    EXPECT_LT(packed.held, plain.held / 3);
    EXPECT_LT(packed.held, 40e9);
  }
}

TEST(LayerKinds, ScaledBaseGivesTheSameSchedule) {
  for (const char* base : {"tiny", DSV41_SOURCE_DIR "/scenarios/configs/small.json"}) {
    const ModelConfig b = reference::load_config(base);
    for (const LayerKind& k : layer_kinds()) {
      SCOPED_TRACE(std::string(base) + " " + k.name);
      const Expected& x = expected().at(k.name);
      const ModelConfig c = kind_config(b, k, base);
      EXPECT_EQ(c.dim, b.dim);
      EXPECT_EQ(c.n_routed_experts, b.n_routed_experts);
      const std::vector<reference::LayerInfo> s = reference::layer_schedule(c);
      EXPECT_EQ(s[static_cast<size_t>(x.target)].role, x.role);
      EXPECT_EQ(s[static_cast<size_t>(x.target)].ratio, x.ratio);
    }
  }
}

TEST(LayerKinds, UnknownKindIsAnErrorListingTheKinds) {
  try {
    layer_kind("reuse3");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reuse2"), std::string::npos) << e.what();
  }
  ModelConfig c = reference::load_config("tiny");
  EXPECT_THROW(check_kind(kind_config(c, layer_kind("swa"), "tiny"), layer_kind("full2")), Error);
}

// x [T, in] random bf16 values.
reference::Tensor<float> random_bf16(int64_t T, int64_t in, uint32_t seed) {
  reference::Tensor<float> x({T, in}, "x");
  uint32_t s = seed;
  for (float& v : x.data()) {
    s = s * 1664525u + 1013904223u;
    v = formats::round_to_bf16(static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) * 0x1p-22f);
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_finite_not_all_zero(const std::vector<float>& v, const std::string& what) {
  bool nonzero = false;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x)) << what;
    nonzero = nonzero || x != 0.0f;
  }
  EXPECT_TRUE(nonzero) << what << " all zero";
}

TEST(PackedF4, LinearsGiveTheBitsOfTheValues) {
  const ModelConfig c = reference::load_config("tiny");
  const reference::checkpoint::safetensors::SafetensorsFile f =
      reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated", reference::checkpoint::generate_weights(c, 3));
  const reference::checkpoint::ModelWeights plain = reference::checkpoint::ModelWeights::load(f, c, false);
  const reference::checkpoint::ModelWeights packed = reference::checkpoint::ModelWeights::load(f, c, true);
  const reference::MoeWeights& mp = plain.blocks[2].ffn;
  const reference::MoeWeights& mq = packed.blocks[2].ffn;
  ASSERT_FALSE(mq.w1.empty());
  EXPECT_TRUE(mq.w1[0].is_packed());
  EXPECT_TRUE(mq.w1[0].w.empty());
  EXPECT_FALSE(mp.w1[0].is_packed());
  EXPECT_FALSE(mq.s_w1.is_packed());  // only F4 is held packed
  EXPECT_EQ(mq.w1[0].packed.size() * 2, mp.w1[0].w.size());
  for (size_t e = 0; e < mp.w1.size(); ++e) {
    for (const auto& [a, b] : {std::pair{&mp.w1[e], &mq.w1[e]}, std::pair{&mp.w2[e], &mq.w2[e]}}) {
      const reference::Tensor<float> x = random_bf16(5, a->in, static_cast<uint32_t>(e + 1));
      const reference::Tensor<float> ya = reference::linear(x, *a), yb = reference::linear(x, *b);
      expect_finite_not_all_zero(ya.data(), a->name);
      EXPECT_TRUE(same_bits(ya.data(), yb.data())) << a->name;
      EXPECT_TRUE(same_bits(reference::linear_fp32(x, *a).data(), reference::linear_fp32(x, *b).data())) << a->name;
    }
  }
  reference::LinearWeight bad = mq.w1[0];
  bad.packed.pop_back();
  EXPECT_THROW(reference::linear(random_bf16(1, bad.in, 1), bad), Error);
}

// The generator's fp4 codes by thresholds are the encoder's for every one of the 2^24 draws.
TEST(Generator, Fp4CodeByThresholdsIsTheEncodersForEveryDraw) {
  int64_t differ = 0, nonzero = 0;
  for (int64_t k = -(int64_t{1} << 23); k < (int64_t{1} << 23); ++k) {
    const uint8_t want = formats::e2m1_encode(6.0f * (static_cast<float>(k) * 0x1p-23f));
    const uint8_t got = reference::checkpoint::generated_fp4_code(k);
    differ += got != want;
    nonzero += (want & 0x7) != 0;
  }
  EXPECT_EQ(differ, 0);
  EXPECT_GT(nonzero, int64_t{1} << 23);
  EXPECT_EQ(reference::checkpoint::uniform_numerator(0), -(int64_t{1} << 23));
  EXPECT_EQ(reference::checkpoint::uniform_numerator(~uint64_t{0}), (int64_t{1} << 23) - 1);
}

TEST(PackedF4, EveryKindForwardsTheSameBitsPackedOrNot) {
  const ModelConfig tiny = reference::load_config("tiny");
  const std::vector<int64_t> prompt = {5, 17, 300, 2, 911, 64};
  for (const LayerKind& k : layer_kinds()) {
    SCOPED_TRACE(k.name);
    const ModelConfig c = kind_config(tiny, k, "tiny");
    const reference::checkpoint::safetensors::SafetensorsFile f =
        reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated", reference::checkpoint::generate_weights(c, 1));
    const std::vector<int64_t> map = reference::model::default_token_map(c);
    const reference::model::Model a(c, reference::checkpoint::ModelWeights::load(f, c, false), map);
    const reference::model::Model b(c, reference::checkpoint::ModelWeights::load(f, c, true), map);
    reference::model::ModelState sa = a.new_state(), sb = b.new_state();
    reference::model::StepRecord ra = a.prefill(sa, prompt), rb = b.prefill(sb, prompt);
    for (int step = 0; step < 3; ++step) {
      expect_finite_not_all_zero(ra.logits, "logits");
      ASSERT_TRUE(same_bits(ra.logits, rb.logits)) << "step " << step;
      ASSERT_TRUE(ra.experts.count(k.role == LayerRole::kDSpark ? 0 : k.target));
      if (k.role == LayerRole::kReindex || k.role == LayerRole::kFull) {
        EXPECT_TRUE(ra.topk.count(k.target));
      }
      if (k.engram) {
        EXPECT_TRUE(ra.engram_ids.count(k.target));
      }
      const int64_t next = (step * 131 + 7) % c.vocab_size;
      ra = a.decode(sa, next);
      rb = b.decode(sb, next);
    }
    if (k.role == LayerRole::kDSpark) {
      const reference::model::DraftResult da = a.draft(sa, 3, reference::model::DraftSampling{});
      const reference::model::DraftResult db = b.draft(sb, 3, reference::model::DraftSampling{});
      expect_finite_not_all_zero(da.logits.data(), "draft logits");
      EXPECT_TRUE(same_bits(da.logits.data(), db.logits.data()));
      EXPECT_EQ(da.tokens, db.tokens);
    }
  }
}

}  // namespace
}  // namespace dsv41::scenarios::runner
