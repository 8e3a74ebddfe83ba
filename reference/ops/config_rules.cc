// The validation rules of ModelConfig and the layer schedule that follows from a valid config
// (declared in reference/ops/config.h; docs/config.md lists the rules with their reasons).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/input_file.h"
#include "reference/ops/config_footprint.h"
#include "reference/ops/config.h"

namespace dsv41::reference {
namespace {

std::string list(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The last layer of `sources` at or before `layer`, or -1. The official code hands caches and
// top-k down the stack through one slot each, so a layer reads the most recent source.
int latest_at_or_before(const std::vector<int>& sources, int layer) {
  int found = -1;
  for (int s : sources) {
    if (s <= layer) found = std::max(found, s);
  }
  return found;
}

class Rules {
 public:
  Rules(const ModelConfig& c, const std::string& source) : c_(c), source_(source) {}

  template <typename... Args>
  [[noreturn]] void fail(const char* field, Args&&... args) const {
    DSV41_FAIL("config ", source_, ": field '", field, "': ", std::forward<Args>(args)...);
  }
  void positive(const char* f, int64_t v) const {
    if (v <= 0) fail(f, "must be positive, got ", v);
  }
  void non_negative(const char* f, int64_t v) const {
    if (v < 0) fail(f, "must be >= 0, got ", v);
  }
  void positive_real(const char* f, double v) const {
    if (!(v > 0.0) || !std::isfinite(v)) fail(f, "must be a positive finite number, got ", v);
  }
  void non_negative_real(const char* f, double v) const {
    if (!(v >= 0.0) || !std::isfinite(v)) fail(f, "must be a finite number >= 0, got ", v);
  }
  void multiple_of(const char* f, int64_t v, int m, const char* why) const {
    if (v % m != 0) fail(f, "must be a multiple of ", m, " (", why, "), got ", v);
  }
  void quantized_dim(const char* f, int v, int m, const char* why) const {
    positive(f, v);
    multiple_of(f, v, m, why);
  }
  // Strictly ascending layer ids in [0, end).
  void layer_list(const char* f, const std::vector<int>& ids, int end, const char* what) const {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= end) {
        fail(f, "layer ", ids[i], " is out of range [0, ", end, ") (", what, ")");
      }
      if (i > 0 && ids[i] <= ids[i - 1]) {
        fail(f, "must be strictly ascending without repeats, got ", list(ids));
      }
    }
  }

  void run() const {
    limits();
    runtime_and_shape();
    moe();
    attention();
    schedule();
    candidates();
    rope();
    engram();
    vision();
    dspark();
    footprint();
  }

 private:
  // Upper limits (docs/cli.md "Limits"), checked first: with them no size product dsv41 forms
  // overflows, and nothing is allocated for a config no machine could hold.
  void at_most(const char* f, int64_t v, int64_t limit) const {
    if (v > limit) fail(f, "must be at most ", limit, ", got ", v);
  }
  void limits() const {
    constexpr int64_t kMaxSize = int64_t{1} << 20;   // a dimension, a vocabulary, a context
    constexpr int64_t kMaxCount = int64_t{1} << 16;  // layers, heads, experts, iterations
    // A context of 2^20 tokens plus the turns after it (docs/scale.md: the million-token session).
    constexpr int64_t kMaxContext = int64_t{1} << 21;
    at_most("max_seq_len", c_.max_seq_len, kMaxContext);
    for (const auto& [f, v] :
         {std::pair<const char*, int64_t>{"vocab_size", c_.vocab_size},
          {"dim", c_.dim}, {"moe_inter_dim", c_.moe_inter_dim}, {"q_lora_rank", c_.q_lora_rank},
          {"head_dim", c_.head_dim}, {"rope_head_dim", c_.rope_head_dim}, {"o_lora_rank", c_.o_lora_rank},
          {"window_size", c_.window_size}, {"original_seq_len", c_.original_seq_len},
          {"index_head_dim", c_.index_head_dim}, {"index_topk", c_.index_topk},
          {"candidate_topk_blocks", c_.candidate_topk_blocks}, {"candidate_block_size", c_.candidate_block_size},
          {"engram_head_dim", c_.engram_head_dim}, {"engram_compressed_vocab_size", c_.engram_compressed_vocab_size},
          {"vision_dim", c_.vision_dim}, {"vision_inter_dim", c_.vision_inter_dim},
          {"dspark_markov_rank", c_.dspark_markov_rank}, {"dspark_block_size", c_.dspark_block_size}}) {
      at_most(f, v, kMaxSize);
    }
    for (const auto& [f, v] :
         {std::pair<const char*, int64_t>{"max_batch_size", c_.max_batch_size}, {"n_layers", c_.n_layers},
          {"n_mtp_layers", c_.n_mtp_layers}, {"n_heads", c_.n_heads}, {"n_routed_experts", c_.n_routed_experts},
          {"n_activated_experts", c_.n_activated_experts}, {"o_groups", c_.o_groups},
          {"index_n_heads", c_.index_n_heads}, {"hc_mult", c_.hc_mult}, {"hc_sinkhorn_iters", c_.hc_sinkhorn_iters},
          {"engram_n_heads", c_.engram_n_heads}, {"engram_max_ngram_size", c_.engram_max_ngram_size},
          {"vision_n_layers", c_.vision_n_layers}, {"vision_n_heads", c_.vision_n_heads},
          {"dspark_n_routed_experts", c_.dspark_n_routed_experts},
          {"dspark_n_activated_experts", c_.dspark_n_activated_experts}}) {
      at_most(f, v, kMaxCount);
    }
    at_most("engram_vocab_size", c_.engram_vocab_size, int64_t{1} << 32);
    for (int64_t rows : c_.engram_num_embeddings) at_most("engram_num_embeddings", rows, int64_t{1} << 32);
    // The largest tensors: the embedding and the attention projections' rows.
    if (int64_t{c_.vocab_size} * c_.dim > (int64_t{1} << 32)) {
      fail("vocab_size", "vocab_size x dim = ", int64_t{c_.vocab_size} * c_.dim,
           " embedding values, more than 2^32");
    }
    if (int64_t{c_.n_heads} * c_.head_dim > (int64_t{1} << 24)) {
      fail("head_dim", "n_heads x head_dim = ", int64_t{c_.n_heads} * c_.head_dim, ", more than 2^24");
    }
  }

  void runtime_and_shape() const {
    positive("max_batch_size", c_.max_batch_size);
    positive("max_seq_len", c_.max_seq_len);
    non_negative_real("temperature", c_.temperature);
    positive("vocab_size", c_.vocab_size);
    quantized_dim("dim", c_.dim, 32, "fp8 activation blocks of 32");
    positive("n_layers", c_.n_layers);
    non_negative("n_mtp_layers", c_.n_mtp_layers);
    positive("n_heads", c_.n_heads);
    positive("hc_mult", c_.hc_mult);
    positive("hc_sinkhorn_iters", c_.hc_sinkhorn_iters);
    positive_real("hc_eps", c_.hc_eps);
    positive_real("norm_eps", c_.norm_eps);
  }

  void moe() const {
    quantized_dim("moe_inter_dim", c_.moe_inter_dim, 32, "fp8/fp4 blocks of 32 along K");
    positive("n_routed_experts", c_.n_routed_experts);
    if (c_.n_shared_experts != 1) {
      fail("n_shared_experts", "must be 1 (the official MoE has exactly one shared expert), got ",
           c_.n_shared_experts);
    }
    positive("n_activated_experts", c_.n_activated_experts);
    if (c_.n_activated_experts > c_.n_routed_experts) {
      fail("n_activated_experts", c_.n_activated_experts, " exceeds n_routed_experts ",
           c_.n_routed_experts);
    }
    positive_real("gate_temp", c_.gate_temp);
    positive_real("route_scale", c_.route_scale);
    non_negative_real("swiglu_limit", c_.swiglu_limit);
  }

  void attention() const {
    quantized_dim("q_lora_rank", c_.q_lora_rank, 32, "fp8 activation blocks of 32");
    quantized_dim("head_dim", c_.head_dim, 16, "main KV FP4 blocks of 16");
    multiple_of("head_dim", c_.head_dim, 32, "SWA KV FP8 blocks of 32");
    quantized_dim("index_head_dim", c_.index_head_dim, 32, "indexer FP4 blocks of 32");
    positive("index_n_heads", c_.index_n_heads);
    positive("index_topk", c_.index_topk);
    positive("rope_head_dim", c_.rope_head_dim);
    if (c_.rope_head_dim % 2 != 0) {
      fail("rope_head_dim", "must be even (RoPE rotates channel pairs), got ", c_.rope_head_dim);
    }
    if (c_.rope_head_dim > c_.head_dim) {
      fail("rope_head_dim", c_.rope_head_dim, " exceeds head_dim ", c_.head_dim);
    }
    if (c_.rope_head_dim > c_.index_head_dim) {
      fail("rope_head_dim", c_.rope_head_dim, " exceeds index_head_dim ", c_.index_head_dim);
    }
    positive("o_groups", c_.o_groups);
    if (c_.n_heads % c_.o_groups != 0) {
      fail("o_groups", "must divide n_heads ", c_.n_heads, ", got ", c_.o_groups);
    }
    positive("o_lora_rank", c_.o_lora_rank);
    if (int64_t{c_.o_groups} * c_.o_lora_rank % 32 != 0) {
      fail("o_lora_rank", "o_groups * o_lora_rank = ", int64_t{c_.o_groups} * c_.o_lora_rank,
           " must be a multiple of 32 (fp8 activation blocks of wo_b), got o_lora_rank ",
           c_.o_lora_rank);
    }
    positive("window_size", c_.window_size);
  }

  void schedule() const {
    const int total = c_.total_layers();
    if (static_cast<int>(c_.compress_ratios.size()) != total) {
      fail("compress_ratios", "needs n_layers + n_mtp_layers = ", c_.n_layers, " + ",
           c_.n_mtp_layers, " = ", total, " entries, got ", c_.compress_ratios.size());
    }
    for (int l = 0; l < total; ++l) {
      const int r = c_.compress_ratios[l];
      if (r < 0 || r > 2) {
        fail("compress_ratios", "entry ", l, " is ", r,
             "; supported ratios are 0 (window only), 1 and 2");
      }
      if (l >= c_.n_layers && r != 0) {
        fail("compress_ratios", "entry ", l, " is DSpark block ", l - c_.n_layers,
             " and must be 0 (DSpark attention is window only), got ", r);
      }
    }
    layer_list("kv_source_layers", c_.kv_source_layers, c_.n_layers, "backbone layers only");
    layer_list("index_source_layers", c_.index_source_layers, c_.n_layers, "backbone layers only");
    for (int s : c_.kv_source_layers) {
      if (c_.compress_ratios[s] == 0) {
        fail("kv_source_layers", "layer ", s, " has compress ratio 0; a kv source compresses");
      }
      if (!contains(c_.index_source_layers, s)) {
        fail("index_source_layers", "must contain every kv source (", list(c_.kv_source_layers),
             "); layer ", s, " is missing");
      }
    }
    for (int s : c_.index_source_layers) {
      if (c_.compress_ratios[s] == 0) {
        fail("index_source_layers", "layer ", s, " has compress ratio 0; an indexer needs one");
      }
    }
    for (int l = 0; l < c_.n_layers; ++l) {
      const int r = c_.compress_ratios[l];
      if (r == 0) continue;
      const int kv = latest_at_or_before(c_.kv_source_layers, l);
      if (kv < 0 || c_.compress_ratios[kv] != r) {
        fail("kv_source_layers", "layer ", l, " (compress ratio ", r,
             ") needs a kv source of the same ratio at or before it; ",
             kv < 0 ? "there is none"
                    : "the latest is layer " + std::to_string(kv) + " with ratio " +
                          std::to_string(c_.compress_ratios[kv]));
      }
    }
    // The index-source side needs no check of its own: kv sources are index sources, so the
    // latest index source at or before a compressed layer is its kv owner or a later layer that
    // passed this same check.
  }

  void candidates() const {
    const int src = c_.candidate_source_layer;
    if (src == -1) return;  // no candidate pre-filter
    if (!contains(c_.kv_source_layers, src)) {
      fail("candidate_source_layer", "layer ", src, " is not a kv source (kv_source_layers = ",
           list(c_.kv_source_layers), "); use -1 for no candidate pre-filter");
    }
    if (c_.compress_ratios[src] != 1) {
      fail("candidate_source_layer", "layer ", src, " has compress ratio ",
           c_.compress_ratios[src], "; the candidate pre-filter is supported on ratio 1 only");
    }
    for (int s : c_.index_source_layers) {
      if (s > src && c_.compress_ratios[s] != c_.compress_ratios[src]) {
        fail("index_source_layers", "layer ", s, " runs an indexer after the candidate source ",
             src, " and must share its ratio ", c_.compress_ratios[src], ", got ",
             c_.compress_ratios[s]);
      }
    }
    positive("candidate_topk_blocks", c_.candidate_topk_blocks);
    positive("candidate_block_size", c_.candidate_block_size);
    const int64_t pool = int64_t{c_.candidate_topk_blocks} * c_.candidate_block_size;
    if (pool < c_.index_topk) {
      fail("candidate_topk_blocks", "candidate_topk_blocks * candidate_block_size = ", pool,
           " must be >= index_topk ", c_.index_topk,
           " (else a later indexer can pick non-candidate positions)");
    }
  }

  void rope() const {
    positive_real("rope_theta", c_.rope_theta);
    positive_real("compress_rope_theta", c_.compress_rope_theta);
    positive_real("rope_factor", c_.rope_factor);
    non_negative("original_seq_len", c_.original_seq_len);
    positive("beta_slow", c_.beta_slow);
    positive("beta_fast", c_.beta_fast);
    if (c_.beta_slow >= c_.beta_fast) {
      fail("beta_slow", "must be below beta_fast ", c_.beta_fast,
           " (the YaRN ramp runs from beta_fast down to beta_slow rotations), got ", c_.beta_slow);
    }
  }

  void engram() const {
    layer_list("engram_layer_ids", c_.engram_layer_ids, c_.n_layers, "backbone layers only");
    if (c_.engram_num_embeddings.size() != c_.engram_layer_ids.size()) {
      fail("engram_num_embeddings", "needs one table size per engram layer (",
           c_.engram_layer_ids.size(), "), got ", c_.engram_num_embeddings.size());
    }
    for (int64_t rows : c_.engram_num_embeddings) positive("engram_num_embeddings", rows);
    if (c_.engram_layer_ids.empty()) return;
    if (c_.engram_max_ngram_size < 2) {
      fail("engram_max_ngram_size", "must be >= 2 (n-gram orders 2..max), got ",
           c_.engram_max_ngram_size);
    }
    positive("engram_n_heads", c_.engram_n_heads);
    quantized_dim("engram_head_dim", c_.engram_head_dim, 32, "fp8 table scales per 32 values");
    positive("engram_vocab_size", c_.engram_vocab_size);
    positive("engram_compressed_vocab_size", c_.engram_compressed_vocab_size);
    if (c_.engram_pad_id < 0 || c_.engram_pad_id >= c_.vocab_size) {
      fail("engram_pad_id", "must be a token id in [0, vocab_size ", c_.vocab_size, "), got ",
           c_.engram_pad_id);
    }
  }

  void vision() const {
    non_negative("vision_n_layers", c_.vision_n_layers);
    non_negative("image_token_id", c_.image_token_id);
    if (c_.vision_max_wh_ratio) positive("vision_max_wh_ratio", *c_.vision_max_wh_ratio);
    if (c_.vision_n_layers == 0) return;
    positive("vision_dim", c_.vision_dim);
    positive("vision_n_heads", c_.vision_n_heads);
    positive("vision_inter_dim", c_.vision_inter_dim);
    positive("vision_patch_size", c_.vision_patch_size);
    positive_real("vision_rope_theta", c_.vision_rope_theta);
    positive("vision_downsample_ratio", c_.vision_downsample_ratio);
    positive("vision_max_n_token", c_.vision_max_n_token);
    positive("vision_min_pixels", c_.vision_min_pixels);
  }

  void dspark() const {
    non_negative("dspark_block_size", c_.dspark_block_size);
    non_negative("dspark_n_routed_experts", c_.dspark_n_routed_experts);
    non_negative("dspark_n_activated_experts", c_.dspark_n_activated_experts);
    layer_list("dspark_target_layer_ids", c_.dspark_target_layer_ids, c_.n_layers,
               "backbone layers only");
    if (c_.n_mtp_layers == 0) return;
    positive("dspark_block_size", c_.dspark_block_size);
    if (c_.dspark_target_layer_ids.empty()) {
      fail("dspark_target_layer_ids",
           "must name at least one backbone layer when n_mtp_layers > 0");
    }
    if (c_.dspark_noise_token_id < 0 || c_.dspark_noise_token_id >= c_.vocab_size) {
      fail("dspark_noise_token_id", "must be a token id in [0, vocab_size ", c_.vocab_size,
           "), got ", c_.dspark_noise_token_id);
    }
    positive("dspark_markov_rank", c_.dspark_markov_rank);
    // 0 means "same as the backbone" (upstream ModelArgs.get_moe_config).
    const int routed =
        c_.dspark_n_routed_experts ? c_.dspark_n_routed_experts : c_.n_routed_experts;
    const int active =
        c_.dspark_n_activated_experts ? c_.dspark_n_activated_experts : c_.n_activated_experts;
    if (active > routed) {
      fail("dspark_n_activated_experts", "DSpark activates ", active, " of ", routed,
           " routed experts; it cannot activate more than it has");
    }
  }

  // The derived sizes (reference/ops/config_footprint.h), last: every field is within its own limit
  // here, but their products may still be absurd (65536 layers x 65536 experts).
  void footprint() const {
    const ConfigFootprint f = config_footprint(c_, "config " + source_);
    if (f.n_tensors > kMaxConfigTensors) {
      DSV41_FAIL("config ", source_, ": derived size: ", f.n_tensors, " checkpoint tensors, more than the limit of ",
                 kMaxConfigTensors, " (2^20; docs/cli.md \"Limits\")");
    }
    if (f.weight_bytes > kMaxConfigWeightBytes) {
      DSV41_FAIL("config ", source_, ": derived size: ", f.weight_bytes, " bytes of weights (",
                 input::bytes_text(f.weight_bytes), "), more than the limit of 2^44 bytes (16 TiB; docs/cli.md \"Limits\")");
    }
    if (f.state_bytes > kMaxConfigStateBytes) {
      DSV41_FAIL("config ", source_, ": derived size: at least ", f.state_bytes, " bytes of caches per sequence (",
                 input::bytes_text(f.state_bytes), "), more than the limit of 2^44 bytes (16 TiB; docs/cli.md \"Limits\")");
    }
  }

  const ModelConfig& c_;
  const std::string& source_;
};

}  // namespace

const char* name(LayerRole r) {
  switch (r) {
    case LayerRole::kSwaOnly: return "swa_only";
    case LayerRole::kFull: return "full";
    case LayerRole::kReindex: return "reindex";
    case LayerRole::kReuse: return "reuse";
    case LayerRole::kDSpark: return "dspark";
  }
  return "?";
}

void validate(const ModelConfig& c, const std::string& source) { Rules(c, source).run(); }

std::vector<LayerInfo> layer_schedule(const ModelConfig& c) {
  DSV41_CHECK(static_cast<int>(c.compress_ratios.size()) == c.total_layers(),
              "layer_schedule needs a validated config: ", c.compress_ratios.size(),
              " compress ratios for ", c.total_layers(), " layers");
  std::vector<LayerInfo> out(c.total_layers());
  for (int l = 0; l < c.total_layers(); ++l) {
    LayerInfo& info = out[l];
    info.layer = l;
    info.ratio = c.compress_ratios[l];
    info.engram = contains(c.engram_layer_ids, l);
    if (l >= c.n_layers) {
      info.role = LayerRole::kDSpark;
      continue;
    }
    if (info.ratio == 0) {
      info.role = LayerRole::kSwaOnly;
      continue;
    }
    info.kv_owner = latest_at_or_before(c.kv_source_layers, l);
    info.topk_owner = latest_at_or_before(c.index_source_layers, l);
    info.role = info.kv_owner == l     ? LayerRole::kFull
                : info.topk_owner == l ? LayerRole::kReindex
                                       : LayerRole::kReuse;
    info.candidate_source = l == c.candidate_source_layer;
    info.uses_candidates =
        info.topk_owner == l && c.candidate_source_layer >= 0 && c.candidate_source_layer < l;
  }
  return out;
}

}  // namespace dsv41::reference
