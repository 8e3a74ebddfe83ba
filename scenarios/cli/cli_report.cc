// `dsv41 report show|check|junit|html|diff`: reads HDF5 divergence reports (docs/report-schema.md).
//   show FILE [--rows N] [--scenario S] [--pair A,B] [--mode M] [--verdict V,...] [--by layer|step] [-q]
//                            the summary (reports::format_summary), lines of at most 120 columns;
//                            0 when the file was read, whatever its verdict; 2 when it is unreadable,
//                            not a report, or a filter names what the report lacks
//   check FILE               the schema check; "report check: FILE: valid (schema 1)" and 0, or one
//                            line per problem and 1; 2 when it is not readable HDF5
//   junit FILE -o OUT.xml    JUnit XML from the report (reports::write_junit); 0, or 2
//   html FILE -o OUT.html    one self-contained HTML page with plots (docs/report-html.md); 0, or 2
//   diff A B [--rows N]      what got better, worse, new failures first (reports::diff_reports);
//                            1 when a checked item regressed, 0 when none did, 2 on bad input
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/terminal_text.h"
#include "base/output_file.h"
#include "reports/report.h"
#include "reports/report_diff.h"
#include "reports/report_html.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

struct ReportOptions {
  std::string file, file_b;
  int rows = 20;
  std::string output;
  std::string scenario, pair, mode, verdicts, by;
  bool quiet = false;
};

std::vector<reports::Verdict> parse_verdicts(const std::string& list) {
  std::vector<reports::Verdict> out;
  std::stringstream in(list);
  std::string v;
  while (std::getline(in, v, ',')) {
    if (v.empty()) continue;
    try {
      out.push_back(reports::parse_verdict(v));
    } catch (const Error&) {
      DSV41_FAIL("report show --verdict: '", v, "' is not a verdict (error, fail, inconclusive, measured, pass)");
    }
  }
  return out;
}

}  // namespace

Verb add_report_verb(CLI::App& parent) {
  auto opts = std::make_shared<ReportOptions>();
  CLI::App* app = parent.add_subcommand("report", "read HDF5 divergence reports: show, check, junit, html, diff");
  app->require_subcommand(1);
  CLI::App* show = app->add_subcommand("show", "print the summary: comparisons worst first, worst metrics, reruns");
  show->add_option("file", opts->file, "report (HDF5)")->required();
  show->add_option("--rows", opts->rows, "how many of the worst checked (and measured) metrics to list (default 20)")
      ->check(CLI::Range(0, 1000000));
  show->add_option("--scenario", opts->scenario, "only this scenario");
  show->add_option("--pair", opts->pair, "only the comparisons of these sides: A,B, or one side (either); "
                                         "a side matches with or without its @cache-path");
  show->add_option("--mode", opts->mode, "only this comparison mode")->check(CLI::IsMember({"free-running", "teacher-forced"}));
  show->add_option("--verdict", opts->verdicts, "only these verdicts, comma-separated (error, fail, inconclusive, measured, pass)");
  show->add_option("--by", opts->by, "a profile of each comparison shown, per layer or per step")
      ->check(CLI::IsMember({"layer", "step"}));
  show->add_flag("-q,--quiet", opts->quiet, "only the verdict line with the counts");
  CLI::App* check = app->add_subcommand("check", "check the file against the report schema (docs/report-schema.md)");
  check->add_option("file", opts->file, "report (HDF5)")->required();
  CLI::App* junit = app->add_subcommand("junit", "write JUnit XML for CI from a report");
  junit->add_option("file", opts->file, "report (HDF5)")->required();
  junit->add_option("-o,--output", opts->output, "JUnit XML file, written atomically")->required();
  CLI::App* html = app->add_subcommand("html", "write the report as one self-contained HTML page with plots "
                                               "(opens offline; docs/report-html.md)");
  html->add_option("file", opts->file, "report (HDF5)")->required();
  html->add_option("-o,--output", opts->output, "HTML file, written atomically")->required();
  CLI::App* diff = app->add_subcommand("diff", "compare two reports of the same scenarios: new failures first, "
                                               "worse, missing, better; exit 1 when a checked item regressed");
  diff->add_option("a", opts->file, "the earlier report (HDF5)")->required();
  diff->add_option("b", opts->file_b, "the later report (HDF5)")->required();
  diff->add_option("--rows", opts->rows, "lines per section (default 20)")->check(CLI::Range(0, 1000000));

  return {app, [opts, show, check, html, diff] {
            if (show->parsed()) {
              reports::SummaryOptions o;
              o.max_rows = opts->rows;
              o.filter.scenario = opts->scenario;
              o.filter.pair = opts->pair;
              o.filter.mode = opts->mode;
              o.filter.verdicts = parse_verdicts(opts->verdicts);
              o.by = opts->by;
              o.quiet = opts->quiet;
              std::cout << reports::format_summary(reports::read_report(opts->file), o);
              return runner::kExitOk;
            }
            if (check->parsed()) {
              const std::vector<std::string> problems = reports::check_report_schema(opts->file);
              if (problems.empty()) {
                std::cout << "report check: " << opts->file << ": valid (schema 1)\n";
                return runner::kExitOk;
              }
              for (const std::string& p : problems) {
                std::cout << terminal_safe("report check: " + opts->file + ": " + p) << "\n";
              }
              std::cout << "report check: " << opts->file << ": " << problems.size() << " problem"
                        << (problems.size() == 1 ? "" : "s") << "\n";
              return runner::kExitCheckFailed;
            }
            if (html->parsed()) {
              output::check_output_path(opts->output, "HTML report (-o)");  // before reading the report
              output::VerbFiles().input(opts->file, "report").output(opts->output, "HTML report (-o)").check();
              if (!reports::html_available()) reports::html_page({}, {});   // says which package is missing
              reports::write_html(opts->output, reports::read_report(opts->file, /*load_tensors=*/true), {opts->file});
              std::cout << "report html: wrote " << opts->output << "\n";
              return runner::kExitOk;
            }
            if (diff->parsed()) {
              const reports::RunReport a = reports::read_report(opts->file), b = reports::read_report(opts->file_b);
              reports::DiffOptions o;
              o.name_a = opts->file;
              o.name_b = opts->file_b;
              o.max_rows = opts->rows;
              const reports::ReportDiff d = reports::diff_reports(a, b, o);
              std::cout << terminal_safe(d.text);
              return d.regressed ? runner::kExitCheckFailed : runner::kExitOk;
            }
            output::check_output_path(opts->output, "JUnit file (-o)");  // before reading the report
            output::VerbFiles().input(opts->file, "report").output(opts->output, "JUnit file (-o)").check();
            reports::write_junit(opts->output, reports::read_report(opts->file));
            std::cout << "report junit: wrote " << opts->output << "\n";
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
