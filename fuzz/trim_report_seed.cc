// fuzz/trim_report_seed.cc: makes fuzz_report's small tensor-bearing seed from a run report
// written by `dsv41 run` (fuzz/README.md): keeps the first metric row of each kind (metric, layer or
// not, checked or not, verdict) of each comparison (at most ROWS),
// its tensors, steps, notes and first divergence, and writes it back with reports::write_report,
// so the seed is a report dsv41 itself writes, small enough (tens of KB, against 150-250 KB for
// the untrimmed run) that fuzz_report runs several times faster on it.
// Usage: trim_report_seed IN.h5 OUT.h5 ROWS
#include "base/error.h"
#include "reports/report.h"

#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: trim_report_seed IN.h5 OUT.h5 ROWS\n";
    return 2;
  }
  try {
    dsv41::reports::RunReport r = dsv41::reports::read_report(argv[1], true);
    const std::size_t rows = std::stoul(argv[3]);
    for (auto& s : r.scenarios)
      for (auto& c : s.comparisons)
      {
        // The first row of each kind (metric, a layer's or not, checked or not, verdict), at
        // most ROWS of them: every kind of row the reader parses stays represented.
        std::set<std::tuple<std::string, bool, bool, int>> seen;
        std::vector<dsv41::reports::MetricRow> kept;
        for (const auto& row : c.rows)
          if (kept.size() < rows && 
              seen.insert({row.metric, row.layer < 0, row.tolerance.has_value(),
                           static_cast<int>(row.verdict)})
                  .second) kept.push_back(row);
        c.rows = std::move(kept);
      }
    dsv41::reports::write_report(argv[2], r);
  } catch (const std::exception& e) {
    std::cerr << "trim_report_seed: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
