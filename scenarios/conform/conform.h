// scenarios/conform/conform.h
//
// `dsv41 conform` (docs/conform.md): judges a port's dump (docs/port-dump.md, scenarios/conform/port_dump.h)
// against the reference. Two comparisons per dump, side A the reference ("ref"), side B the port:
//
//   teacher-forced  the dump's steps (tokens, positions) are replayed in the reference with every
//                   component the dump holds forced to the port's own value (capture_hooks, as in
//                   `dsv41 run`'s teacher-forced mode): each component is recomputed from the
//                   port's own inputs and compared with the port's output; the caches after each
//                   step (the reference's packing of the port's forced inputs) byte for byte, with
//                   the port's bytes decoded both ways (token-interleaved, block-planar) when they
//                   differ. The earliest failing row in (step, layer, component) order of
//                   reference/model/hooks.h is the ROOT CAUSE: the first component that is wrong given
//                   right inputs.
//   end-to-end      nothing forced: the reference's own logits (NMSE, max |d|, KL, top-1), top-k
//                   (tie-aware: Jaccard, recall@k, the tie band), candidates, Engram ids and experts
//                   against the port's, step by step.
//
// Beside dsv41's metrics, every float output gets the ones port engineers use: calc_diff
// (1 - 2<x,y>/(|x|^2+|y|^2)), cosine and allclose(atol, rtol).
//
// Tolerances: bit-exact by default (origin "stated": the reference is deterministic and every
// component's semantics are exact given equal inputs); a tolerance file (JSON, docs/conform.md)
// replaces the bit-exact rows of the components it names with its own bounds; the report records
// the file. What the dump does not hold is "not covered" (the support matrix), never "passed".
//
// Verdicts and exit codes (conform_exit_code): 0 pass, 1 a row beyond its bound, 2 bad input or an
// error (a dsv41::Error naming the file and key), 3 coverage too thin to judge (no logits, no
// per-layer tensor component at all, or a dump that does not start at position 0).
//
// Example:
//   PortDump d = read_port_dump("dump");
//   reports::RunReport r = conform(d, reference::checkpoint::ModelWeights::load("w.safetensors", d.config),
//                                  reference::model::default_token_map(d.config), ConformOptions{});
//   if (std::optional<RootCause> rc = root_cause(r)) std::cout << rc->component << " " << rc->layer;
//   return conform_exit_code(r);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reference/model/kv_cache.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::conform {

inline constexpr const char* kConformTeacherForced = "teacher-forced";
inline constexpr const char* kConformEndToEnd = "end-to-end";

// Bounds per component: component name (reference/model/hooks.h, "cache.<kind>", or "*" for every
// component the file does not name) -> metric -> tolerance (with its origin and note).
using ConformTolerances = std::map<std::string, std::map<std::string, reports::Tolerance>>;

// Reads a tolerance file (docs/conform.md): {"component": {"nmse": 1e-6, "max_ulps": 2, "atol": 1e-3,
// "rtol": 1e-2, ..., "origin": "measured", "note": "..."}}. A dsv41::Error naming the file and key
// for an unknown component, an unknown metric, a bound that is not a finite number, or a missing
// origin.
ConformTolerances load_conform_tolerances(const std::string& path);
// The same from the file's text: `where` names it in messages ("--tolerances 'F'"); `check_key`
// throws a dsv41::Error for a key that names nothing judged (its second argument is the
// message's prefix for the key). Used by load_conform_tolerances (components of
// reference/model/hooks.h) and by the Python module's dsv41.check (its op names).
ConformTolerances parse_conform_tolerances(
    const std::string& text, const std::string& where,
    const std::function<void(const std::string& key, const std::string& at)>& check_key);

// A waiver of a tolerance file (docs/conform.md "Waivers"), the file's key "waivers": a list of
// {"component": C or "*", "layers": [lo, hi], "steps": [lo, hi], "metric": M, "reason": "..."}
// ("layers", "steps" and "metric" optional: every one; layer -1 is model.*). A failing row it
// covers is recorded as waived, with the written reason, instead of failing (the row keeps its
// value; its verdict is "measured"); a waiver that covers no failure is said so in the report.
struct ConformWaiver {
  std::string component;
  std::string metric;  // empty: every metric
  int layer_lo = -1, layer_hi = 1 << 30;
  int64_t step_lo = 0, step_hi = int64_t{1} << 62;
  std::string reason;
  bool covers(const reports::MetricRow& r) const;
  std::string describe() const;  // "topk, layers 3-5, steps 0-2, metric rows_equal_frac"
};
// The waivers of a tolerance file's text (none when it has no "waivers" key); a dsv41::Error
// naming `where` and the waiver's index for a malformed one (no reason, an unknown component, a
// range with lo > hi, an unknown key).
std::vector<ConformWaiver> parse_conform_waivers(const std::string& text, const std::string& where);
std::vector<ConformWaiver> load_conform_waivers(const std::string& path);

// The bound of `metric` under the bit-exact claim (docs/conform.md): the rows exact whatever a
// file says (structure, NaN/Inf masks), else the file's bound for the component (`file`: its
// bounds, null when the file names none; "allclose" from its atol/rtol), else the exactness rows
// (bit_equal_frac, rows_equal_frac, equal_frac, bytes_equal_frac) at 1; nullopt: measured only.
std::optional<reports::Tolerance> bit_exact_bound(const std::map<std::string, reports::Tolerance>* file,
                                                  const std::string& metric);

struct ConformOptions {
  std::string tolerances_file;   // "": the claim's defaults
  // The port's claim (docs/conform.md "Claims"): false = bit-exact unless the dump's manifest
  // says "claim": "order-variant"; true = order-variant whatever the manifest says. Under
  // order-variant every float component gets its derived bound (scenarios/judge/derived_bounds.h) on
  // max_rowrel instead of bit equality, the top-k its tie band, and the end-to-end comparison is
  // measured only; the tolerance file still wins for the components it names.
  bool order_variant = false;
  // Under order-variant, the accumulation the port's sums use ("fp32", "fp8-tensor-core":
  // scenarios/judge/derived_bounds.h "Accumulation"); "": the dump's manifest (default "fp32").
  std::string accumulation;
  bool progress = false;         // one line per step on stderr
  bool end_to_end = true;        // also the free-running comparison
  bool hypotheses = true;        // order-variant: the directional tests of attn_out (conform_hypotheses.h)
  int64_t stop_after_step = -1;  // >= 0: judge steps 0..N only (a repro)
  std::string only;              // "component" or "component@layer": judge only these rows (a repro)
  // How the repro lines start ("dsv41 conform DUMP --config C --weights W ..."): a failure's
  // line adds --stop-after-step and --only.
  std::string rerun_prefix = "dsv41 conform";
  std::string name;              // the scenario name ("": the dump directory's last part)
  // A partial port's promise (docs/conform.md "Partial ports"): the components it must cover.
  // Empty: the default coverage rule (model.logits and a per-layer tensor component). Non-empty:
  // the dump is judged on what it holds; it is too thin only when it misses one of these (or
  // holds no step, or starts past position 0).
  std::vector<std::string> require;
};

// --require's list ("attn_out,topk"): component names of the table; a dsv41::Error naming an
// unknown one and the known ones.
std::vector<std::string> parse_require(const std::string& list);

// conform's JUnit: one testsuite per comparison, one testcase per (component, layer) the dump
// holds or a row judged ("layer03.attn_out", "model.logits", "layer02.cache.compressed_kv"): a
// failure with the first failing row and its FAIL lines, a pass (measured-only rows noted), and
// one <skipped> testcase per table component the dump does not hold (an inconclusive failure when
// `require` names it); a comparison too thin to judge adds "(coverage)". Written atomically.
std::vector<reports::JunitSuite> conform_junit_suites(const reports::RunReport& report, const PortDump& dump,
                                                      const std::vector<std::string>& require);
void write_conform_junit(const std::string& path, const reports::RunReport& report, const PortDump& dump,
                         const std::vector<std::string>& require);

// The judgement of one dump: a RunReport with one scenario (kind "conform", side_a "ref",
// side_b "port"), comparisons teacher-forced then end-to-end. scenario_json records the tolerances
// in effect and the support matrix.
reports::RunReport conform(const PortDump& dump, const reference::checkpoint::ModelWeights& weights,
                           const std::vector<int64_t>& token_map, const ConformOptions& options);

// Where the port is first wrong: the teacher-forced comparison's first divergence, else the
// end-to-end one's. nullopt when nothing failed.
struct RootCause {
  std::string mode;        // kConformTeacherForced or kConformEndToEnd
  int64_t step = 0;        // the dump's step index
  int layer = -1;          // -1: model.<component>
  std::string component;   // reference/model/hooks.h name, or "cache.<kind>"
  std::string metric;
  double value = 0;
  std::string detail;      // e.g. "first mismatch at [3, 17] byte 1 ..." or the cache layout diagnosis
  std::string repro;       // one command line that reruns just this
};
std::optional<RootCause> root_cause(const reports::RunReport& report);
// Every independent root cause of the teacher-forced comparison (docs/conform.md "Root causes"):
// the first failure of each (component, layer) that no earlier failure explains (a failure whose
// port read its own wrong cache is explained by that cache's failure), in root-cause order; the
// later steps each fails at in also_steps. Empty when the teacher-forced comparison passed.
struct IndependentRootCause {
  RootCause cause;
  std::vector<int64_t> also_steps;
};
std::vector<IndependentRootCause> root_causes(const reports::RunReport& report);

// 0 pass, 1 fail, 2 error, 3 coverage too thin (reports::exit_code of the verdict).
int conform_exit_code(const reports::RunReport& report);

// The support matrix: every table component with the layers and steps the dump holds it for
// (empty: not covered), one line each; what `dsv41 conform` prints and the report records.
std::vector<std::string> support_matrix_lines(const PortDump& dump);

// Why a port's packed cache differs from the reference's (both [entries, entry_bytes] in the
// reference's format): "" when they are equal; "written block-planar (pages of P entries), read
// token-interleaved" when regrouping the port's pages gives the reference's bytes; "nibbles swapped"
// likewise; else the two decodes' distance from the reference's values.
std::string diagnose_cache_layout(const reference::model::CacheView& ref, const reference::model::CacheView& port);

// The block-planar form of an interleaved cache (pages of `page` entries: the page's value bytes,
// then its scale bytes): what a port with that layout writes. For tests and the self-test zoo.
std::vector<uint8_t> to_block_planar(const reference::model::CacheView& v, int64_t page);

}  // namespace dsv41::scenarios::conform
