// python/bind_conform.cc
//
// dsv41.conform (docs/python.md, "Conformance"): `dsv41 conform DUMP` as a function: the same
// checks in the same order (the dump read and validated, the config's hash against the dump's,
// the token map's length, the tolerance file refused before the weights are read), the same
// judgement (scenarios/conform/conform.h) and the same root cause; the verdicts come back as a dict, and
// the HDF5 report / JUnit are written where asked.
#include <optional>
#include <string>

#include "python/bindings.h"
#include "reference/ops/config.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::python {

namespace {

py::dict row_dict(const reports::MetricRow& r) {
  py::dict d;
  d["step"] = r.step;
  d["layer"] = r.layer;
  d["component"] = r.component;
  d["metric"] = r.metric;
  d["value"] = r.value;
  d["verdict"] = reports::name(r.verdict);
  if (r.tolerance) {
    d["bound"] = r.tolerance->bound;
    d["origin"] = r.tolerance->origin;
  } else {
    d["bound"] = py::none();
    d["origin"] = py::none();
  }
  return d;
}

py::dict conform_py(const std::string& dump, const std::string& weights, const std::string& config,
                    std::optional<std::vector<int64_t>> token_map, const std::string& tolerances, bool order_variant,
                    bool end_to_end, const std::string& only, int64_t stop_after_step, const std::string& report,
                    const std::string& junit, bool rows, const std::string& accumulation) {
  const scenarios::conform::PortDump d = scenarios::conform::read_port_dump(dump);
  const reference::ModelConfig c = config.empty() ? d.config : reference::load_config(config);
  if (reference::config_hash(c) != d.config_hash) {
    DSV41_FAIL("--config '", config, "' (hash ", reference::config_hash(c), ") is not the config of the dump '", dump,
               "' (", scenarios::conform::kPortDumpManifest, ": hash ", d.config_hash, ")");
  }
  std::vector<int64_t> map = token_map ? *token_map : reference::model::default_token_map(c);
  if (static_cast<int64_t>(map.size()) != c.vocab_size) {
    DSV41_FAIL("token_map: ", map.size(), " ids, but the config has a vocab of ", c.vocab_size);
  }
  scenarios::conform::ConformOptions o;
  o.tolerances_file = tolerances;
  if (!tolerances.empty()) scenarios::conform::load_conform_tolerances(tolerances);
  o.end_to_end = end_to_end;
  o.only = only;
  o.stop_after_step = stop_after_step;
  o.order_variant = order_variant;
  if (!accumulation.empty()) scenarios::judge::accumulation_from_name(accumulation);  // a dsv41.Error naming the valid ones
  o.accumulation = accumulation;
  o.rerun_prefix = "dsv41 conform " + dump + " --config " + (config.empty() ? std::string("DUMP_CONFIG") : config) +
                   " --weights " + weights + (tolerances.empty() ? "" : " --tolerances " + tolerances) +
                   (order_variant ? " --order-variant" : "") +
                   (accumulation.empty() ? "" : " --accumulation " + accumulation);
  if (!report.empty() || !junit.empty()) reports::check_scenario_name("dump");
  reports::RunReport r;
  {
    py::gil_scoped_release release;
    r = scenarios::conform::conform(d, reference::checkpoint::ModelWeights::load(weights, c), map, o);
  }
  r.meta.config_name = config.empty() ? dump : config;
  r.meta.weights = "file:" + weights;
  if (!report.empty()) reports::write_report(report, r);
  if (!junit.empty()) reports::write_junit(junit, r);
  py::dict out;
  out["verdict"] = reports::name(r.verdict);
  out["exit_code"] = scenarios::conform::conform_exit_code(r);
  if (const std::optional<scenarios::conform::RootCause> rc = scenarios::conform::root_cause(r)) {
    py::dict rd;
    rd["mode"] = rc->mode;
    rd["step"] = rc->step;
    rd["layer"] = rc->layer;
    rd["component"] = rc->component;
    rd["metric"] = rc->metric;
    rd["value"] = rc->value;
    rd["detail"] = rc->detail;
    rd["repro"] = rc->repro;
    out["root_cause"] = rd;
  } else {
    out["root_cause"] = py::none();
  }
  py::list comparisons;
  for (const reports::Comparison& cmp : r.scenarios.front().comparisons) {
    py::dict cd;
    cd["mode"] = cmp.mode;
    cd["verdict"] = reports::name(cmp.verdict);
    cd["notes"] = cmp.notes;
    cd["steps_compared"] = cmp.steps_compared;
    cd["items_compared"] = cmp.items_compared;
    if (rows) {
      py::list l;
      for (const reports::MetricRow& row : cmp.rows) l.append(row_dict(row));
      cd["rows"] = l;
    }
    comparisons.append(cd);
  }
  out["comparisons"] = comparisons;
  out["claim"] = d.claim;
  out["support_matrix"] = scenarios::conform::support_matrix_lines(d);
  out["summary"] = reports::format_summary(r);
  return out;
}

}  // namespace

void register_conform(py::module_& m) {
  m.def("conform", &conform_py, py::arg("dump"), py::kw_only(), py::arg("weights"), py::arg("config") = "",
        py::arg("token_map") = py::none(), py::arg("tolerances") = "", py::arg("order_variant") = false,
        py::arg("end_to_end") = true, py::arg("only") = "", py::arg("stop_after_step") = -1,
        py::arg("report") = "", py::arg("junit") = "", py::arg("rows") = true, py::arg("accumulation") = "",
        "`dsv41 conform DUMP --config C --weights W` (docs/conform.md) -> {verdict, exit_code, root_cause, "
        "comparisons [{mode, verdict, notes, rows}], claim, support_matrix, summary}");
}

}  // namespace dsv41::python
