// reports/report_diff.h
//
// `dsv41 report diff A.h5 B.h5`: two reports of the same scenarios (two commits of a port, two
// backends) compared item by item: what got better, what got worse, new failures first. A
// comparison is matched by its scenario and its index (its NN), so the same scenarios run with
// other sides still match (the diff says when the sides differ); an item is one row of /summary
// (a comparison's component and metric, at its worst value).
//
// Regressed (exit 1): a comparison whose verdict got worse into fail, error or inconclusive (or
// that B lacks: missing evidence never passes), a checked item that passed in A and fails in B, a
// checked item failing in both that moved further beyond its bound, a scenario that errored in B
// only, a comparison new in B that does not pass. Measured (unchecked) items are listed when their
// worst value moved, never a regression.
//
// Example:
//   const ReportDiff d = diff_reports(read_report("a.h5"), read_report("b.h5"), {"a.h5", "b.h5"});
//   std::cout << d.text;
//   return d.regressed ? 1 : 0;
#pragma once

#include <cstddef>
#include <string>

#include "reports/report.h"

namespace dsv41::reports {

struct DiffOptions {
  std::string name_a = "A", name_b = "B";  // how the two reports are named in the text
  int max_rows = 20;                       // lines per section (the counts are always complete)
  size_t width = 120;                      // no line longer
};

struct ReportDiff {
  std::string text;
  bool regressed = false;
  size_t new_failures = 0, worse = 0, missing = 0, better = 0, measured_changes = 0, unchanged = 0;
};

ReportDiff diff_reports(const RunReport& a, const RunReport& b, const DiffOptions& options);

}  // namespace dsv41::reports
