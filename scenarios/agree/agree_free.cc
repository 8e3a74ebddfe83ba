// scenarios/agree/agree_free.cc
//
// The free-running agreement of scenarios/agree/agree.h: nothing forced, against the lowest-index run.
// Everything is measured (a near-tie selection flips on a one-ulp difference upstream and changes
// what follows it); the rows make the drift profile `dsv41 agree` prints: per layer, where routing,
// top-k and the stream start to drift.
#include <algorithm>
#include <cstdio>
#include <map>

#include "base/error.h"
#include "scenarios/agree/agree_internal.h"
#include "scenarios/agree/official_dump.h"

namespace dsv41::scenarios::agree::agree_detail {
namespace {

using reference::model::Component;
using reference::model::ForwardHooks;
using reference::Tensor;

double rows_equal(const Tensor<int32_t>& got, const std::vector<int32_t>& want) {
  if (got.rank() < 1 || got.dim(0) == 0 || static_cast<size_t>(got.numel()) != want.size()) return 0.0;
  const int64_t rows = got.dim(0), w = got.numel() / rows;
  int64_t equal = 0;
  for (int64_t r = 0; r < rows; ++r) {
    equal += std::equal(got.data().begin() + r * w, got.data().begin() + (r + 1) * w, want.begin() + r * w);
  }
  return static_cast<double>(equal) / static_cast<double>(rows);
}

}  // namespace

reports::Comparison free_running(const OracleRun& run, reference::model::Model& model, const AgreeOptions& o, Defect& defect,
                                 std::vector<reports::StepInfo>& steps) {
  const reference::ModelConfig& c = run.config();
  // The streams and caches are compared where the main files are the lowest-index run and hold them.
  const bool lowest = run.tie_rule() == "lowest_index";
  const bool streams = lowest && run.has_streams(), caches = lowest && run.has_final_state();
  reports::Comparison cmp;
  cmp.side_a = "official";
  cmp.side_b = o.backend;
  cmp.mode = "free-running";
  cmp.expectation = "measured";
  cmp.expectation_origin = "docs/agreement.md: near-tie selections flip on one-ulp differences, so a free run "
                           "drifts by design; measured only";
  cmp.notes.push_back(coverage_note(run, false));
  if (!lowest) {
    cmp.notes.push_back("the run's streams and caches are torch's tie order: the free run is compared on the "
                        "lowest-index run's logits and selections only");
  }
  RowSink sink;
  sink.cmp = &cmp;
  sink.rerun = "dsv41 agree '" + run.dir() + "' --mode free-running";
  const bool dspark = run_has_dspark(run);  // our own draft after each decode step, measured
  reference::model::ModelState state = model.new_state();
  for (const OracleStep& st : run.steps()) {
    if (o.progress) {
      std::fprintf(stderr, "agree %s: free-running step %lld\n", run.name().c_str(), static_cast<long long>(st.index));
    }
    steps.push_back({st.index, 0, st.phase, st.start_pos, static_cast<int64_t>(st.tokens.size()), {}});
    sink.step = st.index;
    sink.position = st.start_pos;
    std::map<int, std::vector<float>> out_stream;
    ForwardHooks h;
    if (streams) {
      h.tensor = [&out_stream](Component what, int layer, Tensor<float>& v) {
        if (what == Component::kOutStream) out_stream[layer] = v.data();
      };
    }
    model.set_hooks(defect.wrap(h, c, st));
    const reference::model::StepRecord rec = model.forward_chunk(state, st.tokens);
    model.set_hooks({});
    ++cmp.steps_compared;
    const golden::H5File& tie = *st.tie_items;
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string base = st.prefix + oracle_layer(l) + "/";
      if (streams) {
        const StreamDiff d = compare_rows(out_stream.at(l), official_values(*st.streams, base + "out_stream", true), c.dim);
        sink.add(l, "out_stream", "nmse", d.nmse, std::nullopt);
        sink.add(l, "out_stream", "bit_equal_frac", d.equal_frac, std::nullopt);
      }
      if (rec.experts.count(l) && tie.has(base + official_item("experts"))) {
        sink.add(l, "experts", "rows_equal_frac", rows_equal(rec.experts.at(l), OracleRun::i32(tie, base + official_item("experts")).data()),
                 std::nullopt);
      }
      if (rec.topk.count(l) && tie.has(base + official_item("topk"))) {
        std::vector<int32_t> want = OracleRun::i32(tie, base + official_item("topk")).data();
        const int64_t offset = official_topk_offset(st, c);
        for (int32_t& x : want) x = x < 0 ? -1 : static_cast<int32_t>(x - offset);
        sink.add(l, "topk", "rows_equal_frac", rows_equal(rec.topk.at(l), want), std::nullopt);
      }
    }
    const std::vector<float> ref = official_values(tie, st.tie_logits, false);
    const StreamDiff d = compare_rows(rec.logits, ref, static_cast<int64_t>(ref.size()));
    const auto argmax = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    sink.add(-1, "logits", "nmse", d.nmse, std::nullopt);
    sink.add(-1, "logits", "top1_agree", argmax(rec.logits) == argmax(ref) ? 1.0 : 0.0, std::nullopt);
    if (dspark) dspark_free_rows(run, st, model, state, argmax(rec.logits), defect, sink);
  }
  if (caches) {
    // The caches at the end: measured here (exact only when every selection agreed).
    RowSink measured = sink;
    reports::Comparison scratch;
    measured.cmp = &scratch;
    final_state_rows(run, model, state, measured);
    for (reports::MetricRow& r : scratch.rows) {
      r.tolerance.reset();
      r.verdict = reports::Verdict::kMeasured;
      cmp.rows.push_back(std::move(r));
      ++cmp.items_compared;
    }
  }
  return cmp;
}

}  // namespace dsv41::scenarios::agree::agree_detail
