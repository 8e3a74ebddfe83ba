// A config's derived sizes (reference/ops/config_footprint.h, issue 35 class 5): equal to the sums
// over the checkpoint's tensor list, and a config whose fields are each within their limits but
// whose products are absurd is refused by validate() at once, naming the config and the size.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "reference/checkpoint/weights.h"
#include "reference/ops/config.h"
#include "reference/ops/config_footprint.h"
#include "reference/ops/dtype.h"

namespace dsv41::reference {
namespace {

std::string error_of_parse(const std::string& text) {
  try {
    parse_config(text, "file 'absurd.json'");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The tiny preset with n_layers and n_routed_experts replaced (the schedule's lists kept valid).
std::string tiny_with(int n_layers, int experts) {
  nlohmann::json c = nlohmann::json::parse(preset_json("tiny"));
  std::vector<int> ratios = c["compress_ratios"].get<std::vector<int>>();
  ratios.pop_back();  // the MTP layer's
  ratios.resize(static_cast<size_t>(n_layers) + 1, 0);
  c["n_layers"] = n_layers;
  c["compress_ratios"] = ratios;
  c["n_routed_experts"] = experts;
  return c.dump();
}

TEST(ConfigFootprint, MatchesTheTensorList) {
  std::vector<ModelConfig> configs = {load_config_preset("tiny"), load_config_preset("full"),
                                      load_config_file(std::string(DSV41_ORACLE_DIR) + "/config.json")};
  for (const ModelConfig& c : configs) {
    uint64_t bytes = 0, count = 0;
    for (const checkpoint::TensorSpec& t : checkpoint::expected_tensors(c)) {
      uint64_t n = 1;
      for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
      bytes += n * static_cast<uint64_t>(dtype_bits(t.dtype)) / 8;
      ++count;
    }
    const ConfigFootprint f = config_footprint(c, "test");
    ASSERT_GT(count, 0u);
    EXPECT_EQ(f.n_tensors, count) << c.n_layers << " layers";
    EXPECT_EQ(f.weight_bytes, bytes) << c.n_layers << " layers";
    EXPECT_GT(f.state_bytes, 0u);
    EXPECT_LE(f.n_tensors, kMaxConfigTensors);
    EXPECT_LE(f.weight_bytes, kMaxConfigWeightBytes);
  }
}

TEST(ConfigFootprint, AbsurdProductsAreRefusedAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  // 65536 layers x 65536 experts: every field within its own limit, 2^34 expert tensors.
  const std::string e = error_of_parse(tiny_with(65536, 65536));
  EXPECT_NE(e.find("config file 'absurd.json': derived size: "), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint tensors, more than the limit of 1048576"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  // A config within every limit still parses (the limits are far above the full model).
  EXPECT_EQ(error_of_parse(tiny_with(12, 8)), "");
}

TEST(ConfigFootprint, EngramTablesHaveALimit) {
  nlohmann::json c = nlohmann::json::parse(preset_json("tiny"));
  c["engram_num_embeddings"] = {4064, int64_t{1} << 40};
  const std::string e = error_of_parse(c.dump());
  EXPECT_NE(e.find("field 'engram_num_embeddings': must be at most 4294967296, got 1099511627776"), std::string::npos)
      << e;
}

TEST(ConfigFootprint, AMachineTooSmallIsNamedBeforeAllocating) {
  // The full preset's weights (~10^12 bytes) against this machine's memory: refused or fitting,
  // never allocated here (the message names the sizes and the machine's memory).
  const ModelConfig full = load_config_preset("full");
  const ConfigFootprint f = config_footprint(full, "preset 'full'");
  try {
    check_fits_machine(full, "preset 'full'");
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("preset 'full': its weights (" + std::to_string(f.weight_bytes) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("physical memory"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace dsv41::reference
