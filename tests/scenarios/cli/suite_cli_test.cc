// The built-in suite as the README's first command runs it: `dsv41 run` with no scenario passes
// on the tiny config, prints a summary naming every scenario, writes a report that passes the
// schema check and JUnit with one testsuite per scenario; the report reads with h5py + pandas.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_cli.h"

namespace dsv41::test {
namespace {

TEST(SuiteCli, BuiltinSuitePassesWithAValidReport) {
  const std::string out = scratch() + "/suite.h5", junit = scratch() + "/suite.xml";
  const CliResult r = run_dsv41("run -o '" + out + "' --junit '" + junit + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const CliResult list = run_dsv41("run --list");
  ASSERT_EQ(list.code, 0);
  int scenarios = 0;
  for (const char* n : {"cold_prefill", "full_cache_hit", "global_only_short", "global_only_hit", "decoder_replay",
                        "repeated_resumptions", "follow_up_turns", "boundary_facts", "long_retrieval",
                        "concurrent_sessions", "speculative_greedy", "speculative_resume", "speculative_rollback"}) {
    EXPECT_TRUE(has(r.out, std::string(n) + ": ")) << n << " missing from the summary";
    EXPECT_TRUE(has(read_bytes(junit), std::string("name=\"") + n + "\"")) << n << " missing from the JUnit";
    scenarios += has(list.out, std::string("  ") + n + " ");
  }
  EXPECT_EQ(scenarios, 13) << list.out;
  EXPECT_TRUE(has(r.out, " 0 fail")) << r.out;
  EXPECT_TRUE(has(r.out, " 0 inconclusive")) << r.out;
  EXPECT_TRUE(has(r.err, "[")) << "progress lines on stderr";
  const CliResult check = run_dsv41("report check '" + out + "'");
  EXPECT_EQ(check.code, 0) << check.out << check.err;
  const CliResult show = run_dsv41("report show '" + out + "'");
  EXPECT_EQ(show.code, 0);
  EXPECT_TRUE(has(show.out, "verdict measured")) << show.out;

  // The report as an engineer reads it: the summary table straight into pandas.
  const std::string py = "/usr/bin/python3";
  if (!std::filesystem::exists(py) ||
      std::system((py + " -c 'import h5py, pandas' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "python3 with h5py and pandas not installed (scripts/setup.sh installs them)";
  }
  const std::string script = scratch() + "/read.py";
  {
    std::ofstream f(script);
    f << "import sys, h5py, pandas as pd\n"
         "f = h5py.File(sys.argv[1], 'r')\n"
         "s = pd.DataFrame(f['summary'][()])\n"
         "names = set(x.decode() if isinstance(x, bytes) else x for x in s['scenario'])\n"
         "assert len(names) == 13, names\n"
         "assert len(s) > 100, len(s)\n"
         "fails = s[s['verdict'].astype(str).str.contains('fail')]\n"
         "assert len(fails) == 0, fails\n"
         "print('rows', len(s), 'scenarios', len(names))\n";
  }
  const std::string cmd = py + " '" + script + "' '" + out + "' > '" + scratch() + "/py.txt' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_bytes(scratch() + "/py.txt");
  EXPECT_TRUE(has(read_bytes(scratch() + "/py.txt"), "scenarios 13"));
}

}  // namespace
}  // namespace dsv41::test
