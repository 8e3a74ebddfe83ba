// scenarios/conform/conform.cc
//
// `dsv41 conform` (scenarios/conform/conform.h): the port's dump as StepCaptures, the teacher-forced and
// end-to-end replays in the reference, and the rows they give. The report assembly (tolerances,
// order, root cause, support matrix) is scenarios/conform/conform_report.cc.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include "formats/cache_format.h"
#include "base/error.h"
#include "reference/model/model.h"
#include "reference/model/speculative.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/compare.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_cache_codes.h"
#include "scenarios/conform/conform_hypotheses.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::conform {
namespace conform_detail {
namespace {

using reference::model::Component;
using reference::DType;
using reference::Tensor;
using reference::checkpoint::safetensors::Entry;

template <typename T>
std::vector<T> le_values(const Entry& e) {
  std::vector<T> v(static_cast<size_t>(e.numel()));
  DSV41_CHECK(e.bytes.size() == v.size() * sizeof(T), "key '", e.name, "': ", e.bytes.size(), " bytes for ", v.size(),
              " values");
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());  // empty: data() may be null (UB)
  return v;
}

// A stored float tensor as fp32 values (BF16: the high half of the fp32 pattern).
std::vector<float> float_values(const Entry& e) {
  if (e.dtype == DType::kF32) return le_values<float>(e);
  const std::vector<uint16_t> h = le_values<uint16_t>(e);
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(&out[i], &u, sizeof u);
  }
  return out;
}

const std::string& meta_of(const PortDumpStep& s, const std::string& key) {
  const auto it = s.metadata.find(key);
  if (it == s.metadata.end()) DSV41_FAIL(s.file, ": __metadata__ has no '", key, "' (a cache key's format and dim)");
  return it->second;
}

// A cache of the dump as a CacheView, its format and dim from the file's metadata (checked).
reference::model::CacheView cache_of(const PortDumpStep& s, int layer, const std::string& component) {
  const Entry& e = *s.find(layer, component);
  reference::model::CacheView v;
  v.kind = component.substr(std::strlen("cache."));
  v.layer = layer;
  try {
    // The compressor's pending rows are fp32, no CacheFormat: labelled "fp32" (dumps written before
    // this change: "bf16"); `format` stays the unused default for this kind.
    const std::string& label = meta_of(s, e.name + ".format");
    if (v.kind == "compressor") {
      DSV41_CHECK(label == "fp32" || label == "bf16", "format '", label, "': the compressor's rows are fp32");
    } else {
      v.format = formats::cache_format_from_name(label);
    }
    v.dim = std::stoll(meta_of(s, e.name + ".dim"));
  } catch (const std::logic_error& x) {
    DSV41_FAIL(s.file, ": key '", e.name, "': metadata '", e.name, ".dim' is not a number: ", x.what());
  } catch (const Error& x) {
    DSV41_FAIL(s.file, ": key '", e.name, "': ", x.what());
  }
  v.entries = e.shape.at(0);
  v.entry_bytes = e.shape.at(1);
  const int64_t want = v.kind == "compressor" ? 8 * v.dim : formats::entry_bytes(v.format, static_cast<int>(v.dim));
  DSV41_CHECK(v.dim > 0 && v.entry_bytes == want, s.file, ": key '", e.name, "': ", v.entry_bytes,
              " bytes per entry, but format ", formats::info(v.format).name, " with dim ", v.dim, " has ", want);
  v.bytes = e.bytes;
  const auto pos = s.tensors.find(e.name + ".positions");
  if (pos != s.tensors.end()) v.positions = le_values<int64_t>(pos->second);
  return v;
}

}  // namespace

bool is_cache(const std::string& component) { return component.rfind("cache.", 0) == 0; }

runner::StepCapture port_capture(const PortDump& d, const PortDumpStep& s) {
  runner::StepCapture cap;
  cap.start_pos = s.start_pos;
  cap.tokens = static_cast<int64_t>(s.tokens.size());
  const std::string logits = reference::model::name(Component::kLogits);
  for (const reference::model::ComponentInfo& row : reference::model::component_table()) {
    const auto it = d.components.find(row.name);
    if (it == d.components.end()) continue;
    for (int layer : it->second) {
      const Entry& e = *s.find(layer, row.name);
      if (is_cache(row.name)) {  // sparse-MLA fp8 caches are no CacheView: judged by value (value_judged_rows)
        const auto label = s.metadata.find(e.name + ".format");
        if (label == s.metadata.end() || !is_sparse_mla_fp8(label->second)) cap.caches.push_back(cache_of(s, layer, row.name));
        continue;
      }
      if (row.name == logits) {  // [1 or T, vocab]: the last row is the step's last position
        const std::vector<float> all = float_values(e);
        const int64_t vocab = e.shape.at(1);
        cap.logits.assign(all.end() - vocab, all.end());
        cap.logit_rows = 1;
        continue;
      }
      runner::CapturedItem it2;
      it2.layer = layer;
      it2.component = row.name;
      it2.type = runner::hook_value_type(row.name);
      switch (e.dtype) {
        case DType::kBF16:
        case DType::kF32:
          it2.kind = runner::CapturedItem::kFloat;
          it2.f = Tensor<float>(e.shape, float_values(e), e.name);
          break;
        case DType::kI32:
          it2.kind = runner::CapturedItem::kIndex;
          it2.i = Tensor<int32_t>(e.shape, le_values<int32_t>(e), e.name);
          break;
        case DType::kU8:
          it2.kind = runner::CapturedItem::kMask;
          it2.m = Tensor<uint8_t>(e.shape, e.bytes, e.name);
          break;
        case DType::kI64:
          it2.kind = runner::CapturedItem::kIds;
          it2.ids = le_values<int64_t>(e);
          it2.ids_shape = e.shape;
          break;
        default: DSV41_FAIL(s.file, ": key '", e.name, "': dtype ", reference::dtype_name(e.dtype), " is not a component's");
      }
      cap.items.push_back(std::move(it2));
    }
  }
  return cap;
}

namespace {

// The port's selections, checked after they replaced the reference's (a value out of range would
// make the reference read outside its caches): top-k in [-1, N) with N the layer's index_scores
// width, experts in [0, n_routed_experts), candidate masks 0/1.
// gate_in: each layer's ffn_in as the MoE gate reads it (the port's when forced).
reference::model::ForwardHooks checked_forcing(runner::StepCapture& own, const runner::StepCapture* port, const PortDumpStep& s,
                                        const reference::ModelConfig& c, std::map<int, int64_t>& reach,
                                        std::map<int, Tensor<float>>& gate_in) {
  reference::model::ForwardHooks h = capture_hooks(own, port);
  h.tensor = [inner = h.tensor, &reach, &gate_in](Component what, int layer, Tensor<float>& v) {
    if (what == Component::kIndexScores && v.rank() == 2) reach[layer] = v.dim(1);
    inner(what, layer, v);
    if (what == Component::kFfnIn) gate_in.insert_or_assign(layer, v);
  };
  h.index = [inner = h.index, &reach, &s, &c](Component what, int layer, Tensor<int32_t>& v) {
    inner(what, layer, v);
    const std::string key = s.file + ": key '" + dump_key(layer, reference::model::name(what)) + "'";
    const int64_t hi = what == Component::kTopk ? (reach.count(layer) ? reach[layer] : 0) : c.n_routed_experts;
    const int32_t lo = what == Component::kTopk ? -1 : 0;
    for (int64_t i = 0; i < v.numel(); ++i) {
      const int32_t x = v.data()[static_cast<size_t>(i)];
      if (x < lo || x >= hi) {
        DSV41_FAIL(key, ": element ", i, " is ", x, ", outside [", lo, ", ", hi, ") (",
                   what == Component::kTopk ? "the compressed positions of this layer's index scores" : "the routed experts",
                   ")");
      }
    }
  };
  h.mask = [inner = h.mask, &s](Component what, int layer, Tensor<uint8_t>& v) {
    inner(what, layer, v);
    for (int64_t i = 0; i < v.numel(); ++i) {
      if (v.data()[static_cast<size_t>(i)] > 1) {
        DSV41_FAIL(s.file, ": key '", dump_key(layer, reference::model::name(what)), "': element ", i, " is ",
                   int{v.data()[static_cast<size_t>(i)]}, ", a mask holds 0 or 1");
      }
    }
  };
  return h;
}

std::vector<reference::model::CacheView> all_caches(const reference::model::Model& m, const reference::model::ModelState& s) {
  std::vector<reference::model::CacheView> caches = m.cache_views(s);
  for (std::vector<reference::model::CacheView> more : {reference::model::compressor_views(s, m.ops()), reference::model::dspark_views(s, m.ops())}) {
    for (reference::model::CacheView& v : more) caches.push_back(std::move(v));
  }
  return caches;
}

// The port's caches whose entry format is not the reference's (docs/port-dump.md "Cache layouts"):
// sparse-MLA fp8 ones (never in `port`), and CacheFormat ones of another format than the reference's of
// the same kind and layer, taken out of `port` (compare_step compares bytes). Each is judged by
// value against the reference's; its rows are returned and its detail goes to j.value_judged.
std::vector<reports::MetricRow> value_judged_rows(const PortDump& d, const PortDumpStep& s, const runner::StepCapture& own,
                                                  runner::StepCapture& port, const ConformOptions& o, StepJudgement& j) {
  std::vector<ValueCache> values;
  for (const auto& [component, layers] : d.components) {
    if (!is_cache(component)) continue;
    for (int layer : layers) {
      const Entry& e = *s.find(layer, component);
      const auto label = s.metadata.find(e.name + ".format");
      if (label == s.metadata.end() || !is_sparse_mla_fp8(label->second)) continue;
      const auto pos = s.tensors.find(e.name + ".positions");
      try {
        values.push_back(sparse_mla_fp8_cache(e, layer, component.substr(std::strlen("cache.")), label->second,
                                          std::stoll(meta_of(s, e.name + ".dim")),
                                          pos == s.tensors.end() ? std::vector<int64_t>{} : le_values<int64_t>(pos->second), d.config));
      } catch (const std::logic_error& x) {
        DSV41_FAIL(s.file, ": key '", e.name, "': metadata '", e.name, ".dim' is not a number: ", x.what());
      }
    }
  }
  const auto ref_of = [&](int layer, const std::string& kind) -> const reference::model::CacheView* {
    for (const reference::model::CacheView& v : own.caches) {
      if (v.layer == layer && v.kind == kind) return &v;
    }
    return nullptr;
  };
  for (auto it = port.caches.begin(); it != port.caches.end();) {
    const reference::model::CacheView* ref = ref_of(it->layer, it->kind);
    if (ref == nullptr || it->kind == "compressor" || ref->format == it->format) {
      ++it;
      continue;
    }
    try {
      values.push_back(value_cache(*it));
    } catch (const Error& x) {
      DSV41_FAIL(s.file, ": key '", dump_key(it->layer, "cache." + it->kind), "': ", x.what());
    }
    it = port.caches.erase(it);
  }
  std::vector<reports::MetricRow> rows;
  for (const ValueCache& v : values) {
    const std::string component = "cache." + v.kind;
    std::string detail;
    const reference::model::CacheView* ref = ref_of(v.layer, v.kind);
    if (ref == nullptr) {
      reports::MetricRow r;
      r.step = s.index;
      r.position = s.start_pos;
      r.layer = v.layer;
      r.component = component;
      r.metric = "present";
      rows.push_back(r);
      detail = "the reference keeps no " + component + " at " + layer_word(v.layer);
    } else {
      for (reports::MetricRow& r : cache_value_rows(*ref, v, d.config, order_variant(d, o), accumulation(d, o), s.index,
                                                    s.start_pos, detail)) {
        rows.push_back(std::move(r));
      }
    }
    j.value_judged[{v.layer, component}] = detail;
  }
  return rows;
}

// Keeps of `own` what `port` covers: items whose (layer, component) the port holds (and index
// scores, which the tie analysis of top-k reads), the logits when the port has them, and the port's
// caches in the reference's order; returns the port's caches the reference does not have.
std::vector<reference::model::CacheView> keep_covered(runner::StepCapture& own, runner::StepCapture& port, const std::set<std::string>& components) {
  std::vector<runner::CapturedItem> items;
  for (runner::CapturedItem& it : own.items) {
    if (!components.count(it.component)) continue;
    if (port.find(it.layer, it.component) != nullptr || it.component == reference::model::name(Component::kIndexScores)) {
      items.push_back(std::move(it));
    }
  }
  own.items = std::move(items);
  std::vector<runner::CapturedItem> port_items;
  for (runner::CapturedItem& it : port.items) {
    if (components.count(it.component)) port_items.push_back(std::move(it));
  }
  port.items = std::move(port_items);
  if (port.logits.empty() || !components.count(reference::model::name(Component::kLogits))) {
    own.logits.clear();
    port.logits.clear();
  }
  std::vector<reference::model::CacheView> a, b;
  std::vector<bool> used(port.caches.size(), false);
  for (reference::model::CacheView& v : own.caches) {
    for (size_t j = 0; j < port.caches.size(); ++j) {
      if (!used[j] && port.caches[j].kind == v.kind && port.caches[j].layer == v.layer) {
        used[j] = true;
        a.push_back(std::move(v));
        b.push_back(port.caches[j]);
        break;
      }
    }
  }
  own.caches = std::move(a);
  std::vector<reference::model::CacheView> unmatched;
  for (size_t j = 0; j < port.caches.size(); ++j) {
    if (!used[j]) unmatched.push_back(std::move(port.caches[j]));
  }
  port.caches = std::move(b);
  return unmatched;
}

}  // namespace

std::vector<StepJudgement> replay(const PortDump& d, const reference::checkpoint::ModelWeights& weights,
                                  const std::vector<int64_t>& token_map, const ConformOptions& o) {
  const reference::ModelConfig& c = d.config;
  const ReplayOps ops(c);  // the reference's ops; switched only for the hypotheses' reruns
  reference::model::Model model(c, weights, token_map, ops);
  const bool fit_hypotheses = conform_detail::order_variant(d, o) && o.hypotheses;
  reference::model::ModelState forced = model.new_state(), free = model.new_state();
  std::set<std::string> every, end_to_end;
  for (const reference::model::ComponentInfo& row : reference::model::component_table()) every.insert(row.name);
  for (Component k : {Component::kEngramIds, Component::kCandidates, Component::kTopk, Component::kIndexScores,
                      Component::kExperts, Component::kLogits}) {
    end_to_end.insert(reference::model::name(k));
  }
  std::vector<StepJudgement> out;
  bool rolled_back = false;  // teacher-forced: a speculative rollback happened (StepJudgement::unforced_caches)
  for (const PortDumpStep& s : d.steps) {
    if (o.stop_after_step >= 0 && s.index > o.stop_after_step) break;
    if (o.progress) {
      std::fprintf(stderr, "conform %s: step %lld (%s, %zu tokens at %lld)\n", d.dir.c_str(),
                   static_cast<long long>(s.index), s.event.c_str(), s.tokens.size(), static_cast<long long>(s.start_pos));
    }
    StepJudgement j;
    j.step = s.index;
    for (int64_t t : s.tokens) {
      DSV41_CHECK(t >= 0 && t < c.vocab_size, s.file, ": key 'step.tokens': id ", t, " is not a token of the vocab (",
                  c.vocab_size, ")");
    }
    runner::CompareContext ctx;
    ctx.step = s.index;
    ctx.expect = judge::Expectation::kMeasured;  // conform_report.cc gives each row its bound
    ctx.candidate_block_size = std::max(1, c.candidate_block_size);
    ctx.candidate_source_layer = c.candidate_source_layer;
    ctx.topk_tie_rel = conform_detail::order_variant(d, o) ? judge::topk_tie_band(c, conform_detail::accumulation(d, o)) : 0.0;
    // A verify step keeps its first s.kept tokens: after it, the state is rolled back to the one
    // before it advanced by those (reference::model::roll_back, hook-free), as the port's caches are.
    const bool rolls_back = s.kept < static_cast<int64_t>(s.tokens.size());
    reference::model::StepOptions step_options;  // a verify step computes every row's head (final_norm_out [T, dim])
    step_options.all_logits = s.event == kPortDumpVerify;
    const auto keep_kept = [&](reference::model::ModelState& state, const reference::model::ModelState& before) {
      if (rolls_back) reference::model::roll_back(model, state, before, s.tokens, s.kept - 1);
    };
    {  // Teacher-forced: every component the port holds replaced by the port's value.
      const std::optional<reference::model::ModelState> before =
          rolls_back || fit_hypotheses ? std::optional(forced) : std::nullopt;
      runner::StepCapture port = port_capture(d, s), own;
      std::map<int, int64_t> reach;
      std::map<int, Tensor<float>> gate_in;
      model.set_hooks(checked_forcing(own, &port, s, c, reach, gate_in));
      std::vector<CacheWrite> writes;  // the caches' pre-quantisation rows (conform_cache_codes.h)
      if (conform_detail::order_variant(d, o)) ops.record_writes(&writes);
      const reference::model::StepRecord rec = [&] {
        try {
          return model.forward_chunk(forced, s.tokens, step_options);
        } catch (const Error& e) {
          model.set_hooks({});
          ops.record_writes(nullptr);
          DSV41_FAIL("port dump '", d.dir, "', ", s.file, ": the teacher-forced step failed: ", e.what());
        }
      }();
      model.set_hooks({});
      ops.record_writes(nullptr);
      if (rolls_back) keep_kept(forced, *before);
      rolled_back = rolled_back || rolls_back;
      j.unforced_caches = rolled_back;
      runner::finish_capture(own, rec, all_caches(model, forced));
      std::vector<reports::MetricRow> by_value = value_judged_rows(d, s, own, port, o, j);
      const std::vector<reference::model::CacheView> extra = keep_covered(own, port, every);
      ctx.teacher_forced = true;
      const auto held = d.components.find(reference::model::name(Component::kExperts));
      if (conform_detail::order_variant(d, o) && held != d.components.end()) {  // the experts' tie analysis
        for (int layer : held->second) {
          const auto x = gate_in.find(layer);
          if (x == gate_in.end() || layer < 0 || layer >= c.n_layers) continue;
          ctx.expert_scores[layer] = runner::expert_tie_scores(x->second, weights.blocks[static_cast<size_t>(layer)], c, layer);
        }
      }
      j.forced = runner::compare_step(own, port, ctx);
      for (reports::MetricRow& r : by_value) j.forced.rows.push_back(std::move(r));
      ctx.expert_scores.clear();
      for (reports::MetricRow& r : cache_code_rows(c, writes, own.caches, port.caches, s.index, s.start_pos)) {
        j.forced.rows.push_back(std::move(r));
      }
      if (fit_hypotheses) {  // directional tests of attn_out (conform_hypotheses.h)
        const auto forcing = [&port](runner::StepCapture& cap) { return runner::capture_hooks(cap, &port); };
        for (reports::MetricRow& r : hypothesis_rows(model, ops, *before, s.tokens, step_options, forcing, own, port, s.index)) {
          j.forced.rows.push_back(std::move(r));
        }
      }
      for (const reference::model::CacheView& v : extra) {  // a cache the reference does not keep: a failure
        reports::MetricRow r;
        r.step = s.index;
        r.position = s.start_pos;
        r.layer = v.layer;
        r.component = "cache." + v.kind;
        r.metric = "present";
        j.forced.rows.push_back(r);
        port.caches.push_back(v);
      }
      j.forced_own = std::move(own);
      j.forced_port = std::move(port);
    }
    if (o.end_to_end) {  // End to end: nothing forced.
      const std::optional<reference::model::ModelState> before = rolls_back ? std::optional(free) : std::nullopt;
      runner::StepCapture port = port_capture(d, s), own;
      model.set_hooks(runner::capture_hooks(own, nullptr));
      const reference::model::StepRecord rec = model.forward_chunk(free, s.tokens, step_options);
      model.set_hooks({});
      if (before) keep_kept(free, *before);
      runner::finish_capture(own, rec, {});
      port.caches.clear();
      keep_covered(own, port, end_to_end);
      ctx.teacher_forced = false;
      j.free = runner::compare_step(own, port, ctx);
      j.free_own = std::move(own);
      j.free_port = std::move(port);
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace conform_detail
}  // namespace dsv41::scenarios::conform
