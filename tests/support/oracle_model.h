// tests/support/oracle_model.h
//
// The tiny oracle model the reference tests share: the tiny config, the official oracle weights,
// the oracle's 333 prompt tokens and its Engram token map (golden/oracle), loaded once per test
// process, with every position's logits computed (Model::set_full_logits). Also the byte image
// of the SWA rings, which several tests compare.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "golden/golden_io.h"
#include "reference/model/model.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::test {

inline const std::string kOracleDir = DSV41_SOURCE_DIR "/golden/oracle/";

struct OracleModel {
  reference::ModelConfig config;
  std::unique_ptr<reference::model::Model> model;
  std::vector<int64_t> tokens;     // [333] the oracle prompt
  std::vector<int64_t> token_map;  // [vocab] the oracle's Engram map
};

inline const OracleModel& oracle_model() {
  static const OracleModel m = [] {
    OracleModel x;
    x.config = reference::load_config_file(kOracleDir + "config.json");
    golden::H5File prefill(kOracleDir + "prefill.h5");
    x.tokens = prefill.read<int64_t>("prefill/tokens/value").data;
    x.token_map = prefill.read<int64_t>("prefill/state/engram/token_map/value").data;
    x.model = std::make_unique<reference::model::Model>(
        x.config, reference::checkpoint::ModelWeights::load(kOracleDir + "weights.safetensors", x.config), x.token_map);
    x.model->set_full_logits(true);
    return x;
  }();
  return m;
}

// Oracle prompt tokens [first, first + count).
inline std::vector<int64_t> oracle_tokens(int64_t first, int64_t count) {
  const std::vector<int64_t>& t = oracle_model().tokens;
  return {t.begin() + first, t.begin() + first + count};
}

// Every layer's SWA ring: packed bytes, then slot positions.
inline std::vector<uint8_t> ring_bytes(const reference::model::ModelState& s) {
  std::vector<uint8_t> out;
  for (const reference::model::LayerState& ls : s.layers) {
    out.insert(out.end(), ls.window_kv.bytes.data().begin(), ls.window_kv.bytes.data().end());
    const auto* b = reinterpret_cast<const uint8_t*>(ls.window_kv.positions.data());
    out.insert(out.end(), b, b + ls.window_kv.positions.size() * sizeof(int64_t));
  }
  return out;
}

}  // namespace dsv41::test
