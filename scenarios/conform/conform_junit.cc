// scenarios/conform/conform_junit.cc: conform's JUnit file, one testcase per (component, layer) of
// each comparison (docs/conform.md "Partial ports"), so that a CI dashboard shows what a port
// covers, what it fails and what it leaves out (skipped), component by component.
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "reference/model/hooks.h"
#include "reports/report.h"
#include "scenarios/conform/cache_layouts.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_internal.h"
#include "scenarios/conform/port_dump.h"

namespace dsv41::scenarios::conform {
namespace {

using reports::JunitCase;
using reports::Verdict;

struct Item {
  int64_t checked = 0, measured = 0, failed = 0;
  const reports::MetricRow* first_fail = nullptr;
  std::vector<std::string> fail_notes;  // the comparison's FAIL lines of this item
  bool by_value = false;                // a cache of another entry format, judged by value
};

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

std::vector<std::string> parse_require(const std::string& list) {
  std::vector<std::string> out;
  std::string known;
  for (const auto& row : reference::model::component_table()) known += (known.empty() ? "" : ", ") + std::string(row.name);
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');) {
    if (part.empty()) continue;
    DSV41_CHECK(reference::model::component_from_name(part).has_value(), "--require '", list, "': '", part,
                "' is not a component (one of: ", known, ")");
    out.push_back(part);
  }
  DSV41_CHECK(!out.empty(), "--require '", list, "': no component named");
  return out;
}

std::vector<reports::JunitSuite> conform_junit_suites(const reports::RunReport& report, const PortDump& d,
                                                      const std::vector<std::string>& require) {
  std::vector<reports::JunitSuite> suites;
  const std::set<std::string> required(require.begin(), require.end());
  for (const reports::ScenarioResult& s : report.scenarios) {
    for (const reports::Comparison& c : s.comparisons) {
      reports::JunitSuite suite;
      suite.name = "dsv41.conform." + s.name + " [" + c.mode + "]";
      suite.properties = {{"verdict", reports::name(c.verdict)}, {"claim", d.claim}, {"expectation", c.expectation},
                          {"require", [&] {
                             std::string r;
                             for (const std::string& x : require) r += (r.empty() ? "" : ",") + x;
                             return r.empty() ? std::string("(default: logits and a per-layer component)") : r;
                           }()}};
      const std::string cls = "dsv41.conform." + s.name + "." + c.mode;
      // Every (component, layer) the dump holds, and every one a row judged (caches included).
      std::map<std::pair<std::string, int>, Item> items;
      for (const auto& [comp, layers] : d.components) {
        for (int l : layers) items[{comp, l}];
      }
      for (const reports::MetricRow& r : c.rows) {
        Item& it = items[{r.component, r.layer}];
        if (!r.tolerance) ++it.measured;
        else ++it.checked;
        if (r.verdict == Verdict::kFail && it.failed++ == 0) it.first_fail = &r;
        if (r.metric == kDecodedRoundingRatioMetric) it.by_value = true;
      }
      for (const std::string& n : c.notes) {  // "FAIL step S <layer word> <component>: ..."
        if (n.rfind("FAIL step ", 0) != 0) continue;
        const size_t after_step = n.find(' ', 10);
        if (after_step == std::string::npos) continue;
        const std::string rest = n.substr(after_step + 1);
        for (auto& [key, it] : items) {
          if (it.failed > 0 && rest.rfind(conform_detail::layer_word(key.second) + " " + key.first + ": ", 0) == 0) {
            it.fail_notes.push_back(n);
          }
        }
      }
      if (c.verdict == Verdict::kInconclusive || c.verdict == Verdict::kError) {
        std::string why;
        for (const std::string& n : c.notes) {
          if (n.find("too thin") != std::string::npos || n.find("inconclusive") != std::string::npos) why += (why.empty() ? "" : "; ") + n;
        }
        suite.cases.push_back({cls, "(coverage)", c.verdict == Verdict::kError ? JunitCase::Kind::kError : JunitCase::Kind::kInconclusive,
                               std::string(reports::name(c.verdict)) + ": " + (why.empty() ? "evidence missing" : why), "", 0});
      }
      for (const auto& [key, it] : items) {
        JunitCase k{cls, dump_key(key.second, key.first), JunitCase::Kind::kPass, "", "", 0};
        if (it.failed > 0) {
          const reports::MetricRow& r = *it.first_fail;
          k.kind = JunitCase::Kind::kFail;
          k.message = "step " + std::to_string(r.step) + ": " + r.metric + " = " + number(r.value) + " beyond " +
                      number(r.tolerance->bound) + " (" + r.tolerance->origin + "); " + std::to_string(it.failed) + " failing rows";
          for (const std::string& n : it.fail_notes) k.body += (k.body.empty() ? "" : "\n") + n;
        } else if (it.checked > 0) {
          k.body = std::to_string(it.checked) + " rows within their bounds" +
                   (it.measured > 0 ? ", " + std::to_string(it.measured) + " measured" : "");
        } else if (it.measured > 0) {
          k.body = "measured only: " + std::to_string(it.measured) + " rows recorded, nothing asserted in this mode";
        } else {
          k.kind = JunitCase::Kind::kSkipped;
          k.message = "held by the dump, but no row of it is compared in the " + c.mode + " comparison";
        }
        if (it.by_value) {  // docs/port-dump.md "Cache layouts"
          (k.kind == JunitCase::Kind::kFail ? k.message : k.body).insert(0, "format differs: judged by values; ");
        }
        suite.cases.push_back(std::move(k));
      }
      for (const std::string& comp : d.not_covered) {  // table components the dump does not hold
        JunitCase k{cls, comp, JunitCase::Kind::kSkipped, "not covered: the dump does not hold " + comp, "", 0};
        if (required.count(comp)) {
          k.kind = JunitCase::Kind::kInconclusive;
          k.message = "required (--require) but not covered: the dump does not hold " + comp;
        }
        suite.cases.push_back(std::move(k));
      }
      suites.push_back(std::move(suite));
    }
  }
  return suites;
}

void write_conform_junit(const std::string& path, const reports::RunReport& report, const PortDump& d,
                         const std::vector<std::string>& require) {
  reports::write_junit_suites(path, conform_junit_suites(report, d, require));
}

}  // namespace dsv41::scenarios::conform
