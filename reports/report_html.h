// reports/report_html.h
//
// `dsv41 report html`: a divergence report (reports/report.h) as one self-contained HTML page that
// opens offline (docs/report-html.md). The page holds the report's data as JSON, the plotting
// library (D3, from Debian's node-d3, embedded into the binary at build time) and the page's own
// script and style (reports/html/), so it needs no network and no other file.
//
// What the page shows: the run's header, the summary table (one row per comparison, worst first,
// filterable by scenario, side pair, mode and verdict), and per comparison a step x layer heatmap
// of one component's worst metric (click a cell: that component's metrics there, the first
// mismatching coordinate and both values where the report has them, the command that reruns the
// cell), the logits per step (NMSE, KL, top-1 agreement with near-tie flips marked), top-k
// Jaccard and tie band per layer, candidate recall per layer, cache byte agreement per step and
// the speculative acceptance per step.
//
// Example:
//   RunReport r = read_report("report.h5", /*load_tensors=*/true);
//   write_html("report.html", r, {"report.h5"});   // atomic (base/output_file.h)
#pragma once

#include <string>

#include "reports/report.h"

namespace dsv41::reports {

struct HtmlOptions {
  std::string source;  // the report file's name as given (shown on the page)
};

// Whether this build has the plotting library embedded (Debian node-d3 found at configure time).
bool html_available();
// The plotting library's name and version as embedded ("d3 5.16.0"), or "" without it.
std::string html_library();

// The page as text. Throws dsv41::Error when the build has no plotting library (html_available()).
std::string html_page(const RunReport& report, const HtmlOptions& options);

// Writes html_page atomically to path (refuses devices, FIFOs and directories).
void write_html(const std::string& path, const RunReport& report, const HtmlOptions& options);

// The command that reruns one cell of a comparison (its step, layer and component) and keeps the
// two sides' tensors there: the first divergence's rerun command with that cell, or one built
// from the run's config and weights.
std::string rerun_command(const RunMeta& meta, const ScenarioResult& scenario, const Comparison& comparison,
                          int64_t step, int layer, const std::string& component);

}  // namespace dsv41::reports
