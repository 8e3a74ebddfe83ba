// scenarios/agree/official_dump.cc: an official run as a port dump (scenarios/agree/official_dump.h).
#include "scenarios/agree/official_dump.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/output_file.h"
#include "formats/cache_format.h"
#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "reference/ops/mhc.h"
#include "reports/report.h"
#include "scenarios/agree/agree_internal.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/runner/capture.h"

namespace dsv41::scenarios::agree {

namespace fs = std::filesystem;
using json = nlohmann::json;
using reference::Tensor;
using runner::CapturedItem;

const std::vector<OfficialItem>& official_component_items() {
  // The components an official run records under "layerNN/", in hooks.h order. in_stream, in_pre
  // and embed are not here: they are the previous layer's out_stream / next_pre and the step's
  // embed (agree.cc forcing_hooks, import_official below).
  static const std::vector<OfficialItem> items = {
      {"engram_ids", "engram_hash_ids"}, {"engram_out", "engram_out"},
      {"hc_attn_pre", "hc_attn_pre"},    {"hc_attn_post", "hc_attn_post"}, {"hc_attn_comb", "hc_attn_comb"},
      {"index_scores", "index_score"},   {"candidates", "candidates"},     {"topk", "indexer_topk"},
      {"attn_out", "attn_out"},          {"hc_ffn_pre", "hc_ffn_pre"},     {"hc_ffn_post", "hc_ffn_post"},
      {"hc_ffn_comb", "hc_ffn_comb"},    {"experts", "gate_indices"},      {"ffn_out", "ffn_out"},
      {"out_stream", "out_stream"},
  };
  return items;
}

std::string official_item(const std::string& component) {
  for (const OfficialItem& i : official_component_items()) {
    if (component == i.component) return i.item;
  }
  DSV41_FAIL("official run: no per-layer official item holds the component '", component, "'");
}

// ---------------------------------------------------------------------------------------------
// Known differences.

std::vector<KnownDifference> stale_index_keys(const reference::ModelConfig& c,
                                              const std::vector<std::pair<int64_t, int64_t>>& steps) {
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  std::vector<KnownDifference> out;
  int publisher = -1;  // the layer whose key cache the official shared_attn.index_k holds
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto [start, T] = steps[s];
    for (int l = 0; l < c.n_layers; ++l) {
      const reference::LayerInfo& info = schedule[static_cast<size_t>(l)];
      if (info.ratio <= 0) continue;
      const bool indexer = info.role == reference::LayerRole::kFull || info.role == reference::LayerRole::kReindex;
      // A Full layer's compressor returns a latent only when the step completes a group; its
      // Indexer.forward publishes its key cache then, before it scores.
      if (info.role == reference::LayerRole::kFull && (start + T) / info.ratio > start / info.ratio) publisher = l;
      if (!indexer || (start + T) / info.ratio == 0 || publisher == info.kv_owner) continue;
      const std::string why =
          std::string(kStaleIndexKeys) + ": layer " + std::to_string(l) + " (ratio " + std::to_string(info.ratio) +
          ") at positions " + std::to_string(start) + ".." + std::to_string(start + T - 1) +
          " completes no compressor group, so the official Indexer.forward does not publish its key cache and "
          "scores against the one layer " + std::to_string(publisher) +
          " published last (docs/agreement.md, Known differences; docs/indexer.md); dsv41 scores its own keys";
      for (const char* comp : {"index_scores", "topk"}) {
        out.push_back({kStaleIndexKeys, comp, l, static_cast<int64_t>(s), why});
      }
    }
  }
  return out;
}

std::vector<KnownDifference> known_differences(const OracleRun& run) {
  std::vector<std::pair<int64_t, int64_t>> steps;
  for (const OracleStep& st : run.steps()) steps.emplace_back(st.start_pos, static_cast<int64_t>(st.tokens.size()));
  return stale_index_keys(run.config(), steps);
}

std::string known_differences_json(const std::vector<KnownDifference>& known) {
  json list = json::array();
  for (const KnownDifference& k : known) {
    list.push_back({{"component", k.component},
                    {"layers", {k.layer, k.layer}},
                    {"steps", {k.step, k.step}},
                    {"reason", k.reason}});
  }
  return json{{"waivers", list}}.dump(1) + "\n";
}

// ---------------------------------------------------------------------------------------------
// The import.

namespace {

// Where an item of a step is: the items file, else the streams file (engram_out, out_stream and
// embed are in prefill_streams.h5 for the prefill); "" when neither holds it.
const golden::H5File* holder(const OracleStep& st, const std::string& item) {
  for (const golden::H5File* f : {st.items, st.streams}) {
    if (f->has(item + "/bits") || f->has(item + "/value")) return f;
  }
  return nullptr;
}

std::string item_path(const OracleStep& st, int layer, const std::string& item) {
  return st.prefix + (layer < 0 ? "" : oracle_layer(layer) + "/") + item;
}

// The official path a (component, layer) is read from at one step ("" for in_pre at layer 0: the
// identity pre).
std::string source_of(const OracleStep& st, const std::string& component, int layer) {
  if (component == "in_stream") return layer == 0 ? item_path(st, -1, "embed") : item_path(st, layer - 1, "out_stream");
  if (component == "in_pre") return layer == 0 ? "" : item_path(st, layer - 1, "next_pre");
  if (component == "embed") return item_path(st, -1, "embed");
  if (component == "cache.compressor") return st.prefix + "state/" + oracle_layer(layer) + "/compressor_kv_state";
  return item_path(st, layer, official_item(component));
}

Tensor<float> floats(const OracleStep& st, const std::string& item, bool bf16, const std::vector<int64_t>& shape) {
  const golden::H5File* f = holder(st, item);
  DSV41_CHECK(f != nullptr, "official run: step ", st.index, " has no item '", item, "'");
  Tensor<float> t = bf16 ? OracleRun::bf16(*f, item) : OracleRun::f32(*f, item);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  DSV41_CHECK(t.numel() == n, "official file '", f->path(), "': item '", item, "' holds ", t.numel(),
              " values, the dump's ", reference::shape_string(shape), " needs ", n);
  return Tensor<float>(shape, std::move(t.data()), item);
}

// A captured item of (layer, component) of that kind, its value still to set.
CapturedItem item_header(int layer, const std::string& component, CapturedItem::Kind kind) {
  CapturedItem it;
  it.layer = layer;
  it.component = component;
  it.kind = kind;
  return it;
}

CapturedItem float_item(int layer, const std::string& component, Tensor<float> v) {
  CapturedItem it = item_header(layer, component, CapturedItem::kFloat);
  it.type = runner::hook_value_type(component);
  it.f = std::move(v);
  return it;
}

// indexer_topk [1, T, index_topk] (official indices: window rows first) -> the dump's topk
// [T, min(index_topk, N)]: compressed positions ascending, then -1.
Tensor<int32_t> dump_topk(const OracleStep& st, const reference::ModelConfig& c, const std::string& item, int64_t T,
                          int64_t N) {
  const golden::H5File* f = holder(st, item);
  DSV41_CHECK(f != nullptr, "official run: step ", st.index, " has no item '", item, "'");
  const Tensor<int32_t> raw = OracleRun::i32(*f, item);
  DSV41_CHECK(T > 0 && raw.numel() % T == 0, "official file '", f->path(), "': item '", item, "' holds ", raw.numel(),
              " values for ", T, " tokens");
  const int64_t k = raw.numel() / T, width = std::min<int64_t>(c.index_topk, N);
  const int64_t offset = agree_detail::official_topk_offset(st, c);
  Tensor<int32_t> out({T, width}, "topk", -1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t x = raw.data()[static_cast<size_t>(t * k + j)];
      if (x < 0) continue;
      DSV41_CHECK(x >= offset && x - offset < N, "official file '", f->path(), "': item '", item, "' row ", t,
                  " holds index ", x, ", outside the compressed rows [", offset, ", ", offset + N, ")");
      row.push_back(static_cast<int32_t>(x - offset));
    }
    std::sort(row.begin(), row.end());
    DSV41_CHECK(std::adjacent_find(row.begin(), row.end()) == row.end() && static_cast<int64_t>(row.size()) <= width,
                "official file '", f->path(), "': item '", item, "' row ", t, " repeats an index or holds more than ",
                width, " (min(index_topk, N))");
    std::copy(row.begin(), row.end(), out.row(t));
  }
  return out;
}

// The compressor's pending group after the step, as the dump's cache view (docs/port-dump.md):
// official kv_state / score_state [1, ratio, dim] fp32, slot i = position group start + i.
reference::model::CacheView compressor_view(const OracleStep& st, int layer, int ratio) {
  const std::string base = st.prefix + "state/" + oracle_layer(layer) + "/";
  const golden::H5File* f = holder(st, base + "compressor_kv_state");
  DSV41_CHECK(f != nullptr, "official run: step ", st.index, " has no item '", base, "compressor_kv_state'");
  const Tensor<float> kv = OracleRun::f32(*f, base + "compressor_kv_state");
  const Tensor<float> score = OracleRun::f32(*f, base + "compressor_score_state");
  DSV41_CHECK(kv.rank() == 3 && kv.dim(1) == ratio && kv.shape() == score.shape(), "official file '", f->path(),
              "': ", base, "compressor_{kv,score}_state have shapes ", reference::shape_string(kv.shape()), " and ",
              reference::shape_string(score.shape()), ", expected [1, ", ratio, ", dim] both");
  const int64_t dim = kv.dim(2), end = st.start_pos + static_cast<int64_t>(st.tokens.size());
  const int64_t pending = end % ratio;
  reference::model::CacheView v;
  v.kind = "compressor";
  v.layer = layer;
  v.format = formats::CacheFormat::kBf16;  // not a packed format; conform ignores it for this kind
  v.dim = dim;
  v.entry_bytes = 8 * dim;
  v.entries = pending;
  for (int64_t slot = 0; slot < pending; ++slot) {
    for (const Tensor<float>* t : {&kv, &score}) {
      const auto* b = reinterpret_cast<const uint8_t*>(t->data().data() + slot * dim);
      v.bytes.insert(v.bytes.end(), b, b + dim * static_cast<int64_t>(sizeof(float)));
    }
    v.positions.push_back(end - pending + slot);
  }
  return v;
}

// One step of the dump: every (component, layer) of `keep`, read and laid out as the dump's table.
runner::StepCapture step_capture(const OracleRun& run, const OracleStep& st,
                                 const std::vector<std::pair<std::string, int>>& keep) {
  const reference::ModelConfig& c = run.config();
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  const int64_t T = static_cast<int64_t>(st.tokens.size()), hc = c.hc_mult, dim = c.dim;
  runner::StepCapture cap;
  cap.start_pos = st.start_pos;
  cap.tokens = T;
  const auto expand = [&](const Tensor<float>& e) {  // [T, dim] -> [T, hc, dim] (the embed on every copy)
    Tensor<float> v({T, hc, dim}, "embed");
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < hc; ++i) std::copy(e.row(t), e.row(t) + dim, v.row(t, i));
    }
    return v;
  };
  for (const auto& [comp, l] : keep) {
    const std::string src = source_of(st, comp, l);
    const int64_t N = l >= 0 && schedule[static_cast<size_t>(l)].ratio > 0
                          ? (st.start_pos + T) / schedule[static_cast<size_t>(l)].ratio
                          : 0;
    if (comp == "embed" || (comp == "in_stream" && l == 0)) {
      cap.items.push_back(float_item(l, comp, expand(floats(st, src, true, {T, dim}))));
    } else if (comp == "in_stream" || comp == "engram_out" || comp == "out_stream") {
      cap.items.push_back(float_item(l, comp, floats(st, src, true, {T, hc, dim})));
    } else if (comp == "in_pre") {
      cap.items.push_back(float_item(l, comp, l == 0 ? reference::hc_identity_pre(T, hc) : floats(st, src, false, {T, hc})));
    } else if (comp == "hc_attn_pre" || comp == "hc_attn_post" || comp == "hc_ffn_pre" || comp == "hc_ffn_post") {
      cap.items.push_back(float_item(l, comp, floats(st, src, false, {T, hc})));
    } else if (comp == "hc_attn_comb" || comp == "hc_ffn_comb") {
      cap.items.push_back(float_item(l, comp, floats(st, src, false, {T, hc, hc})));
    } else if (comp == "attn_out" || comp == "ffn_out") {
      cap.items.push_back(float_item(l, comp, floats(st, src, true, {T, dim})));
    } else if (comp == "index_scores") {
      cap.items.push_back(float_item(l, comp, floats(st, src, true, {T, N})));
    } else if (comp == "topk") {
      CapturedItem it = item_header(l, comp, CapturedItem::kIndex);
      it.i = dump_topk(st, c, src, T, N);
      cap.items.push_back(std::move(it));
    } else if (comp == "experts") {
      CapturedItem it = item_header(l, comp, CapturedItem::kIndex);
      Tensor<int32_t> e = OracleRun::i32(*holder(st, src), src);
      const int64_t k = e.numel() / T;
      it.i = Tensor<int32_t>({T, k}, std::move(e.data()), "experts");
      cap.items.push_back(std::move(it));
    } else if (comp == "candidates") {
      CapturedItem it = item_header(l, comp, CapturedItem::kMask);
      Tensor<uint8_t> m = OracleRun::u8(*holder(st, src), src);
      DSV41_CHECK(m.numel() == T * N, "official file '", holder(st, src)->path(), "': item '", src, "' holds ",
                  m.numel(), " values, the dump's [", T, ", ", N, "] needs ", T * N);
      it.m = Tensor<uint8_t>({T, N}, std::move(m.data()), "candidates");
      cap.items.push_back(std::move(it));
    } else if (comp == "engram_ids") {
      CapturedItem it = item_header(l, comp, CapturedItem::kIds);
      const Tensor<int32_t> ids = OracleRun::i32(*holder(st, src), src);
      it.ids.assign(ids.data().begin(), ids.data().end());
      it.ids_shape = {T, ids.numel() / T};
      cap.items.push_back(std::move(it));
    } else if (comp == "cache.compressor") {
      cap.caches.push_back(compressor_view(st, l, schedule[static_cast<size_t>(l)].ratio));
    } else {
      DSV41_FAIL("official import: no layout for component '", comp, "'");
    }
  }
  const Tensor<float> logits = OracleRun::f32(*st.items, st.logits);
  DSV41_CHECK(logits.numel() == c.vocab_size, "official file '", st.items->path(), "': item '", st.logits, "' holds ",
              logits.numel(), " values, the vocab is ", c.vocab_size);
  cap.logits = logits.data();
  cap.logit_rows = 1;
  return cap;
}

// Does the step hold what (component, layer) is read from?
bool step_holds(const OracleStep& st, const std::string& comp, int layer) {
  if (comp == "in_pre" && layer == 0) return true;
  if (comp == "cache.compressor") {
    const std::string s = source_of(st, comp, layer);
    return holder(st, s) != nullptr && holder(st, st.prefix + "state/" + oracle_layer(layer) + "/compressor_score_state");
  }
  return holder(st, source_of(st, comp, layer)) != nullptr;
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (size_t i = 0; i < steps.size(); ++i) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(steps[i]) + (j > i ? "-" + std::to_string(steps[j]) : "");
    i = j;
  }
  return s;
}

// DUMP.known_differences.json beside DUMP (its ".h5" dropped).
std::string beside(const std::string& dump, const std::string& suffix) {
  std::string base = fs::path(dump).lexically_normal().string();
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  if (conform::is_h5_dump_path(base)) base.resize(base.size() - 3);
  return base + suffix;
}

void write_text(const std::string& path, const std::string& what, const std::string& text) {
  output::write_file_atomically(path, what, text.data(), text.size());
}

}  // namespace

ImportSummary import_official(const OracleRun& run, const std::string& dump_path, const std::string& command_line) {
  const reference::ModelConfig& c = run.config();
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  std::error_code ec;
  if (fs::exists(dump_path, ec) && (!fs::is_directory(dump_path, ec) || !fs::is_empty(dump_path, ec))) {
    DSV41_FAIL("import-official -o '", dump_path, "': exists (a dump is written to a new file or a new or empty "
               "directory, so no stale dump is mistaken for this one)");
  }
  ImportSummary s;
  s.dump = dump_path;
  s.steps = static_cast<int64_t>(run.steps().size());
  // Candidates, in the dump's order: what every step holds is kept, what some hold is left out.
  std::vector<std::pair<std::string, int>> candidates = {{"embed", -1}};
  for (int l = 0; l < c.n_layers; ++l) {
    candidates.emplace_back("in_stream", l);
    candidates.emplace_back("in_pre", l);
    for (const OfficialItem& i : official_component_items()) candidates.emplace_back(i.component, l);
    const reference::LayerInfo& info = schedule[static_cast<size_t>(l)];
    if (info.role == reference::LayerRole::kFull && info.ratio > 1) candidates.emplace_back("cache.compressor", l);
  }
  std::vector<std::pair<std::string, int>> keep;
  for (const auto& [comp, l] : candidates) {
    std::vector<int64_t> held;
    for (const OracleStep& st : run.steps()) {
      if (step_holds(st, comp, l)) held.push_back(st.index);
    }
    const std::string what = comp + (l >= 0 ? "@" + std::to_string(l) : "");
    if (held.size() == run.steps().size()) {
      keep.emplace_back(comp, l);
      s.components[comp].push_back(l);
    } else if (!held.empty()) {
      s.left_out.push_back({what, "the run holds it at steps " + steps_text(held) + " of 0-" +
                                      std::to_string(s.steps - 1) +
                                      " only (a dump's coverage is per (component, layer), the same for every step)"});
    }
  }
  // Whole-run items with no place in a dump.
  if (run.steps().size() > 1 && run.decode().has("decode/final_state")) {
    s.left_out.push_back({"decode/final_state", "the caches after the last step only (window_kv, compressed_kv, "
                                                "index_keys, the DSpark ring): held at one step, and as decoded values, "
                                                "not the packed bytes a dump holds"});
  }
  if (run.steps().front().items->has("prefill/state/" + oracle_layer(0) + "/window_kv_cache")) {
    s.left_out.push_back({"prefill/state caches", "the caches after the prefill only (decoded values): held at one step"});
  }
  if (run.steps().size() > 1 && run.decode().has("decode/step0/dspark")) {
    s.left_out.push_back({"decode/stepK/dspark", "the DSpark draft (draft ids, logits, confidence): port dump version 2 "
                                                 "does not record the draft"});
  }
  if (run.steps().size() > 1 && run.decode().has("decode/step0/main_hidden")) {
    s.left_out.push_back({"decode/stepK/main_hidden", "held at decode steps only"});
  }

  // The token map: the run's own, written beside the dump when it is not the default one.
  if (run.token_map() != reference::model::default_token_map(c)) s.token_map_file = beside(dump_path, ".token_map.txt");
  conform::PortDumpWriter w(dump_path, c, run.weights_path(), s.token_map_file.empty() ? "default" : s.token_map_file,
                            command_line);
  w.set_claim(conform::kClaimOrderVariant);
  w.set_tool("the official DeepSeek-V4.1-Flash inference code, run '" + run.name() + "' (tie rule " + run.tie_rule() +
             "), imported by dsv41 " + DSV41_VERSION_STRING);
  for (const OracleStep& st : run.steps()) {
    w.add_step(step_capture(run, st, keep), st.tokens, st.index == 0 ? "prefill" : "decode");
  }

  // The known differences of what the dump holds (a waiver of a component left out would cover
  // nothing).
  for (KnownDifference& k : known_differences(run)) {
    const auto it = s.components.find(k.component);
    if (it != s.components.end() && std::count(it->second.begin(), it->second.end(), k.layer)) s.known.push_back(std::move(k));
  }
  w.finish();
  // Beside the finished dump: its waivers and, when not the default, its token map.
  s.waivers_file = beside(dump_path, ".known_differences.json");
  write_text(s.waivers_file, "the known differences (conform waivers)", known_differences_json(s.known));
  if (!s.token_map_file.empty()) {
    std::ostringstream tm;
    for (int64_t id : run.token_map()) tm << id << "\n";
    write_text(s.token_map_file, "the run's Engram token map", tm.str());
  }
  s.conform_command = "dsv41 conform " + reports::shell_quote(dump_path) + " --config " +
                      reports::shell_quote((fs::path(run.dir()) / "config.json").string()) + " --weights " +
                      reports::shell_quote(run.weights_path()) +
                      (s.token_map_file.empty() ? "" : " --token-map " + reports::shell_quote(s.token_map_file)) +
                      " --tolerances " + reports::shell_quote(s.waivers_file) + " --order-variant";
  return s;
}

std::string format_import_summary(const ImportSummary& s) {
  std::ostringstream o;
  o << "import-official: wrote '" << s.dump << "': " << s.steps << " steps, claim order-variant\n";
  o << "components (layers; model.logits at every step):\n";
  for (const auto& [comp, layers] : s.components) {
    o << "  " << comp << ":";
    for (int l : layers) o << " " << l;
    o << "\n";
  }
  o << "left out (not covered in the dump):\n";
  if (s.left_out.empty()) o << "  none\n";
  for (const LeftOut& l : s.left_out) o << "  " << l.what << ": " << l.why << "\n";
  std::map<std::pair<std::string, int>, std::vector<int64_t>> by;
  for (const KnownDifference& k : s.known) by[{k.name, k.layer}].push_back(k.step);
  o << "known differences (waived by name in '" << s.waivers_file << "', " << s.known.size() << " waivers):\n";
  if (by.empty()) o << "  none\n";
  for (const auto& [key, steps] : by) {
    std::vector<int64_t> u = steps;
    u.erase(std::unique(u.begin(), u.end()), u.end());
    o << "  " << key.first << ": layer " << key.second << " (index_scores, topk), steps " << steps_text(u) << "\n";
  }
  if (!s.token_map_file.empty()) o << "token map: '" << s.token_map_file << "' (the run's Engram token map)\n";
  o << "judge it with:\n  " << s.conform_command << "\n";
  return o.str();
}

}  // namespace dsv41::scenarios::agree
