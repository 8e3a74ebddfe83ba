// scenarios/agree/agree_report.cc
//
// `dsv41 agree` (scenarios/agree/agree.h): runs each folder in each mode into a report, and the pieces
// both modes share (scenarios/agree/agree_internal.h): metrics, rows, the final-state check.
#include <chrono>
#include <cmath>
#include <filesystem>

#include "base/base.h"
#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/checkpoint/weights.h"
#include "reference/ops/mhc_budget.h"
#include "scenarios/agree/agree_internal.h"

namespace dsv41::scenarios::agree {
namespace agree_detail {

using reference::Tensor;

StreamDiff compare_rows(const std::vector<float>& got, const std::vector<float>& ref, int64_t row) {
  DSV41_CHECK(got.size() == ref.size() && row > 0, "agree: ", got.size(), " values against ", ref.size(),
              " official ones");
  StreamDiff d;
  double num = 0, den = 0;
  size_t equal = 0;
  for (size_t r0 = 0; r0 < ref.size(); r0 += static_cast<size_t>(row)) {
    double rmax = 0, dmax = 0;
    for (size_t i = r0; i < std::min(ref.size(), r0 + static_cast<size_t>(row)); ++i) {
      d.finite = d.finite && std::isfinite(got[i]);
      d.nonzero = d.nonzero || got[i] != 0.0f;
      const double e = double{got[i]} - ref[i];
      num += e * e;
      den += double{ref[i]} * ref[i];
      dmax = std::max(dmax, std::fabs(e));
      rmax = std::max(rmax, std::fabs(double{ref[i]}));
      equal += f32_bits(got[i]) == f32_bits(ref[i]) ? 1 : 0;
    }
    if (rmax > 0) {  // the bf16 ulp of the row's largest official value
      d.max_row_ulps = std::max(d.max_row_ulps, dmax / std::ldexp(1.0, static_cast<int>(std::floor(std::log2(rmax))) - 7));
    } else if (dmax > 0) {
      d.max_row_ulps = std::numeric_limits<double>::infinity();
    }
  }
  d.nmse = den > 0 ? num / den : num;
  d.equal_frac = ref.empty() ? 1.0 : static_cast<double>(equal) / static_cast<double>(ref.size());
  if (!d.finite) d.nmse = d.max_row_ulps = std::numeric_limits<double>::infinity();
  return d;
}

void RowSink::add(int layer, const std::string& component, const std::string& metric, double value,
                  std::optional<reports::Tolerance> tol) {
  reports::MetricRow r;
  r.step = step;
  r.position = position;
  r.layer = layer;
  r.component = component;
  r.metric = metric;
  r.value = value;
  r.tolerance = std::move(tol);
  judge::judge_row(r);
  ++cmp->items_compared;
  if (r.verdict == reports::Verdict::kFail && !cmp->first_divergence) {
    reports::Divergence d = judge::divergence_at(r);
    d.tolerance = *r.tolerance;
    d.detail = detail;
    d.rerun = rerun;
    cmp->first_divergence = d;
  }
  cmp->rows.push_back(std::move(r));
}

bool add_mixes_budget_row(RowSink& sink, int layer, const std::string& name, const reference::HcMixes& ours,
                          const reference::HcMixes& official, const Tensor<float>& x, const reference::HcWeights& w,
                          const reference::ModelConfig& c) {
  const reference::MixesBudget budget = reference::hc_mixes_budget(
      x, w.fn.data(), w.scale.data(), w.base.data(), c.norm_eps, c.hc_sinkhorn_iters, c.hc_eps, official);
  const double ratio = reference::mixes_budget_ratio(ours, official, budget);
  sink.add(layer, name, "budget_ratio", ratio,
           judge::make_tolerance(1.0, false, "analytic",
                                 "docs/mhc.md: the fp32 GEMM's probabilistic bound (lambda 7) through the sigmoid and "
                                 "Sinkhorn, on the official input"));
  return ratio <= 1.0;
}

std::vector<float> official_values(const golden::H5File& f, const std::string& item, bool bf16) {
  return (bf16 ? OracleRun::bf16(f, item) : OracleRun::f32(f, item)).data();
}

void copy_into(Tensor<float>& v, std::vector<float> values, const std::string& what) {
  DSV41_CHECK(static_cast<int64_t>(values.size()) == v.numel(), "agree: the official ", what, " holds ",
              values.size(), " values, the reference's ", v.numel());
  v.data() = std::move(values);
}

int64_t official_topk_offset(const OracleStep& st, const reference::ModelConfig& c) {
  return st.index == 0 ? static_cast<int64_t>(st.tokens.size()) : c.window_size;
}

reference::model::ForwardHooks Defect::wrap(const reference::model::ForwardHooks& inner, const reference::ModelConfig& c,
                                     const OracleStep& st) {
  if (!mutation) return inner;
  return defects::mutated_hooks(*mutation, inner, c, st.start_pos, static_cast<int64_t>(st.tokens.size()), st.index, &fired);
}

std::string coverage_note(const OracleRun& run, bool forced) {
  const reference::ModelConfig& c = run.config();
  const auto any = [&](const std::string& item) {  // item under some step's prefix (layer-free or "layerNN/...")
    for (const OracleStep& st : run.steps()) {
      for (int l = -1; l < c.n_layers + c.n_mtp_layers; ++l) {
        const std::string layer = l < 0 ? "" : l < c.n_layers ? oracle_layer(l) + "/" : "dspark/dspark" + std::to_string(l - c.n_layers) + "/";
        if (st.items->has(st.prefix + layer + item) || st.streams->has(st.prefix + layer + item)) return true;
      }
    }
    return false;
  };
  const auto yes = [](bool b) { return b ? "yes" : "no"; };
  std::string n = "coverage: " + std::to_string(run.steps().size()) + " steps; outputs (tokens, logits) yes; streams ";
  n += run.has_streams() ? (forced ? "yes (forced: every layer's input and pre)" : "yes") : "no";
  n += std::string("; selections (top-k, candidates, experts) ") + yes(any("indexer_topk") || any("gate_indices"));
  n += std::string("; index scores (tie check) ") + yes(any("index_score"));
  n += std::string("; mixes + attn_out (attribution) ") + yes(any("hc_attn_pre") && any("attn_out"));
  n += std::string("; final caches ") + yes(run.has_final_state());
  if (c.n_mtp_layers > 0) {
    n += std::string("; DSpark: drafts ") + yes(any("dspark/draft_ids")) + ", main_hidden " + yes(any("main_hidden")) +
         ", main_x " + yes(any("dspark/dspark_main_x")) + ", block internals " + yes(any("out_stream") && any("dspark/dspark0/attn_out")) +
         ", Markov bias " + yes(any("dspark/markov_0/logits_bias")) + ", ring per step " + yes(any("dspark/dspark0/window_kv_cache"));
  }
  return n;
}

void final_state_rows(const OracleRun& run, const reference::model::Model& model, const reference::model::ModelState& state,
                      RowSink& sink) {
  const reference::ModelConfig& c = run.config();
  if (!run.has_final_state()) {
    sink.cmp->notes.push_back("final caches: not compared (the run holds no final state)");
    return;
  }
  const bool decoded = run.steps().size() > 1;
  const golden::H5File& f = decoded ? run.decode() : *run.steps().front().items;
  const std::string group = decoded ? "decode/final_state/" : "prefill/state/";
  const reference::seam::Ops& ops = model.ops();
  const auto exact = [&](int layer, const char* component, const std::vector<float>& got, const std::string& item) {
    const std::vector<float> want = official_values(f, item, true);
    const StreamDiff d = got.size() == want.size() ? compare_rows(got, want, static_cast<int64_t>(want.size())) : StreamDiff{0, 0, 0};
    sink.add(layer, component, "bit_equal_frac", d.equal_frac,
             judge::make_tolerance(1.0, true, "stated", "the caches hold the official formats' values bit for bit (docs/agreement.md)"));
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const reference::model::LayerState& ls = state.layers[static_cast<size_t>(l)];
    const std::string base = group + oracle_layer(l) + "/";
    exact(l, "cache.window_kv", ls.window_kv.read_all(ops).data(), base + "window_kv_cache");
    if (ls.compressed_kv) {
      const int64_t n = OracleRun::bf16(f, base + "compress_kv_cache").numel() / c.head_dim;
      exact(l, "cache.compressed_kv", ops.download(ls.compressed_kv->read(ops, l, ls.compressed_kv->ratio(), n)).data(),
            base + "compress_kv_cache");
    }
    if (ls.index_keys) {
      const int64_t n = OracleRun::bf16(f, base + "index_k_cache").numel() / c.index_head_dim;
      exact(l, "cache.index_keys", ops.download(ls.index_keys->read(ops, l, ls.index_keys->ratio(), n)).data(),
            base + "index_k_cache");
    }
    if (ls.compressor) {
      // fp32 wkv/wgate rows: torch's one-row GEMV (decode) sums in an order the reference does not
      // reproduce (its multi-row GEMM it does: prefill states are exact).
      for (const bool kv : {true, false}) {
        const std::vector<float> got = ops.download(kv ? ls.compressor->kv : ls.compressor->score).data();
        const std::vector<float> want = official_values(f, base + (kv ? "compressor_kv_state" : "compressor_score_state"), false);
        double worst = got.size() == want.size() ? 0.0 : std::numeric_limits<double>::infinity();
        for (size_t r0 = 0; r0 < want.size() && got.size() == want.size(); r0 += static_cast<size_t>(c.head_dim)) {
          double rmax = 0, dmax = 0;
          for (size_t i = r0; i < r0 + static_cast<size_t>(c.head_dim); ++i) {
            if (std::isinf(want[i]) && want[i] == got[i]) continue;  // a slot never written: -inf on both sides
            rmax = std::max(rmax, std::fabs(double{want[i]}));
            dmax = std::max(dmax, std::fabs(double{got[i]} - want[i]));
          }
          if (rmax > 0) worst = std::max(worst, dmax / std::ldexp(1.0, static_cast<int>(std::floor(std::log2(rmax))) - 23));
          if (std::isnan(dmax)) worst = std::numeric_limits<double>::infinity();
        }
        sink.add(l, kv ? "compressor.kv_state" : "compressor.score_state", "max_slot_ulps", worst,
                 judge::make_tolerance(kAgreeCompressorMaxUlps, false, "measured",
                           "docs/agreement.md: decode's one-row fp32 GEMV order; measured 3-8 fp32 ulp of the slot max, "
                           "bound 4x"));
      }
    }
  }
  dspark_ring_rows(run, model, state, f, group, sink);
}

}  // namespace agree_detail

namespace {

using namespace agree_detail;

reports::ScenarioResult run_mode(const OracleRun& run, reference::model::Model& model, const AgreeOptions& o, bool forced) {
  reports::ScenarioResult r;
  r.name = run.name() + (forced ? "" : ":free");
  r.kind = "agreement";
  r.description = std::string(forced ? "teacher-forced" : "free-running") + " agreement with the official run in " +
                  run.dir() + " (" + std::to_string(run.steps().size()) + " steps, tie rule " + run.tie_rule() + ")";
  r.source = run.dir();
  Defect defect;
  if (o.backend != "ref") {
    DSV41_CHECK(o.backend.rfind("mutant:", 0) == 0, "agree: --backend must be ref or mutant:<component>:L<layer>:S<step>, got '",
                o.backend, "'");
    defect.mutation = defects::parse_mutation(o.backend.substr(7));
  }
  const auto t0 = std::chrono::steady_clock::now();
  reports::Comparison cmp =
      forced ? teacher_forced(run, model, o, defect, r.steps) : free_running(run, model, o, defect, r.steps);
  cmp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool failed = std::any_of(cmp.rows.begin(), cmp.rows.end(),
                                  [](const reports::MetricRow& m) { return m.verdict == reports::Verdict::kFail; });
  if (failed) {
    cmp.verdict = reports::Verdict::kFail;
  } else if (cmp.items_compared == 0 || (defect.mutation && !defect.fired)) {
    cmp.verdict = reports::Verdict::kInconclusive;
    if (defect.mutation && !defect.fired) cmp.notes.push_back("the planted defect never applied: the comparison proves nothing about it");
  } else {
    cmp.verdict = forced ? reports::Verdict::kPass : reports::Verdict::kMeasured;
  }
  r.verdict = cmp.verdict;
  r.comparisons.push_back(std::move(cmp));
  return r;
}

}  // namespace

std::vector<reports::ScenarioResult> agree_run(const OracleRun& run, const AgreeOptions& o) {
  reference::model::Model model(run.config(), reference::checkpoint::ModelWeights::load(run.weights_path(), run.config()), run.token_map());
  std::vector<reports::ScenarioResult> out;
  if (o.teacher_forced) out.push_back(run_mode(run, model, o, true));
  if (o.free_running) out.push_back(run_mode(run, model, o, false));
  return out;
}

reports::RunReport agree(const std::vector<std::string>& dirs, const AgreeOptions& o) {
  DSV41_CHECK(!dirs.empty(), "agree: no oracle run folder given");
  DSV41_CHECK(o.teacher_forced || o.free_running, "agree: no mode");
  reports::RunReport report;
  report.meta.sides = {"official", o.backend};
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& dir : dirs) {
    try {
      const OracleRun run = OracleRun::open(dir);
      if (report.meta.config_name.empty()) {
        report.meta.config_name = run.dir() + "/config.json";
        report.meta.config_hash = reference::config_hash(run.config());
        report.meta.weights = "file:" + run.weights_path();
      }
      for (reports::ScenarioResult& r : agree_run(run, o)) report.scenarios.push_back(std::move(r));
    } catch (const Error& e) {
      reports::ScenarioResult r;
      r.name = std::filesystem::path(dir).lexically_normal().filename().string();
      if (r.name.empty()) r.name = "oracle";
      r.kind = "agreement";
      r.source = dir;
      r.verdict = reports::Verdict::kError;
      r.error = e.what();
      report.scenarios.push_back(std::move(r));
    }
  }
  report.meta.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.verdict = reports::roll_up(report.scenarios);
  return report;
}

}  // namespace dsv41::scenarios::agree
