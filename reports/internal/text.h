// reports/internal/text.h: the number format and the verdict order the report printers share
// (report_show.cc, report_diff.cc, report_profile.cc).
#pragma once

#include <cstdio>
#include <string>

#include "reports/report.h"

namespace dsv41::reports::text {

// `v` with `digits` significant digits (%g).
inline std::string num(double v, int digits = 6) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// Display order, worst first: error 0, fail 1, inconclusive 2, measured 3, pass 4.
inline int rank(Verdict v) { return severity(Verdict::kError) - severity(v); }

}  // namespace dsv41::reports::text
