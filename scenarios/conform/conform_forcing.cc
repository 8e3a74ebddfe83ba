// scenarios/conform/conform_forcing.cc
//
// Which of a dump's components are teacher-forced (scenarios/conform/conform_forcing.h): the direct
// inputs of every component, from the forward's dataflow.
#include "scenarios/conform/conform_forcing.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "reference/model/hooks.h"

namespace dsv41::scenarios::conform {
namespace {

using Node = std::pair<std::string, int>;

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

std::vector<std::pair<std::string, int>> direct_inputs(const reference::ModelConfig& c,
                                                       const std::vector<reference::LayerInfo>& schedule,
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

ForcingMap teacher_forcing(const PortDump& d) {
  const reference::ModelConfig& c = d.config;
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  const auto held = [&](const Node& n) {
    const auto it = d.components.find(n.first);
    return it != d.components.end() && std::find(it->second.begin(), it->second.end(), n.second) != it->second.end();
  };
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
  // The port's own value reaches the reference: held, an identity of a held value, or layer 0's
  // one-hot pre (a constant).
  const auto port_value = [&](const Node& n) {
    const Node x = computed_as(n);
    return held(x) || (x.first == "in_pre" && x.second == 0);
  };
  const std::set<std::string> selections = {"topk", "candidates", "experts", "dspark_experts"};
  ForcingMap out;
  for (const auto& [component, layers] : d.components) {
    for (int layer : layers) {
      Forcing f;
      std::set<Node> seen;
      std::vector<Node> todo;
      for (const Node& in : direct_inputs(c, schedule, component, layer)) {
        if (port_value(in)) continue;
        f.forced = false;
        f.missing.push_back(in.first + "@" + (in.second < 0 ? std::string("model") : std::to_string(in.second)));
        todo.push_back(computed_as(in));
      }
      // Every computation the reference runs in place of the port's, up to the port's values.
      while (!todo.empty()) {
        const Node n = todo.back();
        todo.pop_back();
        if (!seen.insert(n).second) continue;
        f.chain.push_back(n);
        if (selections.count(n.first)) f.chain_has_selection = true;
        for (const Node& in : direct_inputs(c, schedule, n.first, n.second)) {
          if (!port_value(in)) todo.push_back(computed_as(in));
        }
      }
      out[{component, layer}] = std::move(f);
    }
  }
  return out;
}

std::optional<judge::DerivedBound> free_running_bound(const reference::ModelConfig& c, const std::string& component,
                                                      std::optional<judge::DerivedBound> own, const Forcing& f) {
  if (f.chain_has_selection) return std::nullopt;
  judge::DerivedBound b;
  if (own) {
    b = *own;
  } else {
    b.component = component;
    b.n = 1;
    b.origin = "exact given equal inputs";
  }
  std::string chain;
  for (const auto& [name, layer] : f.chain) {
    const std::optional<judge::DerivedBound> y = judge::derived_bound(c, name);
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

std::vector<std::string> forcing_lines(const ForcingMap& f) {
  // Grouped per component and missing-input pattern: "attn_out layers 1-3: attn_in@L not in the dump".
  std::map<std::pair<std::string, std::string>, std::vector<int>> groups;
  for (const auto& [key, x] : f) {
    if (x.forced) continue;
    std::string why;
    for (const std::string& m : x.missing) {
      const size_t at = m.find('@');
      const std::string name = m.substr(0, at);
      if (why.find(name) == std::string::npos) why += (why.empty() ? "" : ", ") + name;
    }
    groups[{key.first, why}].push_back(key.second);
  }
  std::vector<std::string> lines;
  for (const auto& [key, layers] : groups) {
    std::string ls;
    for (size_t i = 0; i < layers.size();) {
      size_t k = i;
      while (k + 1 < layers.size() && layers[k + 1] == layers[k] + 1) ++k;
      if (!ls.empty()) ls += ", ";
      ls += std::to_string(layers[i]);
      if (k > i) {
        ls += '-';
        ls += std::to_string(layers[k]);
      }
      i = k + 1;
    }
    lines.push_back(key.first + (layers.size() == 1 && layers[0] < 0 ? " (model)" : " layers " + ls) +
                    ": not teacher-forced (inputs not in the dump: " + key.second + ")");
  }
  return lines;
}

}  // namespace dsv41::scenarios::conform
