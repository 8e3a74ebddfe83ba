#include "scenarios/runner/run_meta.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <string>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/numerics.h"
#include "reports/report.h"

namespace dsv41::scenarios::runner {

void check_report_outputs(const std::string& output, const std::string& junit, output::VerbFiles inputs) {
  const std::string report = output::check_output_path(output, "report (-o)");
  if (!junit.empty()) {
    const std::string xml = output::check_output_path(junit, "JUnit file (--junit)");
    if (std::filesystem::weakly_canonical(report) == std::filesystem::weakly_canonical(xml)) {
      DSV41_FAIL("--junit '", junit, "': the same file as the report (-o '", output, "')");
    }
  }
  inputs.output(output, "report (-o)").output(junit, "JUnit file (--junit)");
  inputs.check();  // outputs never alias the verb's inputs
}

void stamp_run_meta(reports::RunMeta& meta, const std::string& command_line) {
  meta.tool_version = DSV41_VERSION_STRING;
  meta.git_commit = DSV41_GIT_COMMIT_STRING;
  meta.command_line = command_line;
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  meta.created_utc = buf;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  meta.host = host;
  meta.threads = reference::reference_threads();
}

}  // namespace dsv41::scenarios::runner
