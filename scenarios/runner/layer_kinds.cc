// scenarios/runner/layer_kinds.cc: the per-kind configs of the released dims (scenarios/runner/layer_kinds.h).
#include "scenarios/runner/layer_kinds.h"

#include <set>
#include <sstream>

#include "base/error.h"
#include "reference/ops/dtype.h"
#include "reference/ops/engram.h"
#include "reference/ops/tensor.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::scenarios::runner {

using reference::LayerRole;
using reference::ModelConfig;

const std::vector<LayerKind>& layer_kinds() {
  static const std::vector<LayerKind> kinds = {
      {"swa", "SWA only (compress ratio 0)", "0", 0, LayerRole::kSwaOnly, 0, false, false, false},
      {"full2", "Full, ratio 2: kv source (compressor, compressed KV, index keys, indexer)", "2, 8, 14", 0,
       LayerRole::kFull, 2, false, false, false},
      {"full1", "Full, ratio 1: kv source and the candidate source", "20", 0, LayerRole::kFull, 1, true, false,
       false},
      {"reuse2", "Reuse, ratio 2: reads layer 0's compressed KV and top-k", "3-7, 9-13, 15-19", 1, LayerRole::kReuse,
       2, false, false, false},
      {"reuse1", "Reuse, ratio 1: reads layer 0's compressed KV and top-k", "21-23, 25-27, 29-31, 33-35, 37-39", 1,
       LayerRole::kReuse, 1, false, false, false},
      {"reindex", "Reindex, ratio 1: its own indexer over layer 0's index keys, masked by 0's candidates",
       "24, 28, 32, 36", 1, LayerRole::kReindex, 1, false, true, false},
      {"engram", "SWA only with Engram before the block", "1 (Engram also at 14)", 0, LayerRole::kSwaOnly, 0, false,
       false, true},
      {"dspark", "DSpark block (its own window ring, 'dspark_n_routed_experts' experts) on layer 0", "40-42", 1,
       LayerRole::kDSpark, 0, false, false, false},
  };
  return kinds;
}

const LayerKind& layer_kind(const std::string& name) {
  std::ostringstream known;
  for (const LayerKind& k : layer_kinds()) {
    if (k.name == name) return k;
    known << (known.tellp() > 0 ? ", " : "") << k.name;
  }
  DSV41_FAIL("layer kind '", name, "': unknown (the kinds: ", known.str(), ")");
}

namespace {

// Table rows of each engram layer: the sum of its bucket primes (reference/ops/engram.h, Layout).
std::vector<int64_t> engram_rows(const ModelConfig& c) {
  std::set<int64_t> used;
  std::vector<int64_t> rows;
  for (size_t li = 0; li < c.engram_layer_ids.size(); ++li) {
    int64_t total = 0;
    for (int order = 2; order <= c.engram_max_ngram_size; ++order) {
      int64_t current = c.engram_vocab_size - 1;
      for (int h = 0; h < c.engram_n_heads; ++h) {
        current = reference::next_unused_prime(current, used);
        used.insert(current);
        total += current;
      }
    }
    rows.push_back(total);
  }
  return rows;
}

}  // namespace

ModelConfig kind_config(const ModelConfig& base, const LayerKind& kind, const std::string& source) {
  ModelConfig c = base;
  const bool two = kind.target == 1 && kind.role != LayerRole::kDSpark;  // a source layer first
  c.n_layers = two ? 2 : 1;
  c.n_mtp_layers = kind.role == LayerRole::kDSpark ? 1 : 0;
  c.compress_ratios.assign(static_cast<size_t>(c.n_layers), kind.ratio);
  c.compress_ratios.resize(static_cast<size_t>(c.total_layers()), 0);  // DSpark entries are 0
  c.kv_source_layers.clear();
  c.index_source_layers.clear();
  c.candidate_source_layer = -1;
  if (kind.ratio > 0) {
    c.kv_source_layers = {0};
    c.index_source_layers = {0};
    if (kind.role == LayerRole::kReindex) c.index_source_layers = {0, 1};
    if (kind.ratio == 1) c.candidate_source_layer = 0;  // as layer 20 for 21..39
  }
  c.dspark_target_layer_ids.clear();
  if (c.n_mtp_layers > 0) {
    c.dspark_target_layer_ids = {0};
    DSV41_CHECK(base.n_mtp_layers > 0 || base.dspark_block_size > 0, "layer kind 'dspark': base ", source,
                " has no DSpark configuration (dspark_block_size 0)");
  }
  c.engram_layer_ids.clear();
  c.engram_num_embeddings.clear();
  if (kind.engram) {
    DSV41_CHECK(base.engram_n_heads > 0 && base.engram_max_ngram_size >= 2 && base.engram_head_dim > 0,
                "layer kind 'engram': base ", source, " has no Engram configuration");
    c.engram_layer_ids = {0};
    if (c.engram_vocab_size > kEngramVocabCap) c.engram_vocab_size = kEngramVocabCap;
    c.engram_num_embeddings = engram_rows(c);
  }
  reference::validate(c, "layer kind '" + kind.name + "' of " + source);
  check_kind(c, kind);
  return c;
}

void check_kind(const ModelConfig& c, const LayerKind& kind) {
  const std::vector<reference::LayerInfo> s = reference::layer_schedule(c);
  DSV41_CHECK(kind.target < static_cast<int>(s.size()), "layer kind '", kind.name, "': the config has ", s.size(),
              " layers, no layer ", kind.target);
  const reference::LayerInfo& l = s[static_cast<size_t>(kind.target)];
  const auto differs = [&](const char* what, auto got, auto want) {
    DSV41_CHECK(got == want, "layer kind '", kind.name, "': layer ", kind.target, " has ", what, " ", got,
                ", the kind needs ", want);
  };
  differs("role", std::string(reference::name(l.role)), std::string(reference::name(kind.role)));
  differs("ratio", l.ratio, kind.ratio);
  differs("candidate_source", l.candidate_source, kind.candidate_source);
  differs("uses_candidates", l.uses_candidates, kind.uses_candidates);
  differs("engram", l.engram, kind.engram);
  if (kind.role == LayerRole::kReuse || kind.role == LayerRole::kReindex) {
    differs("kv_owner", l.kv_owner, 0);
    differs("topk_owner", l.topk_owner, kind.role == LayerRole::kReuse ? 0 : kind.target);
  }
}

WeightBytes weight_bytes(const ModelConfig& c, bool packed_fp4) {
  WeightBytes b;
  for (const reference::checkpoint::TensorSpec& t : reference::checkpoint::expected_tensors(c)) {
    const int64_t n = reference::Tensor<float>::count(t.shape);
    b.file += static_cast<double>(reference::stored_bytes(t.dtype, n));
    const bool table = t.name.find("engram.embed.") != std::string::npos;  // held as bytes
    const bool f4 = t.dtype == reference::DType::kF4;
    const double held = f4 && packed_fp4 ? static_cast<double>(n) / 2 : table ? static_cast<double>(n) : 4.0 * static_cast<double>(n);
    b.held += held;
    if (t.name.find(".experts.") != std::string::npos) b.routed_experts_held += held;
  }
  return b;
}

}  // namespace dsv41::scenarios::runner
