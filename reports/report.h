// reports/report.h
//
// The divergence report of a scenario run (docs/report-schema.md): what the runner
// (scenarios/runner/runner.h) measured, in memory, and its HDF5 form. The runner fills a RunReport;
// write_report stores it atomically; read_report loads one back (for `dsv41 report show` and
// the schema check); check_report_schema validates a file written by any version.
//
// Verdicts: pass (every checked metric within its tolerance), fail (one beyond it), measured
// (approximate by design: metrics recorded, nothing asserted), inconclusive (evidence missing:
// nothing compared, a side without the component, all outputs zero or non-finite on both sides),
// error (the run could not complete). A run passes only when no comparison is fail, error or
// inconclusive; missing evidence never passes.
//
// Example:
//   RunReport r = runner_output;                 // scenarios/runner/runner.h fills it
//   r.verdict = roll_up(r.scenarios);
//   write_report("report.h5", r);                // atomic; /meta/volatile holds what varies
//   std::cout << format_summary(read_report("report.h5"));
//   if (!check_report_schema("report.h5").empty()) ...;
//   return exit_code(r.verdict);                 // 0 pass/measured, 1 fail, 2 error, 3 inconclusive
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dsv41::reports {

enum class Verdict { kPass = 0, kFail = 1, kMeasured = 2, kInconclusive = 3, kError = 4 };
const char* name(Verdict v);              // "pass", "fail", "measured", "inconclusive", "error"
Verdict parse_verdict(const std::string& s);  // inverse of name(); a dsv41::Error otherwise
// The worse of two verdicts for a roll-up: error > fail > inconclusive > measured > pass.
Verdict worse(Verdict a, Verdict b);
// The order worse() uses: pass 0, measured 1, inconclusive 2, fail 3, error 4 (listings sort
// worst first by it).
int severity(Verdict v);
// The exit code of a run with this verdict (docs/cli.md): pass and measured 0, fail 1, error 2,
// inconclusive 3.
int exit_code(Verdict v);

// A word a POSIX shell reads back as itself (quoted when it holds anything but
// [A-Za-z0-9_@%+=:,./-]): for the rerun commands a report prints.
std::string shell_quote(const std::string& s);

// Where a threshold comes from (the report records it next to every checked value).
//   stated:   by the design (e.g. "same backend, exact cache path: bit-exact", docs/sessions.md)
//   analytic: derived (e.g. from the storage type's rounding)
//   measured: from a recorded measurement (the document and numbers named in `note`)
//   none:     nothing asserted (a measured-only value)
struct Tolerance {
  double bound = 0;           // the value must be <= bound (or >= for metrics where higher is better)
  bool higher_is_better = false;
  std::string origin = "stated";
  std::string note;
};

// Whether a larger value of a metric is better (fractions equal, recalls, Jaccard, agreement:
// *_frac, jaccard*, recall*, *_recall*, top1_agree, tie_equivalent, present). The summary's
// "worst" of an unchecked metric is its minimum for these and its maximum otherwise.
bool metric_higher_is_better(const std::string& metric);

// One metric value of one component at one step of one comparison.
struct MetricRow {
  int64_t step = 0;        // the scenario's step index (a forward call of one session)
  int session = 0;         // the session the step belongs to
  int64_t position = 0;    // the first token position of the step
  int layer = -1;          // -1: not a layer's (logits, final norm)
  std::string component;   // e.g. "attn_out", "topk", "logits", "cache.compressed_kv"
  std::string metric;      // e.g. "nmse", "bit_equal_frac", "jaccard_min"
  double value = 0;
  std::optional<Tolerance> tolerance;  // none: recorded only
  Verdict verdict = Verdict::kMeasured;  // kPass / kFail for checked rows, kMeasured otherwise
};

// The earliest (step, layer, component) beyond its tolerance, in execution order.
struct Divergence {
  int64_t step = 0;
  int session = 0;
  int64_t position = 0;
  int layer = -1;
  std::string component, metric;
  double value = 0;
  Tolerance tolerance;
  std::string detail;  // e.g. "first mismatch at [3, 1, 17] byte 0: a=0.125 b=0.1259"
  std::string rerun;   // one command line that reruns just this case
};

// A tensor kept in the report (a failure's two sides, or on request).
struct StoredTensor {
  int64_t step = 0;
  int layer = -1;
  std::string component;
  std::string side;                 // "a" or "b"
  std::string logical_dtype;        // "bf16", "fp32", "int32", "uint8", "int64"
  std::vector<int64_t> shape;
  std::vector<double> values;       // the values (exact in double for every logical dtype)
};

// One step as the scenario ran it.
struct StepInfo {
  int64_t step = 0;
  int session = 0;
  std::string phase;          // "prefill", "decode", "resume", "replay"
  int64_t start_pos = 0;
  int64_t tokens = 0;
  std::vector<std::string> boundaries;  // e.g. "resume", "window_edge", "chunk_edge"
};

// One draft position of one speculative round as one side decided it (docs/dspark.md): the table
// <comparison>/acceptance. The round's fields repeat on each of its rows; a round with no drafts
// has one row with draft_index -1.
struct AcceptanceRow {
  int64_t step = 0;           // the round's step
  int session = 0;
  std::string side;           // "a" or "b"
  int64_t start_pos = 0;      // P: the position of the round's current token
  int64_t proposed = 0;       // n: drafts offered
  int64_t verified = 0;       // k: drafts the verify-length policy sent to the target
  int64_t accepted = 0;       // m: the side's own accept decision
  int64_t kept = 0;           // drafts both sides kept (side A's decision: lockstep)
  int64_t next_token = -1;    // the side's correction or bonus token (-1: not computed)
  int64_t draft_index = 0;    // i: 0-based position among the drafts (-1: a round without drafts)
  int64_t draft_token = -1;
  double confidence = 0;      // sigmoid of the drafter's confidence logit (NaN: none)
  double predicted_survival = 0;  // prod_{j <= i} confidence_j (NaN: none)
  int realised = 0;           // 1: accepted by this side, 0: rejected, -1: not verified or not decided
  double accept_prob = 0;     // min(1, p_t / p_d) where decided (1 or 0 in greedy mode; NaN: not decided)
};

// Sampled teacher-forced replay (docs/scale.md): side B ran only these steps, each from side A's
// state; the others are neither pass nor fail. Stable: /meta/replay.
struct ReplayRecord {
  uint64_t seed = 0;                  // the draw's seed
  int64_t steps_total = 0;            // steps in the scenario
  std::vector<int64_t> steps_checked; // ascending
};

// What one side of a comparison cost (volatile: /meta/volatile/sides).
struct SideMeasure {
  std::string side;                   // "a" or "b"
  std::string spec;                   // the side as written ("cuda@global")
  double seconds = 0;                 // wall time in the side's steps, resumes, saves and loads
  int64_t peak_device_bytes = -1;     // a device side: high-water mark of its device allocations (-1: not a device side)
  int64_t device_in_use_bytes = -1;   // a device side: the most device memory in use at a step's end (driver's view)
};

// One pair of sides under one comparison mode.
struct Comparison {
  std::string side_a, side_b;       // e.g. "ref@cold", "ref-bf16kv@global"
  std::string mode;                 // "free-running" or "teacher-forced"
  std::string expectation;          // "bitexact", "tolerance" or "measured"
  std::string expectation_origin;   // why (stated / measured, with the document)
  Verdict verdict = Verdict::kInconclusive;
  std::optional<Divergence> first_divergence;
  int64_t steps_compared = 0;
  int64_t items_compared = 0;       // (step, layer, component) outputs compared
  std::vector<std::string> notes;   // e.g. "caches not compared: the formats differ"
  std::vector<MetricRow> rows;
  std::vector<AcceptanceRow> acceptance;  // speculative rounds (empty without them)
  std::vector<StoredTensor> tensors;
  double seconds = 0;               // wall time (volatile)
  std::optional<ReplayRecord> replay;  // sampled replay (none: side B ran every step)
  std::vector<SideMeasure> sides;   // per side (volatile)
};

struct ScenarioResult {
  std::string name;
  std::string kind;          // "cold_prefill", "cache_hit", "resume", "boundary_facts", ...
  std::string description;
  std::string source;        // the scenario file, or "builtin:<name>"
  std::string scenario_json; // the scenario as run (after defaults), JSON text
  uint64_t seed = 0;
  Verdict verdict = Verdict::kInconclusive;
  std::vector<StepInfo> steps;
  std::vector<Comparison> comparisons;
  std::string error;         // verdict kError: what went wrong
};

// One work item of a sweep (`dsv41 sweep`, docs/sweep.md): what it ran (stable: /meta/items) and
// where and how long (volatile: /meta/volatile/items). A `dsv41 run` report has none.
struct ItemMeta {
  std::string item;             // its scenario group name in /scenarios
  std::string scenario;         // the scenario it ran (a built-in name or a file)
  std::string model;            // the plan's model name
  std::string config_name, config_hash, weights, weights_sha256;  // as in RunMeta, for this item
  std::string sides;            // "A,B" from the plan; "" for the scenario's own pairs
  std::string modes;            // comma-joined from the plan; "" for the scenario's own modes
  uint64_t seed = 0;            // the scenario's token seed as run
  double estimated_cost = 0;    // the plan's cost estimate (what the dealing orders by)
  // volatile
  int64_t rank = -1;            // the MPI rank that ran it (-1: never dispatched)
  std::string host;             // that rank's host
  std::string gpu;              // the GPU its process was bound to ("" for a CPU item)
  double seconds = 0;           // wall time of its process
  std::string exit;             // "ok", "exit N", "signal N (name)", "timeout after S s", "not run"
};

// Run-level metadata. Stable fields go to /meta; volatile ones to /meta/volatile.
struct RunMeta {
  std::string config_name;          // "tiny", a path
  std::string config_hash;          // reference::config_hash
  std::string config_json;
  std::string weights;              // "file:<path>" or "generated:seed=<n>"
  std::string weights_sha256;       // of the file, "" for generated weights
  std::map<std::string, uint64_t> seeds;  // every seed the run used, by name
  std::vector<std::string> sides;   // as given
  // volatile
  std::string tool_version, git_commit, command_line, created_utc, host;
  int threads = 1;
  double seconds = 0;
  std::vector<ItemMeta> items;      // a sweep's work items, in plan order (empty: not a sweep)
};

struct RunReport {
  RunMeta meta;
  Verdict verdict = Verdict::kInconclusive;
  std::vector<ScenarioResult> scenarios;
};

// The run's verdict from its scenarios' verdicts (measured counts as pass; no scenario at all
// is inconclusive).
Verdict roll_up(const std::vector<ScenarioResult>& scenarios);

// How far a checked value lies beyond its bound, relative to the bound: (value - bound) / |bound|
// (bound - value for higher_is_better; divided by 1 when the bound is 0). > 0: beyond, <= 0:
// within; +inf for a NaN value. Orders the worst metrics in the summary and format_summary.
double excess(double value, const Tolerance& t);

// One row of the summary table (/summary): one (scenario, comparison, component, metric) with
// its worst value over the comparison's rows (steps, layers, positions): the largest excess()
// among the checked rows, or the largest value when no row is checked (NaN counts as largest).
struct SummaryRow {
  std::string scenario;
  int64_t comparison = 0;  // index in the scenario's comparisons (the NN of its group)
  std::string side_a, side_b, mode, component, metric;
  double value = 0;        // the worst value
  int64_t step = 0;        // where it is
  int64_t layer = -1;
  double bound = 0;        // its bound (NaN: none)
  bool higher_is_better = false;
  std::string origin;      // its tolerance's origin ("": none)
  Verdict verdict = Verdict::kMeasured;  // the worst verdict of the aggregated rows
  int64_t rows = 0;        // how many MetricRows were aggregated
};

// The summary table of a report, in run order (scenario, comparison, first appearance of the
// (component, metric) pair in its rows).
std::vector<SummaryRow> summarize(const RunReport& report);

// Writes the report (schema docs/report-schema.md) atomically to path. Refuses (dsv41::Error,
// nothing written, an existing file at path left as it was) an empty scenario name, a name
// containing '/' or equal to "." or "..", duplicate scenario names, a tolerance without an
// origin, a step boundary containing ',', and a stored tensor whose values do not fit its
// logical dtype or shape.
void write_report(const std::string& path, const RunReport& report);

// Throws when `name` cannot be a scenario's group name in a report (empty, contains '/', "." or
// ".."): what write_report refuses, for a verb to check before its run.
void check_scenario_name(const std::string& name);

// Reads a report written by write_report (a dsv41::Error naming the file and what is wrong when it
// is not one: not HDF5, truncated, not a dsv41 report, another schema_version, a missing object).
// Tensors are loaded only with load_tensors.
RunReport read_report(const std::string& path, bool load_tensors = false);

// The work items of a sweep report (/meta/items with /meta/volatile/items), in plan order; empty
// for a report without them. A dsv41::Error names the file and the object when they are broken.
std::vector<ItemMeta> read_report_items(const std::string& path);

// Checks a file against the schema: every required group, dataset and attribute, their types and
// lengths, the summary table's columns, verdict names, and that the stored verdicts are consistent
// (a comparison with a failing row is "fail"; a scenario's verdict is the worst of its
// comparisons unless "error"; the root verdict is roll_up of the scenarios'). Returns the problems
// found (empty: valid). Throws dsv41::Error only when the file cannot be opened as HDF5.
std::vector<std::string> check_report_schema(const std::string& path);

// Which comparisons a summary shows (`dsv41 report show --scenario/--pair/--mode/--verdict`); an
// empty field matches everything. `pair` is "A,B" (side_a A and side_b B) or one side name (either
// side); a side name matches with or without its "@cache-path" suffix. `verdicts` lists verdict
// names (any of them matches).
struct SummaryFilter {
  std::string scenario, pair, mode;
  std::vector<Verdict> verdicts;
  bool matches(const ScenarioResult& s, const Comparison& c) const;
  bool matches_scenario(const ScenarioResult& s) const;  // a scenario line (an error, no comparisons)
  bool empty() const { return scenario.empty() && pair.empty() && mode.empty() && verdicts.empty(); }
};

struct SummaryOptions {
  int max_rows = 20;     // worst checked (and measured) metrics listed
  SummaryFilter filter;
  std::string by;        // "" (none), "layer" or "step": a profile of each shown comparison
  bool quiet = false;    // only the verdict line with the counts
  size_t width = 120;    // no line longer (a longer word runs on; commands break with " \")
};

// The readable summary `dsv41 report show` prints, lines of at most options.width columns: the
// run's header (verdict, config, weights, sides), the counts of scenarios and comparisons by
// verdict, one entry per comparison, worst first (details on indented lines), the worst checked
// metrics (by how far beyond tolerance), the worst measured metrics of measured pairs, the
// profiles (--by) and the rerun commands of the failures. Throws dsv41::Error when the filter
// names a scenario or side the report does not have (the message lists what it has).
std::string format_summary(const RunReport& report, const SummaryOptions& options);
std::string format_summary(const RunReport& report, int max_rows = 20);

// The --by profile of one comparison: per layer (or step) the rows, failing rows, the worst NMSE,
// the lowest bit-equal fraction and the worst checked metric, each with where it is.
std::vector<std::string> profile_lines(const Comparison& comparison, const std::string& by, size_t width);

// JUnit XML: one testsuite per scenario, one testcase per comparison named "<a> vs <b> [<mode>]":
// fail -> <failure type="fail"> (first divergence, rerun command), error -> <error>,
// inconclusive -> <failure type="inconclusive"> (missing evidence never looks like a pass),
// measured -> passed with a <system-out> note; a scenario that errored adds a testcase "(scenario)"
// with <error>. For CI dashboards. Written atomically (base/output_file.h).
void write_junit(const std::string& path, const RunReport& report);

// JUnit XML from testcases a verb builds itself (conform: one per (component, layer),
// docs/conform.md "Partial ports"): kSkipped -> <skipped message=...> (a component the port does
// not cover), kFail -> <failure type="fail">, kInconclusive -> <failure type="inconclusive">,
// kError -> <error>. Written atomically (base/output_file.h).
struct JunitCase {
  enum class Kind { kPass, kFail, kInconclusive, kSkipped, kError };
  std::string classname, name;
  Kind kind = Kind::kPass;
  std::string message;   // the one-line reason (fail, inconclusive, skipped, error)
  std::string body;      // details: values, bounds, repro lines; or a pass's <system-out>
  double seconds = 0;
};
struct JunitSuite {
  std::string name;
  std::vector<std::pair<std::string, std::string>> properties;
  std::vector<JunitCase> cases;
};
void write_junit_suites(const std::string& path, const std::vector<JunitSuite>& suites);

}  // namespace dsv41::reports
