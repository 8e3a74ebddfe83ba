// scenarios/agree/oracle_run.h
//
// OracleRun: one run of the official DeepSeek-V4.1-Flash code in the oracle folder format
// (shared/oracle/README.md; golden/oracle/, golden/runs/*/), opened for an agreement check
// (scenarios/agree/agree.h). What a folder holds:
//
//   config.json            the run's config (ModelArgs keys)
//   weights.safetensors    its weights, official names and dtypes
//   prefill.h5             prefill/: tokens, logits_last, per layer layerNN/ (selections:
//                          indexer_topk, candidates, gate_indices, engram_hash_ids; next_pre;
//                          optionally attn_out, ffn_out, hc_{attn,ffn}_{pre,post,comb}),
//                          state/engram/token_map
//   prefill_streams.h5     optional: prefill/embed and prefill/layerNN/out_stream (the layer outputs)
//   decode.h5              decode/stepK/ (K = 0, 1, ...: input_token, logits, embed, the same per
//                          layer items with out_stream), decode/final_state/ (every cache)
//   tie_lowest_index.h5    optional: the same run with the lowest-index tie rule, when the main
//                          files hold torch's tie order (golden/oracle); a run made with the
//                          lowest-index rule says so in its root attribute tie_rule
// The number of decode steps and layers, the roles and the shapes are read from the data and the
// config; nothing is assumed about a particular run. Only config.json, weights.safetensors,
// prefill.h5 (tokens, logits_last) and decode.h5 (input_token, logits per step) are required: the
// streams, the attention internals, the selections, the DSpark items and the final caches are each
// used where the run holds them (has_streams, has_final_state; docs/agreement.md, "Coverage").
// A missing required file or item is a dsv41::Error naming the folder, the file and the item.
//
// Example:
//   OracleRun run = OracleRun::open("golden/runs/w16_r2early_p520");
//   for (const OracleStep& s : run.steps()) ... s.prefix, s.tokens, s.logits ...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "golden/golden_io.h"
#include "reference/ops/config.h"
#include "reference/ops/tensor.h"

namespace dsv41::scenarios::agree {

// One forward call of the official run.
struct OracleStep {
  int64_t index = 0;            // 0: the prefill, k + 1: decode step k
  std::string phase;            // "prefill" or "decode"
  std::string prefix;           // "prefill/" or "decode/stepK/"
  int64_t start_pos = 0;
  std::vector<int64_t> tokens;  // the step's input tokens
  const golden::H5File* streams = nullptr;  // embed and layerNN/out_stream, where the run holds them
  const golden::H5File* items = nullptr;    // the other per-layer items and the logits
  std::string logits;           // the dataset of the last position's logits
  // The lowest-index-rule run's items of this step (== items when the main files are that run).
  const golden::H5File* tie_items = nullptr;
  std::string tie_logits;
};

class OracleRun {
 public:
  static OracleRun open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }  // the folder's name
  const reference::ModelConfig& config() const { return config_; }
  const std::string& weights_path() const { return weights_path_; }
  const std::vector<int64_t>& token_map() const { return token_map_; }
  // "lowest_index" (dsv41's rule) or "torch" (torch.topk's CPU order) for the main files.
  const std::string& tie_rule() const { return tie_rule_; }
  const std::vector<OracleStep>& steps() const { return steps_; }
  const golden::H5File& decode() const { return *decode_; }
  // Every step holds the embedding, every layer's out_stream and next_pre: what teacher-forcing needs.
  bool has_streams() const { return has_streams_; }
  // The caches after the last step (decode/final_state/, or prefill/state/ without decode steps).
  bool has_final_state() const { return has_final_state_; }
  // The final caches' group ("decode/final_state/"), or "" when the run has no decode steps.
  std::string final_state() const { return steps_.size() > 1 ? "decode/final_state/" : ""; }

  // Does `file` hold `item` (a group path such as "prefill/layer02/attn_out")?
  static bool has(const golden::H5File& file, const std::string& item) { return file.has(item); }

  // Items as tensors; bf16 items are read from their "bits" dataset, fp32 / integer ones from
  // "value". A missing item or another shape than `shape` (when not empty) is a dsv41::Error.
  static reference::Tensor<float> bf16(const golden::H5File& f, const std::string& item,
                                       const std::vector<int64_t>& shape = {});
  static reference::Tensor<float> f32(const golden::H5File& f, const std::string& item,
                                      const std::vector<int64_t>& shape = {});
  static reference::Tensor<int32_t> i32(const golden::H5File& f, const std::string& item,
                                        const std::vector<int64_t>& shape = {});
  static reference::Tensor<uint8_t> u8(const golden::H5File& f, const std::string& item,
                                       const std::vector<int64_t>& shape = {});

 private:
  std::string dir_, name_, weights_path_, tie_rule_;
  bool has_streams_ = false, has_final_state_ = false;
  reference::ModelConfig config_;
  std::vector<int64_t> token_map_;
  std::unique_ptr<golden::H5File> prefill_, streams_, decode_, tie_;
  std::vector<OracleStep> steps_;
};

// "layer07": the oracle's name of a layer's group.
std::string oracle_layer(int layer);

}  // namespace dsv41::scenarios::agree
