// Under load (issue 14, deliverable 6; docs/cli.md "Output files"): 16 `dsv41 forward` processes
// at once, all resuming from one session file and all writing into one directory: 8 write their
// own session file and forward output, 8 more write the same session path. All succeed, the
// shared session file is untouched, every output is complete and equal to a lone run's, and no
// temp file is left.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <string>
#include <vector>

#include "golden/golden_io.h"
#include "tests/support/run_cli.h"
#include "tests/support/spawn.h"

namespace dsv41::test {
namespace {

namespace fs = std::filesystem;
const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
constexpr int kProcesses = 8;

std::vector<std::string> forward(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"forward", "--config", kOracle + "config.json", "--weights",
                                kOracle + "weights.safetensors", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(OutputConcurrency, ResumersSharingASessionAndADirectoryDoNotCorruptEachOther) {
  const std::string dir = scratch() + "/out", shared = scratch() + "/shared.dsv41s";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(wait_dsv41(spawn_dsv41(forward({"--prompt", "1,2,3,4,5,6,7,8,9,10,11,12", "--save-state", shared, "-o",
                                            scratch() + "/first.h5"}))),
            0);
  const std::string shared_bytes = read_bytes(shared);
  const auto resume = [&](const std::string& state, const std::string& out) {
    return forward({"--resume", shared, "--prompt", "13,14,15,16", "--decode", "17,18,19", "--save-state", state,
                    "-o", out});
  };
  // A lone run: the expected bytes.
  ASSERT_EQ(wait_dsv41(spawn_dsv41(resume(scratch() + "/alone.dsv41s", scratch() + "/alone.h5"))), 0);
  const std::string want_state = read_bytes(scratch() + "/alone.dsv41s");
  const golden::Array<float> want_logits = golden::H5File(scratch() + "/alone.h5").read<float>("logits", 2);

  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    const std::string n = std::to_string(i);
    pids.push_back(spawn_dsv41(resume(dir + "/s" + n + ".dsv41s", dir + "/f" + n + ".h5"), dir + "/log" + n));
    pids.push_back(spawn_dsv41(resume(dir + "/same.dsv41s", dir + "/g" + n + ".h5"), dir + "/logg" + n));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_EQ(wait_dsv41(pids[i]), 0) << "process " << i << ": "
                                       << read_bytes(dir + (i % 2 ? "/logg" : "/log") + std::to_string(i / 2));
  }
  EXPECT_EQ(read_bytes(shared), shared_bytes) << "the session every process read changed";
  EXPECT_EQ(read_bytes(dir + "/same.dsv41s"), want_state);
  for (int i = 0; i < kProcesses; ++i) {
    const std::string n = std::to_string(i);
    EXPECT_EQ(read_bytes(dir + "/s" + n + ".dsv41s"), want_state) << "s" << n;
    for (const std::string& out : {dir + "/f" + n + ".h5", dir + "/g" + n + ".h5"}) {
      const golden::Array<float> logits = golden::H5File(out).read<float>("logits", 2);
      EXPECT_EQ(logits.shape, want_logits.shape) << out;
      EXPECT_EQ(logits.data, want_logits.data) << out;
    }
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
}

}  // namespace
}  // namespace dsv41::test
