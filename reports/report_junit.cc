// reports/report_junit.cc: write_junit, the report as JUnit XML for CI dashboards.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "base/output_file.h"
#include "reports/report.h"

namespace dsv41::reports {
namespace {

// XML-escapes text for an attribute value or element content; characters XML 1.0 cannot hold
// (control characters other than tab, newline, carriage return) become '?'.
std::string xml(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default: out += (u < 0x20 || u == 0x7f) ? '?' : ch;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string seconds(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string divergence_text(const Divergence& d) {
  std::string s = "first divergence: step " + std::to_string(d.step);
  if (d.layer >= 0) s += " layer " + std::to_string(d.layer);
  s += " component " + d.component + " " + d.metric + "=" + num(d.value) + (d.tolerance.higher_is_better ? " < " : " > ") +
       num(d.tolerance.bound) + " (" + d.tolerance.origin + ")";
  return s;
}

std::string joined_notes(const Comparison& c) {
  std::string s;
  for (const std::string& n : c.notes) s += (s.empty() ? "" : "; ") + n;
  return s;
}

struct Counts {
  size_t tests = 0, failures = 0, errors = 0;
  double time = 0;
};

// One <testcase>; updates the counts.
void testcase(std::ostream& out, const ScenarioResult& s, const Comparison& c, Counts& n) {
  ++n.tests;
  n.time += c.seconds;
  out << "    <testcase classname=\"dsv41." << xml(s.name) << "\" name=\""
      << xml(c.side_a + " vs " + c.side_b + " [" + c.mode + "]") << "\" time=\"" << seconds(c.seconds) << "\">\n";
  const std::string notes = joined_notes(c);
  switch (c.verdict) {
    case Verdict::kFail: {
      ++n.failures;
      const std::string msg = c.first_divergence ? divergence_text(*c.first_divergence) : "fail: " + notes;
      std::string body = msg;
      if (c.first_divergence && !c.first_divergence->detail.empty()) body += "\n" + c.first_divergence->detail;
      if (c.first_divergence && !c.first_divergence->rerun.empty()) body += "\nrerun: " + c.first_divergence->rerun;
      if (!notes.empty()) body += "\nnotes: " + notes;
      out << "      <failure type=\"fail\" message=\"" << xml(msg) << "\">" << xml(body) << "</failure>\n";
      break;
    }
    case Verdict::kInconclusive: {
      ++n.failures;
      const std::string msg = "inconclusive: " + (notes.empty() ? std::string("evidence missing") : notes);
      out << "      <failure type=\"inconclusive\" message=\"" << xml(msg) << "\">" << xml(msg) << "</failure>\n";
      break;
    }
    case Verdict::kError: {
      ++n.errors;
      const std::string msg = "error: " + (notes.empty() ? s.error : notes);
      out << "      <error type=\"error\" message=\"" << xml(msg) << "\">" << xml(msg) << "</error>\n";
      break;
    }
    case Verdict::kMeasured:
      out << "      <system-out>" << xml("measured: " + std::to_string(c.rows.size()) +
                                         " metric rows recorded, nothing asserted" + (notes.empty() ? "" : "; " + notes))
          << "</system-out>\n";
      break;
    case Verdict::kPass: break;
  }
  out << "    </testcase>\n";
}

}  // namespace

void write_junit(const std::string& path, const RunReport& report) {
  std::ostringstream suites;
  Counts total;
  for (const ScenarioResult& s : report.scenarios) {
    std::ostringstream cases;
    Counts n;
    for (const Comparison& c : s.comparisons) testcase(cases, s, c, n);
    if (s.verdict == Verdict::kError) {  // the scenario itself did not complete
      ++n.tests;
      ++n.errors;
      const std::string msg = "error: " + (s.error.empty() ? std::string("the scenario did not complete") : s.error);
      cases << "    <testcase classname=\"dsv41." << xml(s.name) << "\" name=\"(scenario)\" time=\"0.000\">\n"
            << "      <error type=\"error\" message=\"" << xml(msg) << "\">" << xml(msg) << "</error>\n"
            << "    </testcase>\n";
    } else if (s.comparisons.empty()) {  // nothing compared: missing evidence
      ++n.tests;
      ++n.failures;
      cases << "    <testcase classname=\"dsv41." << xml(s.name) << "\" name=\"(scenario)\" time=\"0.000\">\n"
            << "      <failure type=\"inconclusive\" message=\"inconclusive: no comparison\">"
            << "inconclusive: no comparison</failure>\n"
            << "    </testcase>\n";
    }
    suites << "  <testsuite name=\"" << xml(s.name) << "\" tests=\"" << n.tests << "\" failures=\"" << n.failures
           << "\" errors=\"" << n.errors << "\" skipped=\"0\" time=\"" << seconds(n.time) << "\">\n"
           << "    <properties>\n"
           << "      <property name=\"kind\" value=\"" << xml(s.kind) << "\"/>\n"
           << "      <property name=\"seed\" value=\"" << s.seed << "\"/>\n"
           << "      <property name=\"verdict\" value=\"" << name(s.verdict) << "\"/>\n"
           << "    </properties>\n"
           << cases.str() << "  </testsuite>\n";
    total.tests += n.tests;
    total.failures += n.failures;
    total.errors += n.errors;
    total.time += n.time;
  }
  std::ostringstream doc;
  doc << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites name=\"dsv41\" tests=\"" << total.tests << "\" failures=\"" << total.failures << "\" errors=\""
      << total.errors << "\" skipped=\"0\" time=\"" << seconds(total.time) << "\">\n"
      << suites.str() << "</testsuites>\n";

  // Atomic, never over anything but a regular file (base/output_file.h).
  const std::string text = doc.str();
  output::write_file_atomically(path, "JUnit file", text.data(), text.size());
}

void write_junit_suites(const std::string& path, const std::vector<JunitSuite>& suites) {
  std::ostringstream body;
  Counts total;
  size_t total_skipped = 0;
  for (const JunitSuite& suite : suites) {
    std::ostringstream cases;
    Counts n;
    size_t skipped = 0;
    for (const JunitCase& c : suite.cases) {
      ++n.tests;
      n.time += c.seconds;
      cases << "    <testcase classname=\"" << xml(c.classname) << "\" name=\"" << xml(c.name) << "\" time=\""
            << seconds(c.seconds) << "\">\n";
      switch (c.kind) {
        case JunitCase::Kind::kPass:
          if (!c.body.empty()) cases << "      <system-out>" << xml(c.body) << "</system-out>\n";
          break;
        case JunitCase::Kind::kSkipped:
          ++skipped;
          cases << "      <skipped message=\"" << xml(c.message) << "\"/>\n";
          break;
        case JunitCase::Kind::kFail:
        case JunitCase::Kind::kInconclusive:
          ++n.failures;
          cases << "      <failure type=\"" << (c.kind == JunitCase::Kind::kFail ? "fail" : "inconclusive") << "\" message=\""
                << xml(c.message) << "\">" << xml(c.body.empty() ? c.message : c.message + "\n" + c.body) << "</failure>\n";
          break;
        case JunitCase::Kind::kError:
          ++n.errors;
          cases << "      <error type=\"error\" message=\"" << xml(c.message) << "\">"
                << xml(c.body.empty() ? c.message : c.message + "\n" + c.body) << "</error>\n";
          break;
      }
      cases << "    </testcase>\n";
    }
    body << "  <testsuite name=\"" << xml(suite.name) << "\" tests=\"" << n.tests << "\" failures=\"" << n.failures
         << "\" errors=\"" << n.errors << "\" skipped=\"" << skipped << "\" time=\"" << seconds(n.time) << "\">\n";
    if (!suite.properties.empty()) {
      body << "    <properties>\n";
      for (const auto& [k, v] : suite.properties) body << "      <property name=\"" << xml(k) << "\" value=\"" << xml(v) << "\"/>\n";
      body << "    </properties>\n";
    }
    body << cases.str() << "  </testsuite>\n";
    total.tests += n.tests;
    total.failures += n.failures;
    total.errors += n.errors;
    total.time += n.time;
    total_skipped += skipped;
  }
  std::ostringstream doc;
  doc << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites name=\"dsv41\" tests=\"" << total.tests << "\" failures=\"" << total.failures << "\" errors=\""
      << total.errors << "\" skipped=\"" << total_skipped << "\" time=\"" << seconds(total.time) << "\">\n"
      << body.str() << "</testsuites>\n";
  const std::string text = doc.str();
  output::write_file_atomically(path, "JUnit file", text.data(), text.size());
}

}  // namespace dsv41::reports
