// reference/ops/config.h
//
// ModelConfig: the model configuration of DeepSeek-V4.1-Flash as the released `config.json` writes
// it (keys = the upstream ModelArgs fields, one member per key, same names), its loading and
// validation, a stable hash, and the layer schedule (which layer owns or reuses which cache).
//
// Loading contract:
//   - The JSON root is an object. Every key must be a known field: an unknown or duplicated key is
//     an error naming it (a typo never falls back to a default).
//   - The keys of the released config are required. Five runtime keys that the released file
//     omits are optional, with the upstream defaults: max_batch_size 4, max_seq_len 4096,
//     temperature 1.0, gate_temp 1.0, norm_topk_prob true.
//   - Integer fields take JSON integers (that fit in the member); real fields take any number.
//   - After parsing, validate() checks shapes and cross-field rules (docs/config.md lists them).
//   Every failure throws dsv41::Error "config <source>: field '<key>': <reason>".
//
// Presets "tiny" (shared/oracle/config.json) and "full" (the released config_full.json) are
// compiled into the library, so the binary needs no source tree.
//
// config_hash() is FNV-1a 64 over a canonical serialization of the parsed values (integers in
// decimal, reals as their IEEE-754 bits, fields in declaration order): the same on every platform
// and run, and equal for two files that parse to the same config (e.g. `16` vs `16.0`).
//
// Example:
//   ModelConfig c = load_config("full");            // or a path to a config.json
//   for (const LayerInfo& l : layer_schedule(c)) ...  // SWA only, Full, Reindex, Reuse, DSpark
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsv41::reference {

enum class WeightDtype : uint8_t { kBf16, kFp8 };    // "bf16", "fp8"
enum class ExpertDtype : uint8_t { kDefault, kFp4 };  // null (experts use `dtype`), "fp4"
enum class ScoreFunc : uint8_t { kSoftmax, kSigmoid, kSqrtSoftplus };

const char* name(WeightDtype d);
const char* name(ExpertDtype d);  // "null" for kDefault
const char* name(ScoreFunc f);

struct ModelConfig {
  // runtime limits (optional keys; upstream defaults)
  int max_batch_size = 4;
  int max_seq_len = 4096;
  double temperature = 1.0;
  // weights
  WeightDtype dtype = WeightDtype::kFp8;
  ExpertDtype expert_dtype = ExpertDtype::kFp4;
  // shape
  int vocab_size = 0;
  int dim = 0;
  int moe_inter_dim = 0;
  int n_layers = 0;
  int n_mtp_layers = 0;  // DSpark blocks, layer ids n_layers .. n_layers + n_mtp_layers - 1
  int n_heads = 0;
  // MoE
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_activated_experts = 0;
  ScoreFunc score_func = ScoreFunc::kSqrtSoftplus;
  double gate_temp = 1.0;       // optional
  bool norm_topk_prob = true;   // optional
  double route_scale = 0.0;
  double swiglu_limit = 0.0;    // 0 disables the clamp
  // attention
  int q_lora_rank = 0;
  int head_dim = 0;
  int rope_head_dim = 0;
  double norm_eps = 0.0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int window_size = 0;
  std::vector<int> compress_ratios;      // [n_layers + n_mtp_layers], each 0, 1 or 2
  std::vector<int> kv_source_layers;     // ascending; own a compressor and the index-key cache
  std::vector<int> index_source_layers;  // ascending; run their own indexer
  // RoPE (YaRN on compressed layers when original_seq_len > 0)
  double compress_rope_theta = 0.0;
  int original_seq_len = 0;
  double rope_theta = 0.0;
  double rope_factor = 0.0;
  int beta_fast = 0;
  int beta_slow = 0;
  // indexer and candidate pre-filter (candidate_source_layer -1: no pre-filter)
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  // hyper-connections
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;
  // Engram
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // one table size per engram layer
  int engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int engram_pad_id = 0;
  int engram_compressed_vocab_size = 0;
  // vision (vision_n_layers 0 disables it)
  int vision_n_layers = 0;
  int vision_dim = 0;
  int vision_n_heads = 0;
  int vision_inter_dim = 0;
  int vision_patch_size = 0;
  double vision_rope_theta = 0.0;
  int vision_downsample_ratio = 0;
  int vision_max_n_token = 0;
  int vision_min_pixels = 0;
  std::optional<int> vision_max_wh_ratio;  // JSON null: no limit
  int image_token_id = 0;
  // DSpark draft head
  int dspark_block_size = 0;
  int dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;     // 0: same as n_routed_experts
  int dspark_n_activated_experts = 0;  // 0: same as n_activated_experts

  bool operator==(const ModelConfig&) const = default;

  int total_layers() const { return n_layers + n_mtp_layers; }
};

// Parses and validates. `source` names the input in error messages (a path or "preset 'tiny'").
ModelConfig parse_config(const std::string& json_text, const std::string& source);
ModelConfig load_config_file(const std::string& path);
ModelConfig load_config_preset(const std::string& name);
// A preset name if `file_or_preset` is one, else a path.
ModelConfig load_config(const std::string& file_or_preset);

std::vector<std::string> preset_names();             // {"tiny", "full"}
const std::string& preset_json(const std::string& name);  // the embedded file text

// Throws on the first rule the config breaks (docs/config.md). parse_config calls it.
void validate(const ModelConfig& c, const std::string& source = "in memory");

// Every field, in declaration order, with its JSON key (reals keep full precision).
std::string to_json_string(const ModelConfig& c, int indent = 2);
// 16 lowercase hex digits.
std::string config_hash(const ModelConfig& c);

// ---- layer schedule (semantics.md 2.1; the shared-attention runtime of the official code) ----

enum class LayerRole : uint8_t {
  kSwaOnly,  // ratio 0 backbone layer: sliding window only
  kFull,     // kv source: owns a compressor, the compressed KV and index-key caches, an indexer
  kReindex,  // index source that is not a kv source: own indexer over its kv owner's index keys
  kReuse,    // reads its kv owner's caches and its topk owner's top-k
  kDSpark,   // DSpark block (layer id >= n_layers)
};
const char* name(LayerRole r);

struct LayerInfo {
  int layer = 0;
  LayerRole role = LayerRole::kSwaOnly;
  int ratio = 0;
  int kv_owner = -1;    // kv source whose compressed KV / index keys it reads (itself if Full)
  int topk_owner = -1;  // index source whose top-k it uses (itself if Full or Reindex)
  bool candidate_source = false;  // publishes the candidate block mask
  bool uses_candidates = false;   // an indexer after the candidate source: masks its scores
  bool engram = false;            // Engram applied to the stream before this block
};

// [total_layers()] one entry per layer; requires a validated config.
std::vector<LayerInfo> layer_schedule(const ModelConfig& c);

}  // namespace dsv41::reference
