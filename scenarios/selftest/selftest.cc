// scenarios/selftest/selftest.cc: `dsv41 selftest`'s runs and table (scenarios/selftest/selftest.h).
#include "scenarios/selftest/selftest.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>
#include <unistd.h>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"

namespace dsv41::scenarios::selftest {
namespace {

namespace fs = std::filesystem;


std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

}  // namespace

SelftestResult run_selftest(const SelftestOptions& o, std::ostream& progress) {
  const SelftestModel m = load_selftest_model(o.config, o.weights);
  const reference::ModelConfig& c = m.config;
  const reference::checkpoint::ModelWeights& weights = m.weights;
  const std::string& weights_path = m.weights_path;
  const std::vector<int64_t> token_map = reference::model::default_token_map(c);

  std::vector<const ZooBug*> bugs;
  if (!o.bugs.empty()) {
    for (const std::string& n : o.bugs) bugs.push_back(&zoo_bug(n));
  } else {
    for (const ZooBug& b : bug_zoo()) {
      if (!o.ci || b.ci) bugs.push_back(&b);
    }
  }
  const std::string root = o.dir.empty() ? (fs::temp_directory_path() / ("dsv41_selftest_" + std::to_string(::getpid()))).string()
                                         : o.dir;
  fs::create_directories(root);
  const std::string clean_dir = root + "/clean";

  SelftestResult result;
  auto run_one = [&](const ZooBug* bug) {
    SelftestRow row;
    row.bug = bug ? bug->name : "clean";
    row.kind = bug ? name(bug->kind) : "-";
    row.expected = bug ? zoo_location(bug->expected_component, bug->expected_layer, bug->expected_step) : "no alarm";
    const std::string dir = bug ? root + "/" + bug->name : clean_dir;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      fs::remove_all(dir);
      write_zoo_dump(dir, c, weights_path, weights, bug);
      row.fired = bug ? dumps_differ(clean_dir, dir) : false;
      conform::ConformOptions co;
      co.name = row.bug;
      co.order_variant = o.order_variant;
      const reports::RunReport report = conform::conform(conform::read_port_dump(dir), weights, token_map, co);
      row.conform_exit = conform::conform_exit_code(report);
      row.flagged = row.conform_exit == 1;
      if (const std::optional<conform::RootCause> rc = conform::root_cause(report)) {
        row.component = rc->component;
        row.layer = rc->layer;
        row.step = rc->step;
        row.detail = rc->detail;
      }
      if (!bug) {
        row.verdict = row.conform_exit == 0 ? "ok" : "ALARM";
      } else if (!row.flagged) {
        row.verdict = row.fired ? "MISSED" : "NOT-FIRED";
      } else {
        row.verdict = row.component == bug->expected_component && row.layer == bug->expected_layer &&
                              row.step == bug->expected_step
                          ? "ok"
                          : "MISLOCATED";
      }
    } catch (const std::exception& e) {
      row.verdict = "ERROR";
      row.detail = e.what();
      result.error = true;
    }
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (bug && !o.keep) fs::remove_all(dir);
    if (o.progress) {
      char line[512];
      std::snprintf(line, sizeof line, "selftest: %-32s %-10s %6.1f s  root cause %s\n", row.bug.c_str(),
                    row.verdict.c_str(), row.seconds,
                    row.component.empty() ? "-" : zoo_location(row.component, row.layer, row.step).c_str());
      progress << line << std::flush;
    }
    result.rows.push_back(std::move(row));
  };
  run_one(nullptr);  // the clean reference first: the bugs' "fired" compares against its dump
  for (const ZooBug* b : bugs) run_one(b);
  if (!o.keep) fs::remove_all(clean_dir);
  if (!o.keep && o.dir.empty()) fs::remove_all(root);
  return result;
}

std::string format_selftest_table(const SelftestResult& r) {
  std::ostringstream out;
  out << "| bug | kind | fired | flagged | located component | located layer | located step | expected | verdict "
         "| s |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const SelftestRow& row : r.rows) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", row.seconds);
    out << "| " << row.bug << " | " << row.kind << " | " << (row.bug == "clean" ? "-" : row.fired ? "yes" : "no")
        << " | " << (row.flagged ? "yes" : "no") << " (exit " << row.conform_exit << ") | "
        << (row.component.empty() ? "-" : row.component) << " | "
        << (row.component.empty() ? "-" : std::to_string(row.layer)) << " | "
        << (row.component.empty() ? "-" : std::to_string(row.step)) << " | " << row.expected << " | " << row.verdict
        << " | " << secs << " |\n";
  }
  return out.str();
}

void write_selftest_junit(const SelftestResult& r, const std::string& path) {
  int failures = 0;
  for (const SelftestRow& row : r.rows) failures += row.verdict != "ok";
  std::ostringstream f;
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"dsv41 selftest\" tests=\"" << r.rows.size()
    << "\" failures=\"" << failures << "\">\n";
  for (const SelftestRow& row : r.rows) {
    f << "  <testcase classname=\"selftest\" name=\"" << xml_escape(row.bug) << "\" time=\"" << row.seconds << "\">";
    if (row.verdict != "ok") {
      f << "<failure message=\"" << xml_escape(row.verdict + ": expected " + row.expected + ", located " +
                                               (row.component.empty() ? "nothing" : zoo_location(row.component, row.layer, row.step)))
        << "\">" << xml_escape(row.detail) << "</failure>";
    }
    f << "</testcase>\n";
  }
  f << "</testsuite>\n";
  const std::string text = f.str();
  output::write_file_atomically(path, "JUnit file", text.data(), text.size());
}

int selftest_exit_code(const SelftestResult& r) {
  if (r.error) return 2;
  for (const SelftestRow& row : r.rows) {
    if (row.verdict != "ok") return 1;
  }
  return 0;
}

}  // namespace dsv41::scenarios::selftest
