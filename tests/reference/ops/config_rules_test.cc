// Every rule of ModelConfig parsing and validation rejects a config that breaks it, with a message
// naming the field and the reason. Each case is the tiny preset with one change.
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "reference/ops/config.h"

namespace dsv41::reference {
namespace {

using Json = nlohmann::json;

struct BadConfig {
  const char* name;                   // PascalCase, the test's name
  std::function<void(Json&)> mutate;  // one change to the tiny preset
  const char* field;                  // the field the message must name
  const char* reason;                 // a substring of the reason
};

std::ostream& operator<<(std::ostream& os, const BadConfig& c) { return os << c.name; }

// Sets one key.
template <typename T>
std::function<void(Json&)> set(const char* key, T value) {
  return [key, value](Json& j) { j[key] = value; };
}

const BadConfig kCases[] = {
    // keys and JSON types
    {"MissingRequiredKey", [](Json& j) { j.erase("head_dim"); }, "head_dim",
     "missing required key"},
    {"UnknownKeyNamesTheTypo",
     [](Json& j) {
       j["head_dimm"] = j["head_dim"];
       j.erase("head_dim");
     },
     "head_dimm", "unknown key (did you mean 'head_dim'?)"},
    {"UnknownKeyFarFromAnyField", set("flash_attention", true), "flash_attention", "unknown key"},
    {"StringForInteger", set("dim", "256"), "dim", "expected an integer, got string"},
    {"RealForInteger", set("n_layers", 10.5), "n_layers", "expected an integer, got number"},
    {"IntegerOutOfRange", set("dim", int64_t{1} << 40), "dim", "out of range"},
    {"NegativeOutOfRangeForInt", set("vocab_size", -(int64_t{1} << 40)), "vocab_size",
     "out of range"},
    {"StringForReal", set("route_scale", "1.5"), "route_scale", "expected a number"},
    {"IntegerForBool", set("norm_topk_prob", 1), "norm_topk_prob", "expected true or false"},
    {"ScalarForArray", set("compress_ratios", 2), "compress_ratios", "expected an array"},
    {"RealInsideArray", [](Json& j) { j["kv_source_layers"][1] = 4.0; }, "kv_source_layers[1]",
     "expected an integer"},
    {"UnknownScoreFunc", set("score_func", "relu"), "score_func",
     "expected one of \"softmax\", \"sigmoid\", \"sqrtsoftplus\""},
    {"UnknownDtype", set("dtype", "fp16"), "dtype", "expected one of \"bf16\", \"fp8\""},
    {"UnknownExpertDtype", set("expert_dtype", "fp8"), "expert_dtype",
     "expected one of null, \"fp4\""},
    {"NullForInteger", set("window_size", nullptr), "window_size", "expected an integer, got null"},
    {"StringForNullableInt", set("vision_max_wh_ratio", "3"), "vision_max_wh_ratio",
     "expected an integer"},
    // runtime and shape
    {"ZeroMaxBatchSize", set("max_batch_size", 0), "max_batch_size", "must be positive"},
    {"ZeroMaxSeqLen", set("max_seq_len", 0), "max_seq_len", "must be positive"},
    {"NegativeTemperature", set("temperature", -1.0), "temperature", "finite number >= 0"},
    {"ZeroVocabSize", set("vocab_size", 0), "vocab_size", "must be positive"},
    {"ZeroDim", set("dim", 0), "dim", "must be positive"},
    {"DimNotMultipleOf32", set("dim", 240), "dim", "multiple of 32"},
    {"ZeroLayers", set("n_layers", 0), "n_layers", "must be positive"},
    {"NegativeMtpLayers", set("n_mtp_layers", -1), "n_mtp_layers", "must be >= 0"},
    {"ZeroHeads", set("n_heads", 0), "n_heads", "must be positive"},
    {"ZeroHcMult", set("hc_mult", 0), "hc_mult", "must be positive"},
    {"ZeroSinkhornIters", set("hc_sinkhorn_iters", 0), "hc_sinkhorn_iters", "must be positive"},
    {"ZeroHcEps", set("hc_eps", 0.0), "hc_eps", "positive finite number"},
    {"ZeroNormEps", set("norm_eps", 0.0), "norm_eps", "positive finite number"},
    // MoE
    {"MoeInterDimNotMultipleOf32", set("moe_inter_dim", 100), "moe_inter_dim", "multiple of 32"},
    {"ZeroRoutedExperts", set("n_routed_experts", 0), "n_routed_experts", "must be positive"},
    {"TwoSharedExperts", set("n_shared_experts", 2), "n_shared_experts", "must be 1"},
    {"ZeroActivatedExperts", set("n_activated_experts", 0), "n_activated_experts",
     "must be positive"},
    {"MoreActivatedThanRouted", set("n_activated_experts", 7), "n_activated_experts",
     "exceeds n_routed_experts 6"},
    {"ZeroGateTemp", set("gate_temp", 0.0), "gate_temp", "positive finite number"},
    {"ZeroRouteScale", set("route_scale", 0.0), "route_scale", "positive finite number"},
    {"NegativeSwigluLimit", set("swiglu_limit", -1.0), "swiglu_limit", "finite number >= 0"},
    // attention and quantized dims
    {"QLoraRankNotMultipleOf32", set("q_lora_rank", 100), "q_lora_rank", "multiple of 32"},
    {"ZeroHeadDim", set("head_dim", 0), "head_dim", "must be positive"},
    {"HeadDimNotMultipleOf16", set("head_dim", 120), "head_dim", "multiple of 16 (main KV FP4"},
    {"HeadDimNotMultipleOf32", set("head_dim", 144), "head_dim", "multiple of 32 (SWA KV FP8"},
    {"IndexHeadDimNotMultipleOf32", set("index_head_dim", 48), "index_head_dim",
     "multiple of 32 (indexer FP4"},
    {"ZeroIndexHeads", set("index_n_heads", 0), "index_n_heads", "must be positive"},
    {"ZeroIndexTopk", set("index_topk", 0), "index_topk", "must be positive"},
    {"ZeroRopeHeadDim", set("rope_head_dim", 0), "rope_head_dim", "must be positive"},
    {"OddRopeHeadDim", set("rope_head_dim", 31), "rope_head_dim", "must be even"},
    {"RopeHeadDimAboveHeadDim", set("rope_head_dim", 160), "rope_head_dim",
     "exceeds head_dim 128"},
    {"RopeHeadDimAboveIndexHeadDim", set("rope_head_dim", 96), "rope_head_dim",
     "exceeds index_head_dim 64"},
    {"ZeroOGroups", set("o_groups", 0), "o_groups", "must be positive"},
    {"OGroupsNotDividingHeads", set("o_groups", 3), "o_groups", "must divide n_heads 4"},
    {"ZeroOLoraRank", set("o_lora_rank", 0), "o_lora_rank", "must be positive"},
    {"OLoraRankBreaksFp8Blocks", set("o_lora_rank", 8), "o_lora_rank", "multiple of 32"},
    {"ZeroWindow", set("window_size", 0), "window_size", "must be positive"},
    // layer schedule
    {"RatiosTooShort", [](Json& j) { j["compress_ratios"].erase(10); }, "compress_ratios",
     "needs n_layers + n_mtp_layers = 10 + 1 = 11 entries, got 10"},
    {"RatioFourUnsupported", [](Json& j) { j["compress_ratios"][3] = 4; }, "compress_ratios",
     "entry 3 is 4; supported ratios are 0 (window only), 1 and 2"},
    {"NegativeRatio", [](Json& j) { j["compress_ratios"][0] = -1; }, "compress_ratios",
     "supported ratios"},
    {"DSparkBlockCompresses", [](Json& j) { j["compress_ratios"][10] = 1; }, "compress_ratios",
     "DSpark block 0 and must be 0"},
    {"KvSourceIsDSparkBlock", set("kv_source_layers", std::vector<int>{2, 4, 6, 10}),
     "kv_source_layers", "layer 10 is out of range [0, 10)"},
    {"KvSourcesNotAscending", set("kv_source_layers", std::vector<int>{4, 2, 6}),
     "kv_source_layers", "strictly ascending"},
    {"KvSourcesRepeat", set("kv_source_layers", std::vector<int>{2, 2, 4, 6}), "kv_source_layers",
     "strictly ascending"},
    {"IndexSourceOutOfRange", set("index_source_layers", std::vector<int>{-1, 2, 4, 6, 8}),
     "index_source_layers", "out of range"},
    {"KvSourceWithRatioZero", set("kv_source_layers", std::vector<int>{1, 2, 4, 6}),
     "kv_source_layers", "layer 1 has compress ratio 0"},
    {"KvSourceNotAnIndexSource", set("index_source_layers", std::vector<int>{2, 4, 8}),
     "index_source_layers", "must contain every kv source ([2, 4, 6]); layer 6 is missing"},
    {"IndexSourceWithRatioZero", set("index_source_layers", std::vector<int>{0, 2, 4, 6, 8}),
     "index_source_layers", "layer 0 has compress ratio 0"},
    {"CompressedLayerWithoutKvSource",
     [](Json& j) {
       j["kv_source_layers"] = {4, 6};
       j["index_source_layers"] = {4, 6, 8};
     },
     "kv_source_layers", "layer 2 (compress ratio 2) needs a kv source of the same ratio"},
    {"CompressedLayerReadsOtherRatio", [](Json& j) { j["compress_ratios"][7] = 2; },
     "kv_source_layers", "the latest is layer 6 with ratio 1"},
    // candidate pre-filter
    {"CandidateSourceNotKvSource", set("candidate_source_layer", 8), "candidate_source_layer",
     "layer 8 is not a kv source"},
    {"CandidateSourceBelowMinusOne", set("candidate_source_layer", -2), "candidate_source_layer",
     "is not a kv source"},
    {"CandidateSourceRatioTwo", set("candidate_source_layer", 2), "candidate_source_layer",
     "supported on ratio 1 only"},
    {"IndexerAfterCandidateSourceOtherRatio",
     [](Json& j) {
       j["compress_ratios"][8] = 2;
       j["compress_ratios"][9] = 2;
       j["kv_source_layers"] = {2, 4, 6, 8};
     },
     "index_source_layers", "layer 8 runs an indexer after the candidate source 6"},
    {"ZeroCandidateBlocks", set("candidate_topk_blocks", 0), "candidate_topk_blocks",
     "must be positive"},
    {"ZeroCandidateBlockSize", set("candidate_block_size", 0), "candidate_block_size",
     "must be positive"},
    {"CandidatePoolBelowIndexTopk", set("candidate_topk_blocks", 3), "candidate_topk_blocks",
     "= 24 must be >= index_topk 32"},
    // RoPE
    {"ZeroRopeTheta", set("rope_theta", 0.0), "rope_theta", "positive finite number"},
    {"ZeroCompressRopeTheta", set("compress_rope_theta", 0), "compress_rope_theta",
     "positive finite number"},
    {"NegativeRopeFactor", set("rope_factor", -16), "rope_factor", "positive finite number"},
    {"NegativeOriginalSeqLen", set("original_seq_len", -1), "original_seq_len", "must be >= 0"},
    {"ZeroBetaSlow", set("beta_slow", 0), "beta_slow", "must be positive"},
    {"ZeroBetaFast", set("beta_fast", 0), "beta_fast", "must be positive"},
    {"BetaSlowNotBelowBetaFast", set("beta_slow", 32), "beta_slow", "must be below beta_fast 32"},
    // Engram
    {"EngramLayerOutOfRange", set("engram_layer_ids", std::vector<int>{1, 10}), "engram_layer_ids",
     "layer 10 is out of range [0, 10)"},
    {"EngramLayersNotAscending", set("engram_layer_ids", std::vector<int>{4, 1}),
     "engram_layer_ids", "strictly ascending"},
    {"EngramTableCountMismatch", set("engram_num_embeddings", std::vector<int>{4064}),
     "engram_num_embeddings", "one table size per engram layer (2), got 1"},
    {"EngramEmptyTable", set("engram_num_embeddings", std::vector<int>{0, 4944}),
     "engram_num_embeddings", "must be positive"},
    {"EngramNgramBelowTwo", set("engram_max_ngram_size", 1), "engram_max_ngram_size",
     "must be >= 2"},
    {"EngramZeroHeads", set("engram_n_heads", 0), "engram_n_heads", "must be positive"},
    {"EngramHeadDimNotMultipleOf32", set("engram_head_dim", 48), "engram_head_dim",
     "multiple of 32"},
    {"EngramZeroVocab", set("engram_vocab_size", 0), "engram_vocab_size", "must be positive"},
    {"EngramZeroCompressedVocab", set("engram_compressed_vocab_size", 0),
     "engram_compressed_vocab_size", "must be positive"},
    {"EngramPadIdOutsideVocab", set("engram_pad_id", 1024), "engram_pad_id",
     "token id in [0, vocab_size 1024)"},
    // vision
    {"NegativeVisionLayers", set("vision_n_layers", -1), "vision_n_layers", "must be >= 0"},
    {"NegativeImageTokenId", set("image_token_id", -1), "image_token_id", "must be >= 0"},
    {"ZeroVisionMaxWhRatio", set("vision_max_wh_ratio", 0), "vision_max_wh_ratio",
     "must be positive"},
    {"VisionEnabledWithZeroDim",
     [](Json& j) {
       j["vision_n_layers"] = 2;
       j["vision_dim"] = 0;
     },
     "vision_dim", "must be positive"},
    // DSpark
    {"DSparkZeroBlockSize", set("dspark_block_size", 0), "dspark_block_size", "must be positive"},
    {"DSparkNegativeBlockSize", set("dspark_block_size", -5), "dspark_block_size", "must be >= 0"},
    {"DSparkTargetOutOfRange", set("dspark_target_layer_ids", std::vector<int>{7, 8, 10}),
     "dspark_target_layer_ids", "layer 10 is out of range [0, 10)"},
    {"DSparkNoTargets", set("dspark_target_layer_ids", std::vector<int>{}),
     "dspark_target_layer_ids", "at least one backbone layer"},
    {"DSparkNoiseTokenOutsideVocab", set("dspark_noise_token_id", 1024), "dspark_noise_token_id",
     "token id in [0, vocab_size 1024)"},
    {"DSparkZeroMarkovRank", set("dspark_markov_rank", 0), "dspark_markov_rank",
     "must be positive"},
    {"DSparkNegativeRoutedExperts", set("dspark_n_routed_experts", -1), "dspark_n_routed_experts",
     "must be >= 0"},
    {"DSparkMoreActivatedThanRouted", set("dspark_n_activated_experts", 5),
     "dspark_n_activated_experts", "DSpark activates 5 of 4 routed experts"},
    {"DSparkDefaultRoutedTooFew",
     [](Json& j) {
       j["dspark_n_routed_experts"] = 0;  // falls back to the backbone's 6
       j["dspark_n_activated_experts"] = 7;
     },
     "dspark_n_activated_experts", "DSpark activates 7 of 6 routed experts"},
};

class ConfigRejects : public testing::TestWithParam<BadConfig> {};

TEST_P(ConfigRejects, NamesFieldAndReason) {
  const BadConfig& c = GetParam();
  Json j = Json::parse(preset_json("tiny"));
  c.mutate(j);
  std::string message = "(no error)";
  try {
    parse_config(j.dump(), "mutant");
  } catch (const dsv41::Error& e) {
    message = e.what();
  }
  const std::string prefix = std::string("config mutant: field '") + c.field + "': ";
  EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
  EXPECT_NE(message.find(c.reason), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Rules, ConfigRejects, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<BadConfig>& info) {
                           return std::string(info.param.name);
                         });

// The counterparts of a few rules: what the rule allows must still load.
TEST(ConfigAccepts, CandidatePreFilterOff) {
  Json j = Json::parse(preset_json("tiny"));
  j["candidate_source_layer"] = -1;
  j["candidate_topk_blocks"] = 0;  // unused without a candidate source
  EXPECT_EQ(parse_config(j.dump(), "mutant").candidate_source_layer, -1);
}

TEST(ConfigAccepts, NoEngramLayers) {
  Json j = Json::parse(preset_json("tiny"));
  j["engram_layer_ids"] = Json::array();
  j["engram_num_embeddings"] = Json::array();
  j["engram_max_ngram_size"] = 0;  // unused without engram layers
  EXPECT_TRUE(parse_config(j.dump(), "mutant").engram_layer_ids.empty());
}

TEST(ConfigAccepts, NoDSparkBlocks) {
  Json j = Json::parse(preset_json("tiny"));
  j["n_mtp_layers"] = 0;
  j["compress_ratios"].erase(10);
  j["dspark_target_layer_ids"] = Json::array();
  EXPECT_EQ(parse_config(j.dump(), "mutant").total_layers(), 10);
}

TEST(ConfigAccepts, NullExpertDtypeAndWhRatio) {
  Json j = Json::parse(preset_json("tiny"));
  j["expert_dtype"] = nullptr;
  j["vision_max_wh_ratio"] = 4;
  const ModelConfig c = parse_config(j.dump(), "mutant");
  EXPECT_EQ(c.expert_dtype, ExpertDtype::kDefault);
  EXPECT_EQ(c.vision_max_wh_ratio, 4);
}

}  // namespace
}  // namespace dsv41::reference
