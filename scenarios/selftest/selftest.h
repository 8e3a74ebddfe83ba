// scenarios/selftest/selftest.h
//
// `dsv41 selftest` (docs/selftest.md): the verifier proving its own power. For the clean
// reference and for each bug of the zoo (scenarios/selftest/bug_zoo.h): the dump of the zoo scenario is
// written (the `forward --dump` code path, with the bug planted), judged by `conform`, and the
// root cause compared with where the bug must be located.
//
// Example:
//   SelftestOptions o;  o.bugs = {"sink_in_numerator"};  o.dir = "/tmp/st";
//   SelftestResult r = run_selftest(o, std::cout);
//   return selftest_exit_code(r);   // 0: clean passes, every bug flagged and located
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace dsv41::scenarios::selftest {

struct SelftestOptions {
  std::string config;            // config.json ("": the built-in tiny oracle's)
  std::string weights;           // safetensors ("": the built-in tiny oracle's)
  std::vector<std::string> bugs; // names; empty: the whole zoo (or the CI subset with ci)
  bool ci = false;               // the CI subset (ZooBug::ci)
  bool order_variant = false;    // judge every dump under the order-variant claim (docs/conform.md)
  std::string dir;               // where the dumps go (one directory per run); "": a temp dir
  bool keep = false;             // keep the dumps (default: removed after each judgement)
  bool progress = true;          // one line per run on stderr
};

// One line of the detection table.
struct SelftestRow {
  std::string bug;            // "clean" for the reference itself
  std::string kind;           // "-", "ops", "dump", "driver"
  bool fired = false;         // the dump differs from the clean one (the bug changed the output)
  bool flagged = false;       // conform exit 1
  int conform_exit = 0;
  std::string component;      // the root cause ("" when none)
  int layer = -1;
  int64_t step = -1;
  std::string expected;       // "component@layer step S" ("no alarm" for clean)
  std::string verdict;        // ok, MISSED, MISLOCATED, ALARM (clean flagged), NOT-FIRED
  std::string detail;         // the root cause's detail
  double seconds = 0;         // dump + conform
};

struct SelftestResult {
  std::vector<SelftestRow> rows;  // clean first, then the bugs in zoo order
  bool error = false;             // a run threw (its row's verdict is "ERROR")
};

SelftestResult run_selftest(const SelftestOptions& options, std::ostream& progress);
// The detection table (markdown; the measured one is in bench/RESULTS.md, "The self-test's detection table").
std::string format_selftest_table(const SelftestResult& r);
// JUnit XML: one testcase per row.
void write_selftest_junit(const SelftestResult& r, const std::string& path);
// 0: clean passes and every bug is flagged and located; 1 otherwise; 2 when a run errored.
int selftest_exit_code(const SelftestResult& r);

}  // namespace dsv41::scenarios::selftest
