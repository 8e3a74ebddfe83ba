// Crash safety (issue 14, deliverable 5; docs/cli.md "Output files"): `dsv41` killed with SIGKILL
// at random points while it saves a session (forward --save-state), writes a report and JUnit
// file (run -o --junit) and writes a port dump (forward --dump, HDF5 and directory). After every
// kill: a file that existed before is byte-identical to before or replaced by a complete,
// readable one; a new file is absent or complete and readable. Temp files a kill leaves behind
// are removed by the next completed write of the same output.
//
// Kill delays: uniform over the run for half of the kills, over its second half (where the writes
// happen) for the other half; the run's length is measured first, and runs that finish before
// their kill are repeated until the kills are in. Seed: DSV41_SEED; SIGKILLs per kind: DSV41_KILLS
// (default 17: 51 kills, about 40 s on 2 cores).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "reports/report.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"
#include "tests/support/seed.h"
#include "tests/support/small_scenario.h"
#include "tests/support/spawn.h"

namespace dsv41::test {
namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;
const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";

int kills_per_kind() {
  const char* env = std::getenv("DSV41_KILLS");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 17;
}

Args forward(const std::string& prompt, const std::string& decode, const Args& extra) {
  Args a = {"forward", "--config", kOracle + "config.json", "--weights", kOracle + "weights.safetensors",
            "--prompt", prompt, "--decode", decode, "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string ids(int from, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ",";
    s += std::to_string(from + i);
  }
  return s;
}

// Seconds a complete run takes (and it must succeed).
double timed_run(const Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = wait_dsv41(spawn_dsv41(a, scratch() + "/log"));
  EXPECT_EQ(rc, 0) << read_bytes(scratch() + "/log");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool opens_as_hdf5(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return false;
  H5Fclose(f);
  return true;
}

std::vector<std::string> temps_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  }
  return out;
}

struct Killer {
  std::mt19937_64 rng;
  int kills = 0, finished = 0, temps_seen = 0;
  double scale = 1.0;  // shrinks when runs get faster than the timed one (the machine's load fell)

  // Starts `a`, kills it after a random delay (within a run of `seconds`), reaps it.
  void kill_during(const Args& a, double seconds, const std::string& dir) {
    const bool late = (rng() & 1) != 0;
    seconds *= scale;
    std::uniform_real_distribution<double> d(late ? 0.5 * seconds : 0.0, 0.95 * seconds);
    const double delay = d(rng);
    const pid_t pid = spawn_dsv41(a);
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ::kill(pid, SIGKILL);
    const int rc = wait_dsv41(pid);
    if (rc == 128 + SIGKILL) {
      ++kills;
    } else {
      ASSERT_EQ(rc, 0) << "a run that was not killed failed";
      ++finished;
      scale *= 0.75;
    }
    temps_seen += static_cast<int>(temps_in(dir).size());
  }
  // Another round?  Until kills_per_kind() SIGKILLs landed (at most 3x as many runs).
  bool more() const { return kills < kills_per_kind() && kills + finished < 3 * kills_per_kind(); }
  void print(const char* what) const {
    std::printf("[crash] %s: %d killed, %d finished before the kill, %d temp files seen after kills\n", what, kills,
                finished, temps_seen);
  }
};

Killer make_killer(const char* what) {
  const uint64_t seed = data_seed() ^ std::hash<std::string>{}(what);
  std::printf("[crash] %s: kill delays from seed %llu (DSV41_SEED), %d kills (DSV41_KILLS)\n", what,
              static_cast<unsigned long long>(seed), kills_per_kind());
  return Killer{std::mt19937_64(seed)};
}

TEST(CrashSafety, SessionSaveKilledLeavesTheOldOrTheNewFile) {
  const std::string dir = scratch(), state = dir + "/s.dsv41s", out = dir + "/f.h5";
  const Args write_new = forward(ids(1, 40), ids(41, 6), {"--save-state", state, "-o", out});
  // The new bytes (a session file is deterministic) and the old ones, both complete.
  const double seconds = timed_run(forward(ids(1, 40), ids(41, 6), {"--save-state", dir + "/new.dsv41s", "-o", out}));
  const std::string new_bytes = read_bytes(dir + "/new.dsv41s");
  ASSERT_EQ(timed_run(forward(ids(1, 8), ids(9, 2), {"--save-state", state, "-o", out})) > 0, true);
  const std::string old_bytes = read_bytes(state);
  ASSERT_NE(old_bytes, new_bytes);
  ASSERT_FALSE(new_bytes.empty());

  Killer k = make_killer("session save");
  for (int i = 0; k.more(); ++i) {
    k.kill_during(write_new, seconds, dir);
    const std::string now = read_bytes(state);
    ASSERT_TRUE(now == old_bytes || now == new_bytes) << "kill " << i << ": the session file is neither the old "
                                                      << "nor the new one (" << now.size() << " bytes)";
    ASSERT_TRUE(opens_as_hdf5(out)) << "kill " << i << ": the forward output no longer opens";
    if (now == new_bytes) std::ofstream(state, std::ios::binary | std::ios::trunc) << old_bytes;
  }
  EXPECT_EQ(k.kills, kills_per_kind());
  k.print("session save");
  // The resumable proof of the new bytes, and the next complete write removes the leftovers.
  ASSERT_EQ(timed_run(write_new) > 0, true);
  EXPECT_EQ(read_bytes(state), new_bytes);
  EXPECT_EQ(timed_run(forward(ids(47, 2), ids(49, 1), {"--resume", state, "-o", dir + "/resumed.h5"})) > 0, true);
  EXPECT_EQ(temps_in(dir), std::vector<std::string>{});
}

TEST(CrashSafety, ReportWriteKilledLeavesAValidReport) {
  const std::string dir = scratch(), report = dir + "/r.h5", junit = dir + "/r.xml";
  const std::string s = dir + "/small.json";
  std::ofstream(s) << small_scenario_json(R"("pairs": [{"a": "ref@cold", "b": "ref@full", "expect": "bitexact",
    "why": "docs/sessions.md"}], "modes": ["free-running"])");
  const Args write = {"run", s, "-q", "--threads", "1", "-o", report, "--junit", junit};
  const double seconds = timed_run(write);  // the pre-existing report and JUnit file
  ASSERT_TRUE(reports::check_report_schema(report).empty());

  Killer k = make_killer("report write");
  for (int i = 0; k.more(); ++i) {
    k.kill_during(write, seconds, dir);
    const std::vector<std::string> problems = reports::check_report_schema(report);
    ASSERT_TRUE(problems.empty()) << "kill " << i << ": " << problems.front();
    const std::string xml = read_bytes(junit);
    ASSERT_TRUE(xml.rfind("<?xml", 0) == 0 && xml.size() > 14 && xml.compare(xml.size() - 14, 14, "</testsuites>\n") == 0)
        << "kill " << i << ": a partial JUnit file";
  }
  EXPECT_EQ(k.kills, kills_per_kind());
  k.print("report write");
  ASSERT_EQ(timed_run(write) > 0, true);
  EXPECT_EQ(temps_in(dir), std::vector<std::string>{});
}

// The HDF5 dump is one file, absent until complete; a directory dump too (a temp directory
// renamed into place when complete). A killed run leaves no dump at all, or a complete one.
TEST(CrashSafety, DumpWriteKilledLeavesNoDumpOrACompleteOne) {
  const std::string dir = scratch();
  const double seconds = timed_run(forward(ids(1, 30), ids(31, 4), {"--dump", dir + "/ref.h5"}));
  const size_t steps = scenarios::conform::read_port_dump(dir + "/ref.h5").steps.size();
  Killer k = make_killer("dump write");
  int complete = 0;
  for (int i = 0; k.more(); ++i) {
    const bool h5 = i % 2 == 0;
    const std::string dump = dir + (h5 ? "/d.h5" : "/d");
    k.kill_during(forward(ids(1, 30), ids(31, 4), {"--dump", dump}), seconds, dir);
    if (fs::exists(dump)) {  // never a partial dump: complete, or not there at all
      ASSERT_EQ(scenarios::conform::read_port_dump(dump).steps.size(), steps) << "kill " << i << ": " << dump;
      ++complete;
    }
    fs::remove_all(dump);
  }
  EXPECT_EQ(k.kills, kills_per_kind());
  k.print("dump write");
  std::printf("[crash] dump write: %d complete dumps found after kills\n", complete);
  // The next completed dumps to the same paths remove what the killed runs left (temp files and
  // temp directories).
  ASSERT_EQ(timed_run(forward(ids(1, 30), ids(31, 4), {"--dump", dir + "/d.h5"})) > 0, true);
  ASSERT_EQ(timed_run(forward(ids(1, 30), ids(31, 4), {"--dump", dir + "/d"})) > 0, true);
  EXPECT_EQ(scenarios::conform::read_port_dump(dir + "/d").steps.size(), steps);
  EXPECT_EQ(temps_in(dir), std::vector<std::string>{});
}

}  // namespace
}  // namespace dsv41::test
