// scenarios/selftest/small_zoo.h
//
// `dsv41 selftest --small-bugs` (docs/selftest.md "Small bugs"): the verifier's power against
// SMALL realistic bugs under the order-variant claim. The bug zoo (bug_zoo.h) holds mostly large
// bugs; a correct order-variant port's noise is a few ulps, and these are 0.1-1% effects or one
// byte of one cache block: a softmax scale off by 1% at one layer, a RoPE position one off at one
// layer, a wrong RMSNorm eps, one expert's output x1.01, one cache scale byte or one E2M1 code one
// step off, one row of a component x1.01 or x1.001, and the zoo's small ones (Sinkhorn one
// iteration short, the newest block not pinned, the sink in the numerator).
//
// Each bug is planted one of two ways, reusing the zoo's machinery:
//   ops      a BugOps behind the seam (scenarios/defects/small_bug_ops.h, or a zoo bug's ops)
//   mutant   a planted value (scenarios/defects/mutants.h spec, e.g. attn_out:L2:S1:x1.01) applied
//            by the dump's driver (write_scenario_dump's DumpDefects)
// The dump of the zoo scenario (zoo_scenario()) is written through the `forward --dump` code path,
// judged by conform under order-variant, and the root cause compared with where the bug was
// planted (the component whose op or value is wrong, its layer, the first step it changes).
//
// Example:
//   SmallZooOptions o;  o.bugs = {"softmax_scale_1pct"};
//   SmallZooResult r = run_small_zoo(o, std::cerr);
//   std::cout << format_small_zoo_table(r);   // exit: small_zoo_exit_code(r, 0.95)
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "reference/seam/ops.h"

namespace dsv41::scenarios::selftest {

struct SmallBug {
  std::string name;         // what --bugs takes
  std::string description;  // one line
  std::string origin;       // why it is realistic (ports.md item, semantics.md pitfall)
  std::string how;          // "ops sparse_attn", "mutant attn_out:L2:S1:x1.01", ...
  // Where conform must locate it in zoo_scenario(): the planted component (hooks.h name or
  // "cache.<kind>"), layer (-1: model.*) and the first step the bug changes.
  std::string expected_component;
  int expected_layer = -1;
  int64_t expected_step = 0;
  // A bug planted in every layer's op: also located at any layer's `also_components` (the other
  // outputs of the same op) in expected_step. The first layer can be the least visible: a Sinkhorn
  // one iteration short changes 8 of layer 0's 720 comb values by an ulp.
  bool every_layer = false;
  std::vector<std::string> also_components;
  bool ci = false;          // in the `--ci` slice (fast and located today)
  // ops: the buggy ops planted in `base` (every op it does not get wrong runs there; nullptr: none).
  using OpsFactory =
      std::function<std::unique_ptr<reference::seam::Ops>(const reference::ModelConfig&, const reference::seam::Ops& base)>;
  OpsFactory make_ops;
  bool reference_only = false;  // a zoo bug (bug_zoo.h): planted on the reference whatever the base
  std::string mutation;     // mutant: a spec of scenarios/defects/mutants.h ("": none)
};

// Every small bug, in a fixed order.
const std::vector<SmallBug>& small_zoo();
// The small bug named `name`; a dsv41::Error listing the names otherwise.
const SmallBug& small_bug(const std::string& name);

struct SmallZooOptions {
  std::string config, weights;    // "": the built-in tiny oracle's
  std::vector<std::string> bugs;  // names; empty: every small bug (or the CI slice with ci)
  bool ci = false;
  std::string dir;                // where the dumps go; "": a temporary directory
  bool keep = false;              // keep every dump
  bool progress = true;           // one line per run on the progress stream
  // The order-variant claim's accumulation the dumps are judged under ("": fp32;
  // "fp8-tensor-core": the wider bounds of a port on fp8 tensor cores, scenarios/judge/derived_bounds.h).
  std::string accumulation;
  // The backend the bugs are planted in (scenarios/runner/backend.h names: "ref-order:trunc13",
  // "cuda", ...; "": the reference): the clean run is that backend, each bug that backend with the
  // bug's op wrong. accumulation "" then means the backend's (runner::backend_accumulation).
  std::string base;
};

// One line of the detection table.
struct SmallZooRow {
  std::string bug;             // "clean" for the reference itself
  std::string how;
  std::string expected;        // "component@layer step S" ("no alarm" for clean)
  bool fired = false;          // the bug changed the dump
  int conform_exit = 0;
  bool flagged = false;        // conform exit 1
  bool located = false;        // the root cause is the expected (component, layer, step)
  std::string located_at;      // the root cause "component@layer step S (metric value)" ("" when none)
  std::string at_planted;      // the checked row at the planted (component, layer, step) nearest its
                               // bound: "metric value / bound (mode)" ("" when none was checked)
  std::string verdict;         // ok, MISSED, MISLOCATED, NOT-FIRED, ALARM (clean flagged), ERROR
  std::string detail;          // the root cause's detail, or the error
  double seconds = 0;
};
struct SmallZooResult {
  std::vector<SmallZooRow> rows;  // clean first, then the bugs in zoo order
  bool error = false;
};

SmallZooResult run_small_zoo(const SmallZooOptions& options, std::ostream& progress);
// The markdown detection table and a summary line ("located N of M (P%)").
std::string format_small_zoo_table(const SmallZooResult& r);
// The fraction of bug rows located (verdict ok).
double small_zoo_located_fraction(const SmallZooResult& r);
// 0: the clean run passes, every bug fired, and at least `goal` of the bugs are located; 1
// otherwise; 2 when a run errored.
int small_zoo_exit_code(const SmallZooResult& r, double goal);

}  // namespace dsv41::scenarios::selftest
