// `dsv41 report show|check|junit`: reads an HDF5 divergence report (docs/report-schema.md).
//   show FILE [--rows N]     the summary (reports::format_summary); 0 when the file was read,
//                            whatever its verdict; 2 when it is unreadable or not a report
//   check FILE               the schema check; "report check: FILE: valid (schema 1)" and 0, or one
//                            line per problem and 1; 2 when it is not readable HDF5
//   junit FILE -o OUT.xml    JUnit XML from the report (reports::write_junit); 0, or 2
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "formats/output_file.h"
#include "reports/report.h"
#include "scenarios/cli.h"

namespace dsv41::scenarios {
namespace {

struct ReportOptions {
  std::string file;
  int rows = 20;
  std::string junit_out;
};

}  // namespace

Verb add_report_verb(CLI::App& parent) {
  auto opts = std::make_shared<ReportOptions>();
  CLI::App* app = parent.add_subcommand("report", "read an HDF5 divergence report: show, check, junit");
  app->require_subcommand(1);
  CLI::App* show = app->add_subcommand("show", "print the summary: comparisons worst first, worst metrics, reruns");
  show->add_option("file", opts->file, "report (HDF5)")->required();
  show->add_option("--rows", opts->rows, "how many of the worst checked metrics to list (default 20)")
      ->check(CLI::Range(0, 1000000));
  CLI::App* check = app->add_subcommand("check", "check the file against the report schema (docs/report-schema.md)");
  check->add_option("file", opts->file, "report (HDF5)")->required();
  CLI::App* junit = app->add_subcommand("junit", "write JUnit XML for CI from a report");
  junit->add_option("file", opts->file, "report (HDF5)")->required();
  junit->add_option("-o,--output", opts->junit_out, "JUnit XML file, written atomically")->required();

  return {app, [opts, show, check] {
            if (show->parsed()) {
              std::cout << reports::format_summary(reports::read_report(opts->file), opts->rows);
              return kExitOk;
            }
            if (check->parsed()) {
              const std::vector<std::string> problems = reports::check_report_schema(opts->file);
              if (problems.empty()) {
                std::cout << "report check: " << opts->file << ": valid (schema 1)\n";
                return kExitOk;
              }
              for (const std::string& p : problems) std::cout << "report check: " << opts->file << ": " << p << "\n";
              std::cout << "report check: " << opts->file << ": " << problems.size() << " problem"
                        << (problems.size() == 1 ? "" : "s") << "\n";
              return kExitCheckFailed;
            }
            output::check_output_path(opts->junit_out, "JUnit file (-o)");  // before reading the report
            reports::write_junit(opts->junit_out, reports::read_report(opts->file));
            std::cout << "report junit: wrote " << opts->junit_out << "\n";
            return kExitOk;
          }};
}

}  // namespace dsv41::scenarios
