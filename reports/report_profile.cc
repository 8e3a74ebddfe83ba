// reports/report_profile.cc: profile_lines, the `dsv41 report show --by layer|step` table of a
// comparison: per layer (or step) how many rows, how many fail, the worst NMSE, the lowest
// bit-equal fraction and the worst failing checked metric (by excess over its bound; "all N
// within" when none fails), each with where.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "reports/internal/text.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

std::string num(double v) { return text::num(v, 4); }

struct Cell {
  int64_t rows = 0, fails = 0, checked_rows = 0;
  const MetricRow* nmse = nullptr;      // the largest nmse (NaN is largest)
  const MetricRow* bit_equal = nullptr; // the smallest bit_equal_frac
  const MetricRow* checked = nullptr;   // the largest excess among checked rows
};

bool larger(double a, double b) { return std::isnan(a) ? !std::isnan(b) : a > b; }

}  // namespace

std::vector<std::string> profile_lines(const Comparison& c, const std::string& by, size_t width) {
  DSV41_CHECK(by == "layer" || by == "step", "report show --by: '", by, "' is not 'layer' or 'step'");
  const bool per_layer = by == "layer";
  std::map<int64_t, Cell> cells;  // in order of the layer (-1: not a layer's) or step
  for (const MetricRow& r : c.rows) {
    Cell& cell = cells[per_layer ? r.layer : r.step];
    ++cell.rows;
    cell.fails += r.verdict == Verdict::kFail;
    cell.checked_rows += r.tolerance.has_value();
    if (r.metric == "nmse" && (cell.nmse == nullptr || larger(r.value, cell.nmse->value))) cell.nmse = &r;
    if (r.metric == "bit_equal_frac" && (cell.bit_equal == nullptr || r.value < cell.bit_equal->value)) cell.bit_equal = &r;
    if (r.tolerance && (cell.checked == nullptr || excess(r.value, *r.tolerance) > excess(cell.checked->value, *cell.checked->tolerance))) {
      cell.checked = &r;
    }
  }
  // Where a value is: the component and the other coordinate (the step for a layer's row, the
  // layer for a step's).
  const auto at = [&](const MetricRow* r) {
    if (r == nullptr) return std::string("-");
    std::string s = r->component + (per_layer ? " s" + std::to_string(r->step) : (r->layer >= 0 ? " L" + std::to_string(r->layer) : ""));
    return s;
  };
  std::vector<std::string> out;
  char line[512];
  std::snprintf(line, sizeof line, "  %6s %6s %5s  %-26s %-28s %s", per_layer ? "layer" : "step", "rows", "fail",
                "max nmse (where)", "min bit_equal_frac (where)", "worst checked (value / bound)");
  out.emplace_back(line);
  if (cells.empty()) out.emplace_back("  (no metric rows)");
  for (const auto& [key, cell] : cells) {
    const std::string nmse = cell.nmse ? num(cell.nmse->value) + " " + at(cell.nmse) : "-";
    const std::string bit = cell.bit_equal ? num(cell.bit_equal->value) + " " + at(cell.bit_equal) : "-";
    std::string worst = cell.checked_rows == 0 ? "-" : "all " + std::to_string(cell.checked_rows) + " within";
    if (cell.checked != nullptr && cell.fails > 0) {
      worst = cell.checked->metric + " " + num(cell.checked->value) + " / " + num(cell.checked->tolerance->bound) + " " +
              at(cell.checked);
    }
    const std::string label = per_layer && key < 0 ? "-" : std::to_string(key);
    std::snprintf(line, sizeof line, "  %6s %6lld %5lld  %-26s %-28s %s", label.c_str(), static_cast<long long>(cell.rows),
                  static_cast<long long>(cell.fails), nmse.c_str(), bit.c_str(), worst.c_str());
    std::string l = line;
    if (l.size() > width) l = l.substr(0, width - 3) + "...";
    out.push_back(l);
  }
  return out;
}

}  // namespace dsv41::reports
