// Output paths end to end (docs/cli.md "Output files"; issue 14): `forward -o`, `--save-state`,
// `run -o` and `report junit -o` pointing at a FIFO, a directory or a symlink. Non-regular nodes
// are refused with exit 2 and left as they were; a symlink stays a link while its target gets the
// output; a bad output path (or a scenario name the report cannot hold) fails before any model
// work: the verb's progress lines never appear.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_cli.h"
#include "tests/support/small_scenario.h"

namespace dsv41::test {
namespace {

namespace fs = std::filesystem;
const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";

std::string forward(const std::string& extra) {
  return "forward --config '" + kOracle + "config.json' --weights '" + kOracle +
         "weights.safetensors' --prompt 1,2,3,4,5,6,7,8 --decode 9,10 --threads 1 " + extra;
}

bool is_fifo(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

bool opens_as_hdf5(const std::string& p) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return false;
  H5Fclose(f);
  return true;
}

std::string fifo(const std::string& name) {
  const std::string p = scratch() + "/" + name;
  fs::remove(p);
  EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0);
  return p;
}

TEST(OutputPathsCli, ForwardRefusesAFifoAndLeavesIt) {
  const std::string out = fifo("out.h5"), state = fifo("state.dsv41s");
  CliResult r = run_dsv41(forward("-o '" + out + "'"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'" + out + "': it is a FIFO")) << r.err;
  EXPECT_FALSE(has(r.err, "dsv41 forward: prefill")) << "refused only after the forward:\n" << r.err;
  r = run_dsv41(forward("-o '" + scratch() + "/ok.h5' --save-state '" + state + "'"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "session file (--save-state) '" + state + "': it is a FIFO")) << r.err;
  EXPECT_TRUE(is_fifo(out));
  EXPECT_TRUE(is_fifo(state));
  EXPECT_FALSE(fs::exists(scratch() + "/ok.h5"));
}

TEST(OutputPathsCli, ForwardRefusesADirectory) {
  fs::create_directories(scratch() + "/d.h5");
  const CliResult r = run_dsv41(forward("-o '" + scratch() + "/d.h5'"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "it is a directory")) << r.err;
  EXPECT_TRUE(fs::is_directory(scratch() + "/d.h5"));
}

TEST(OutputPathsCli, ForwardThroughASymlinkKeepsTheLink) {
  const std::string target = scratch() + "/target.h5", link = scratch() + "/link.h5";
  std::ofstream(target) << "old";
  fs::remove(link);
  fs::create_symlink("target.h5", link);
  const CliResult r = run_dsv41(forward("-o '" + link + "'"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), "target.h5");
  EXPECT_TRUE(opens_as_hdf5(target)) << "the link's target holds the output";
  // A link to a FIFO: refused, both left alone.
  const std::string pipe = fifo("pipe"), to_pipe = scratch() + "/to_pipe.h5";
  fs::remove(to_pipe);
  fs::create_symlink("pipe", to_pipe);
  const CliResult bad = run_dsv41(forward("-o '" + to_pipe + "'"));
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "which is a FIFO")) << bad.err;
  EXPECT_TRUE(fs::is_symlink(to_pipe));
  EXPECT_TRUE(is_fifo(pipe));
}

// /dev/null: CI runs as root, where the old rename replaced it. Only a run that cannot replace
// it is made: forward is refused before it creates anything, and /dev/null is checked after.
TEST(OutputPathsCli, ForwardRefusesDevNullAndItStaysADevice) {
  struct stat st {};
  if (::stat("/dev/null", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no character device /dev/null";
  if (::access("/dev", W_OK) == 0) {
    // Writable /dev (root): only run when the refusal is certain, i.e. the utility is linked in
    // this build's dsv41 (its message is the proof); the run writes nothing then.
    const CliResult probe = run_dsv41(forward("-o '" + fifo("probe") + "'"));
    if (!has(probe.err, "it is a FIFO")) GTEST_SKIP() << "this dsv41 does not refuse FIFOs; not risking /dev/null";
  }
  const CliResult r = run_dsv41(forward("-o /dev/null"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'/dev/null': it is a character device")) << r.err;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

const std::string kSmall = small_scenario_json(
    R"("pairs": [{"a": "ref@cold", "b": "ref@full", "expect": "bitexact", "why": "docs/sessions.md"}],
  "modes": ["free-running"])");

std::string scenario_file(const std::string& name, const std::string& json) {
  const std::string p = scratch() + "/" + name;
  std::ofstream(p) << json;
  return p;
}

TEST(OutputPathsCli, RunChecksItsOutputsBeforeTheRun) {
  const std::string s = scenario_file("small.json", kSmall);
  fs::create_directories(scratch() + "/dir.h5");
  CliResult r = run_dsv41("run '" + s + "' -o '" + scratch() + "/dir.h5'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "report (-o) '" + scratch() + "/dir.h5': it is a directory")) << r.err;
  EXPECT_FALSE(has(r.err, "dsv41 run: scenario")) << "refused only after the run:\n" << r.err;
  const std::string junit = fifo("junit.xml");
  r = run_dsv41("run '" + s + "' -o '" + scratch() + "/r.h5' --junit '" + junit + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "JUnit file (--junit) '" + junit + "': it is a FIFO")) << r.err;
  EXPECT_FALSE(has(r.err, "dsv41 run: scenario")) << r.err;
  EXPECT_TRUE(is_fifo(junit));
  // A scenario named "..": the report cannot hold it, so the run does not start.
  std::string dots = kSmall;
  dots.replace(dots.find("\"small\""), 7, "\"..\"");
  r = run_dsv41("run '" + scenario_file("dots.json", dots) + "' -o '" + scratch() + "/r.h5'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "scenario name '..' is not a valid HDF5 group name")) << r.err;
  EXPECT_FALSE(has(r.err, "dsv41 run: scenario")) << r.err;
}

TEST(OutputPathsCli, ReportJunitRefusesAFifo) {
  const std::string s = scenario_file("small.json", kSmall), report = scratch() + "/r.h5";
  ASSERT_EQ(run_dsv41("run '" + s + "' -q -o '" + report + "'").code, 0);
  const std::string out = fifo("out.xml");
  const CliResult r = run_dsv41("report junit '" + report + "' -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'" + out + "': it is a FIFO")) << r.err;
  EXPECT_TRUE(is_fifo(out));
}

}  // namespace
}  // namespace dsv41::test
