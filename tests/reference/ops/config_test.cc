// ModelConfig loading (presets, files, errors of the input itself), the stable hash, the JSON
// round trip and the layer schedule of the tiny and released configs.
#include "reference/ops/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"

namespace dsv41::reference {
namespace {

const std::string kOracleDir = DSV41_ORACLE_DIR;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/dsv41_config_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Replaces the first occurrence of `from` (which must exist) in `text`.
std::string replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// The oracle copies are part of the repository (golden/oracle); their absence is a failure.
void require_oracle() {
  ASSERT_TRUE(std::filesystem::exists(kOracleDir + "/config.json")) << "missing " << kOracleDir;
}

TEST(ConfigLoad, TinyPresetValues) {
  const ModelConfig c = load_config("tiny");
  EXPECT_EQ(c.n_layers, 10);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.index_head_dim, 64);
  EXPECT_EQ(c.window_size, 64);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0}));
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 4, 6, 8}));
  EXPECT_EQ(c.score_func, ScoreFunc::kSqrtSoftplus);
  EXPECT_EQ(c.dtype, WeightDtype::kFp8);
  EXPECT_EQ(c.expert_dtype, ExpertDtype::kFp4);
  EXPECT_EQ(c.temperature, 0.0);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{4064, 4944}));
  EXPECT_FALSE(c.vision_max_wh_ratio.has_value());
}

TEST(ConfigLoad, FullPresetValuesAndOptionalDefaults) {
  const ModelConfig c = load_config("full");
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.rope_factor, 16.0);           // written as the integer 16
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  // The released file omits these five keys: upstream ModelArgs defaults.
  EXPECT_EQ(c.max_batch_size, 4);
  EXPECT_EQ(c.max_seq_len, 4096);
  EXPECT_EQ(c.temperature, 1.0);
  EXPECT_EQ(c.gate_temp, 1.0);
  EXPECT_TRUE(c.norm_topk_prob);
}

TEST(ConfigLoad, PresetsEqualTheOracleFiles) {
  require_oracle();
  EXPECT_EQ(preset_json("tiny"), read_text(kOracleDir + "/config.json"));
  EXPECT_EQ(preset_json("full"), read_text(kOracleDir + "/config_full.json"));
  EXPECT_EQ(load_config("tiny"), load_config_file(kOracleDir + "/config.json"));
  EXPECT_EQ(load_config("full"), load_config(kOracleDir + "/config_full.json"));
}

TEST(ConfigLoad, PresetSourcesEqualTheOracleFiles) {
  require_oracle();
  EXPECT_EQ(read_text(std::string(DSV41_SOURCE_DIR) + "/reference/presets/tiny.json"),
            read_text(kOracleDir + "/config.json"));
  EXPECT_EQ(read_text(std::string(DSV41_SOURCE_DIR) + "/reference/presets/full.json"),
            read_text(kOracleDir + "/config_full.json"));
}

TEST(ConfigLoad, PresetNames) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"tiny", "full"}));
  EXPECT_TRUE(has(error_of([] { load_config_preset("huge"); }), "unknown preset 'huge'"));
}

TEST(ConfigLoad, UnknownPresetWithoutFile) {
  const std::string e = error_of([] { load_config("tinyy"); });
  EXPECT_TRUE(has(e, "unknown preset 'tinyy' (presets: tiny, full)")) << e;
}

TEST(ConfigLoad, MissingFile) {
  const std::string e = error_of([] { load_config("/nonexistent/dir/config.json"); });
  EXPECT_TRUE(has(e, "config file '/nonexistent/dir/config.json': cannot open")) << e;
}

TEST(ConfigLoad, DirectoryIsNotAFile) {
  const std::string e = error_of([] { load_config_file(testing::TempDir()); });
  EXPECT_TRUE(has(e, "is a directory")) << e;
}

TEST(ConfigLoad, MalformedJsonGivesThePosition) {
  const std::string path = write_temp("malformed.json", "{\n  \"dim\": 256,\n  oops\n}\n");
  const std::string e = error_of([&] { load_config(path); });
  EXPECT_TRUE(has(e, "config file '" + path + "': not valid JSON: ")) << e;
  EXPECT_TRUE(has(e, "line 3, column 3")) << e;
}

TEST(ConfigLoad, TruncatedJson) {
  const std::string path = write_temp("truncated.json", preset_json("tiny").substr(0, 100));
  EXPECT_TRUE(has(error_of([&] { load_config(path); }), "not valid JSON")) << path;
}

TEST(ConfigLoad, RootMustBeAnObject) {
  const std::string e = error_of([] { parse_config("[1, 2]", "test"); });
  EXPECT_TRUE(has(e, "config test: the JSON root must be an object, got array")) << e;
}

TEST(ConfigLoad, DuplicateKeyIsAnError) {
  const std::string text =
      replace(preset_json("tiny"), "\"dim\": 256,", "\"dim\": 256, \"dim\": 512,");
  const std::string e = error_of([&] { parse_config(text, "test"); });
  EXPECT_TRUE(has(e, "config test: field 'dim': duplicate key")) << e;
}

TEST(ConfigLoad, FileErrorsNameTheFile) {
  const std::string text = replace(preset_json("tiny"), "\"head_dim\": 128", "\"head_dim\": 100");
  const std::string path = write_temp("bad_head_dim.json", text);
  const std::string e = error_of([&] { load_config(path); });
  EXPECT_TRUE(has(e, "config file '" + path + "': field 'head_dim': ")) << e;
}

TEST(ConfigHash, StableAcrossLoads) {
  const ModelConfig tiny = load_config("tiny");
  EXPECT_EQ(config_hash(tiny), config_hash(load_config("tiny")));
  EXPECT_EQ(config_hash(tiny).size(), 16u);
  EXPECT_EQ(config_hash(tiny).find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(ConfigHash, DependsOnValuesNotSpelling) {
  const std::string text = preset_json("tiny");
  const ModelConfig base = parse_config(text, "test");
  const std::string spelled = replace(replace(text, "\"rope_factor\": 16", "\"rope_factor\": 16.0"),
                                      "\"route_scale\": 1.5", "\"route_scale\": 15e-1");
  EXPECT_EQ(config_hash(parse_config(spelled, "test")), config_hash(base));
  const std::string changed = replace(text, "\"route_scale\": 1.5", "\"route_scale\": 1.25");
  EXPECT_NE(config_hash(parse_config(changed, "test")), config_hash(base));
  EXPECT_NE(config_hash(load_config("full")), config_hash(base));
}

TEST(ConfigHash, OptionalKeyWrittenAtItsDefaultHashesTheSame) {
  const std::string text = replace(preset_json("full"), "\"vocab_size\": 129280,",
                                   "\"vocab_size\": 129280, \"gate_temp\": 1.0,");
  EXPECT_EQ(config_hash(parse_config(text, "test")), config_hash(load_config("full")));
}

TEST(ConfigJson, RoundTripsEveryField) {
  for (const std::string& p : preset_names()) {
    const ModelConfig c = load_config(p);
    EXPECT_EQ(parse_config(to_json_string(c), "round trip"), c) << p;
  }
}

TEST(ConfigLayerSchedule, Tiny) {
  const std::vector<LayerInfo> s = layer_schedule(load_config("tiny"));
  ASSERT_EQ(s.size(), 11u);
  struct Want { LayerRole role; int ratio, kv_owner, topk_owner; };
  using R = LayerRole;
  const Want want[] = {{R::kSwaOnly, 0, -1, -1}, {R::kSwaOnly, 0, -1, -1}, {R::kFull, 2, 2, 2},
                       {R::kReuse, 2, 2, 2},     {R::kFull, 2, 4, 4},      {R::kReuse, 2, 4, 4},
                       {R::kFull, 1, 6, 6},      {R::kReuse, 1, 6, 6},     {R::kReindex, 1, 6, 8},
                       {R::kReuse, 1, 6, 8},     {R::kDSpark, 0, -1, -1}};
  for (int l = 0; l < 11; ++l) {
    EXPECT_EQ(s[l].layer, l);
    EXPECT_EQ(s[l].role, want[l].role) << "layer " << l << " is " << name(s[l].role);
    EXPECT_EQ(s[l].ratio, want[l].ratio) << "layer " << l;
    EXPECT_EQ(s[l].kv_owner, want[l].kv_owner) << "layer " << l;
    EXPECT_EQ(s[l].topk_owner, want[l].topk_owner) << "layer " << l;
    EXPECT_EQ(s[l].candidate_source, l == 6) << "layer " << l;
    EXPECT_EQ(s[l].uses_candidates, l == 8) << "layer " << l;
    EXPECT_EQ(s[l].engram, l == 1 || l == 4) << "layer " << l;
  }
}

TEST(ConfigLayerSchedule, Released) {
  const std::vector<LayerInfo> s = layer_schedule(load_config("full"));
  ASSERT_EQ(s.size(), 43u);
  for (const LayerInfo& i : s) {
    const int l = i.layer;
    SCOPED_TRACE("layer " + std::to_string(l));
    if (l <= 1) {
      EXPECT_EQ(i.role, LayerRole::kSwaOnly);
    } else if (l >= 40) {
      EXPECT_EQ(i.role, LayerRole::kDSpark);
    } else if (l == 2 || l == 8 || l == 14) {
      EXPECT_EQ(i.role, LayerRole::kFull);
      EXPECT_EQ(i.ratio, 2);
    } else if (l == 20) {
      EXPECT_EQ(i.role, LayerRole::kFull);
      EXPECT_EQ(i.ratio, 1);
      EXPECT_TRUE(i.candidate_source);
    } else if (l == 24 || l == 28 || l == 32 || l == 36) {
      EXPECT_EQ(i.role, LayerRole::kReindex);
      EXPECT_EQ(i.kv_owner, 20);
      EXPECT_TRUE(i.uses_candidates);
    } else {
      EXPECT_EQ(i.role, LayerRole::kReuse);
      // Reuse of the group's latest index source: 2, 8, 14, 20, then 24, 28, 32, 36.
      const int owner = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : l < 24 ? 20 : l / 4 * 4;
      EXPECT_EQ(i.topk_owner, owner);
      EXPECT_EQ(i.kv_owner, l < 20 ? owner : 20);
    }
    EXPECT_EQ(i.engram, l == 1 || l == 14);
  }
}

}  // namespace
}  // namespace dsv41::reference
