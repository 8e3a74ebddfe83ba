// The format self-check in process: every check passes, and an injected failure gives exit 1.
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

int count_lines_starting(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}

TEST(SelfcheckInProcess, AllChecksPass) {
  std::ostringstream out;
  EXPECT_EQ(run_selfcheck(out), runner::kExitOk) << out.str();
  const int passed = count_lines_starting(out.str(), "ok    ");
  EXPECT_GE(passed, 12) << out.str();
  EXPECT_EQ(count_lines_starting(out.str(), "FAIL  "), 0) << out.str();
  EXPECT_NE(out.str().find("selfcheck: " + std::to_string(passed) + " passed, 0 failed\n"),
            std::string::npos)
      << out.str();
}

TEST(SelfcheckInProcess, InjectedFailureIsCounted) {
  std::ostringstream out;
  EXPECT_EQ(run_selfcheck(out, /*inject_failure=*/true), runner::kExitCheckFailed);
  EXPECT_EQ(count_lines_starting(out.str(), "FAIL  injected failure"), 1) << out.str();
  EXPECT_NE(out.str().find(", 1 failed\n"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace dsv41::scenarios::cli
