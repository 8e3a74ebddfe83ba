// scenarios/judge/order_variant.cc
//
// The order-variant judgment (scenarios/judge/order_variant.h): the forward's dataflow (which
// inputs each component reads), the forcing chains, the free-running bound, the bound of each row.
#include "scenarios/judge/order_variant.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "reference/model/hooks.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::judge {
namespace {

using Node = ForcingNode;

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// The stream the attention sublayer of backbone layer l reads: after the Engram when it has one.
Node layer_stream(const std::vector<reference::LayerInfo>& schedule, int l) {
  return {schedule[static_cast<size_t>(l)].engram ? "engram_out" : "in_stream", l};
}

// The inputs of a component of a transformer block (backbone or DSpark, `p` the name prefix:
// "" or "dspark_"), given the stream entering the block and the pre its attention applies.
std::vector<Node> block_inputs(const std::string& c, int l, const std::string& p, const Node& stream,
                               const std::vector<Node>& pre, const std::vector<Node>& attention) {
  const auto is = [&](const char* name) { return c == p + name; };
  if (is("hc_attn_pre") || is("hc_attn_post") || is("hc_attn_comb")) return {stream};
  if (is("attn_in")) {
    std::vector<Node> v = {stream};
    v.insert(v.end(), pre.begin(), pre.end());
    return v;
  }
  if (is("attn_out")) {
    std::vector<Node> v = {{p + "attn_in", l}};
    v.insert(v.end(), attention.begin(), attention.end());
    return v;
  }
  if (is("attn_stream")) return {{p + "attn_out", l}, stream, {p + "hc_attn_post", l}, {p + "hc_attn_comb", l}};
  if (is("hc_ffn_pre") || is("hc_ffn_post") || is("hc_ffn_comb")) return {{p + "attn_stream", l}};
  if (is("ffn_in")) return {{p + "attn_stream", l}, {p + "hc_attn_pre", l}};
  if (is("experts")) return {{p + "ffn_in", l}};
  if (is("ffn_out")) return {{p + "ffn_in", l}, {p + "experts", l}};
  if (is("out_stream")) return {{p + "ffn_out", l}, {p + "attn_stream", l}, {p + "hc_ffn_post", l}, {p + "hc_ffn_comb", l}};
  return {};
}

// What the indexer of backbone layer l reads: its queries (attn_in), its kv owner's index keys
// (written from the owner's attn_in) and, after the candidate source, the candidate pool.
std::vector<Node> indexer_inputs(const reference::ModelConfig& c, const reference::LayerInfo& info, int l) {
  std::vector<Node> v = {{"attn_in", l}};
  if (info.kv_owner >= 0 && info.kv_owner != l) v.push_back({"attn_in", info.kv_owner});
  if (info.uses_candidates && c.candidate_source_layer >= 0) v.push_back({"candidates", c.candidate_source_layer});
  return v;
}

}  // namespace

std::vector<ForcingNode> direct_inputs(const reference::ModelConfig& c, const std::vector<reference::LayerInfo>& schedule,
                                       const std::string& component, int layer) {
  const int L = c.n_layers;
  if (starts_with(component, "dspark_") || component == "cache.dspark_window_kv") {
    // DSpark (model_dspark.cc): main_x from the target layers' streams; its blocks chain like the
    // backbone's, the first block's stream from the embedding and main_x, the pre one-hot at first.
    if (component == "dspark_main_x") {
      std::vector<Node> v;
      for (int l : c.dspark_target_layer_ids) {
        if (l >= 0 && l < L) v.push_back(layer_stream(schedule, l));
      }
      return v;
    }
    if (component == "dspark_main_kv" || component == "cache.dspark_window_kv") return {{"dspark_main_x", -1}};
    if (component == "dspark_in_stream") {
      if (layer <= L) return {{"dspark_embed", -1}, {"dspark_main_x", -1}};
      return {{"dspark_out_stream", layer - 1}};
    }
    const int last = L + std::max(0, c.n_mtp_layers) - 1;
    if (component == "dspark_norm_out") return {{"dspark_out_stream", last}, {"dspark_hc_ffn_pre", last}};
    if (component == "dspark_head_logits") return {{"dspark_norm_out", -1}};
    if (component == "dspark_logits") return {{"dspark_head_logits", -1}};
    if (component == "dspark_confidence") return {{"dspark_logits", -1}};
    const std::vector<Node> pre = layer > L ? std::vector<Node>{{"dspark_hc_ffn_pre", layer - 1}} : std::vector<Node>{};
    return block_inputs(component, layer, "dspark_", {"dspark_in_stream", layer}, pre, {{"dspark_main_kv", layer}});
  }
  if (component == "embed" || component == "engram_ids") return {};
  if (component == "final_norm_out") return {{"out_stream", L - 1}, {"hc_ffn_pre", L - 1}};
  if (component == "logits") return {{"final_norm_out", -1}};
  if (layer < 0 || layer >= L) return {};
  const reference::LayerInfo& info = schedule[static_cast<size_t>(layer)];
  if (component == "in_stream") return {layer == 0 ? Node{"embed", -1} : Node{"out_stream", layer - 1}};
  if (component == "in_pre") return layer == 0 ? std::vector<Node>{} : std::vector<Node>{{"hc_ffn_pre", layer - 1}};
  if (component == "engram_out") return {{"in_stream", layer}};
  if (starts_with(component, "cache.")) return {{"attn_in", layer}};
  if (component == "index_scores" || component == "topk" || component == "candidates") {
    return indexer_inputs(c, info, layer);
  }
  std::vector<Node> attention;  // what the attention reads besides its own attn_in
  if (info.ratio > 0) {
    if (info.kv_owner >= 0 && info.kv_owner != layer) attention.push_back({"attn_in", info.kv_owner});
    if (info.topk_owner >= 0) attention.push_back({"topk", info.topk_owner});
  }
  return block_inputs(component, layer, "", layer_stream(schedule, layer), {{"in_pre", layer}}, attention);
}

Forcing chain_forcing(const reference::ModelConfig& c, const std::vector<reference::LayerInfo>& schedule,
                      const std::string& component, int layer, const std::function<bool(const ForcingNode&)>& held) {
  // The identity an input stands for (in_stream(l) is out_stream(l - 1) or embed; in_pre(l) is
  // hc_ffn_pre(l - 1)): the node whose computation the reference runs in its place.
  const auto computed_as = [&](Node n) {
    for (int hop = 0; hop < 4; ++hop) {
      if (held(n)) return n;
      if (n.first == "in_stream") {
        n = n.second == 0 ? Node{"embed", -1} : Node{"out_stream", n.second - 1};
      } else if (n.first == "in_pre" && n.second > 0) {
        n = {"hc_ffn_pre", n.second - 1};
      } else {
        return n;
      }
    }
    return n;
  };
  // The other side's own value reaches the reference: held, an identity of a held value, or
  // layer 0's one-hot pre (a constant).
  const auto given = [&](const Node& n) {
    const Node x = computed_as(n);
    return held(x) || (x.first == "in_pre" && x.second == 0);
  };
  static const std::set<std::string> selections = {"topk", "candidates", "experts", "dspark_experts"};
  Forcing f;
  std::set<Node> seen;
  std::vector<Node> todo;
  for (const Node& in : direct_inputs(c, schedule, component, layer)) {
    if (given(in)) continue;
    f.forced = false;
    f.missing.push_back(in.first + "@" + (in.second < 0 ? std::string("model") : std::to_string(in.second)));
    todo.push_back(computed_as(in));
  }
  // Every computation the reference runs in place of the other side's, up to its values.
  while (!todo.empty()) {
    const Node n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    f.chain.push_back(n);
    if (selections.count(n.first)) f.chain_has_selection = true;
    for (const Node& in : direct_inputs(c, schedule, n.first, n.second)) {
      if (!given(in)) todo.push_back(computed_as(in));
    }
  }
  return f;
}

std::optional<DerivedBound> free_running_bound(const reference::ModelConfig& c, const std::string& component,
                                               std::optional<DerivedBound> own, const Forcing& f, Accumulation acc) {
  if (f.chain_has_selection) return std::nullopt;
  DerivedBound b;
  if (own) {
    b = *own;
  } else {
    b.component = component;
    b.n = 1;
    b.origin = "exact given equal inputs";
  }
  std::string chain;
  for (const auto& [name, layer] : f.chain) {
    const std::optional<DerivedBound> y = derived_bound(c, name, acc);
    if (!y) continue;  // exact given its inputs (in_stream, in_pre, embed): adds nothing
    const double nu = static_cast<double>(y->n) * std::ldexp(1.0, -24);
    b.bound += y->bound;
    b.gain += y->gain + 2.0 * nu / (1.0 - nu);
    b.n = std::max(b.n, y->n);
    chain += (chain.empty() ? "" : ", ") + name + "@" + (layer < 0 ? std::string("model") : std::to_string(layer));
  }
  b.gain_why = (b.gain_why.empty() ? "" : b.gain_why + "; ") + "plus the systematic gains of the chain not in the dump";
  b.origin = "free-running (not teacher-forced; docs/conform.md \"Thin dumps\"): " + b.origin +
             " + the derived bounds of the chain the reference computed in place of the port's (A1: additive): " +
             (chain.empty() ? "none bounded" : chain);
  return b;
}

std::string selection_tie_note(const reference::ModelConfig& c, const std::string& component, Accumulation acc) {
  if (component == "experts") return kExpertTieNote;
  return "order-variant: identical outside the tie band of index_scores' derived bound (" +
         std::to_string(topk_tie_band(c, acc)) + " x the row's max |score|" +
         (component == "candidates" ? ", on the block scores" : "") + "); a difference inside it is a tie";
}

OrderVariantTolerance order_variant_tolerance(const reference::ModelConfig& c, const std::string& component,
                                              const std::string& metric, const Forcing* forcing, Accumulation acc) {
  using K = OrderVariantTolerance;
  const auto bound = [](reports::Tolerance t) { return K{K::kBound, std::move(t)}; };
  const K measured{K::kMeasured, std::nullopt}, exact{K::kExact, std::nullopt};
  if (component == reference::model::name(reference::model::Component::kEngramIds)) {
    return metric == "equal_frac" ? exact : measured;  // an integer hash of the tokens
  }
  const bool free_running = forcing != nullptr && !forcing->forced;
  const auto widened = [&](std::optional<DerivedBound> own) {
    return free_running ? free_running_bound(c, component, std::move(own), *forcing, acc) : own;
  };
  if (component.rfind("cache.", 0) == 0) {  // bytes measured (a quantizer flip is legitimate); what they decode to is bounded
    const std::optional<DerivedBound> b = widened(derived_cache_bound(c, component, acc));
    if (!b) return measured;
    if (metric == kDecodedBlockGainMetric) {
      reports::Tolerance t = decoded_block_gain_tolerance();
      if (free_running) {
        t.bound += b->gain;
        t.note += "; free-running: plus the chain's systematic gain (" + b->origin + ")";
      }
      return bound(t);
    }
    if (metric == kRowGainMetric && component == "cache.compressor") return bound(row_gain_tolerance(*b));
    return metric == kDecodedRowRelMetric ? bound(derived_tolerance(*b)) : measured;
  }
  // Selections (topk, the candidate pool: a top-k of block scores, the routed experts) follow one
  // tie rule (runner/compare.h); with inputs not forced, their scores move beyond the band: measured.
  if (component == "experts" || component == "topk" || component == "candidates") {
    if (metric != "tie_equivalent" || free_running) return measured;
    return bound(make_tolerance(1.0, true, "analytic", selection_tie_note(c, component, acc)));
  }
  // The draft's own selections (its routed experts, its sampled tokens) have no tie analysis yet:
  // a near tie may choose otherwise, so they are measured; their scores and logits are bounded.
  if (component == "dspark_experts" || component == "dspark_token") return measured;
  std::optional<DerivedBound> own = derived_bound(c, component, acc);
  const std::optional<reference::model::Component> id = reference::model::component_from_name(component);
  const bool float_tensor =
      id && reference::model::component_info(*id).kind == reference::model::ComponentKind::kTensor;
  if (own || (free_running && float_tensor)) {
    const std::optional<DerivedBound> b = widened(std::move(own));
    if (!b) return measured;
    if (metric == kRowRelMetric) return bound(derived_tolerance(*b));
    const bool row_stat = metric == kRowGainMetric || metric == kTensorGainMetric || metric == kTensorBiasMetric;
    if (row_stat && acc == Accumulation::kFp8TensorCore && component == "index_scores") return measured;
    if (metric == kRowGainMetric) return bound(row_gain_tolerance(*b));
    if (metric == kTensorGainMetric || metric == kTensorBiasMetric) return bound(tensor_stat_tolerance(*b, metric));
    return measured;
  }
  return exact;  // exact given equal inputs (embed, in_stream, in_pre): as bit-exact
}

}  // namespace dsv41::scenarios::judge
