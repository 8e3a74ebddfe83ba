// One rank's side of a sweep (scenarios/sweep/sweep.h, scenarios/sweep/sweep_internal.h): the GPU a rank binds
// (entry local rank mod n of what it sees; refused when it sees none), the item process as a rank
// sees it end (exit codes, signals, timeouts, a missing executable, the environment it is given),
// and the outcome message's encoding.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "base/error.h"
#include "scenarios/sweep/sweep.h"
#include "scenarios/sweep/sweep_internal.h"

namespace dsv41::scenarios::sweep {
namespace {

// A rank of `size` with a local rank among `local_size` on its host; no messages.
class FakeComm final : public Comm {
 public:
  FakeComm(int rank, int local_rank, int local_size) : rank_(rank), local_rank_(local_rank), local_size_(local_size) {}
  int rank() const override { return rank_; }
  int size() const override { return 8; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string transport() const override { return "fake"; }
  std::vector<int> all_gather(int flag) override { return {flag}; }
  void send(int, int, const std::vector<uint8_t>&) override {}
  CommMessage receive(int) override { return {}; }
  std::optional<CommMessage> poll() override { return std::nullopt; }
  [[noreturn]] void abort_all(int code) override { std::exit(code); }

 private:
  int rank_, local_rank_, local_size_;
};

SweepPlan plan_with_gpu(bool gpu) {
  SweepPlan p;
  SweepItem it;
  it.uses_gpu = gpu;
  p.items.push_back(it);
  return p;
}

// Sets (or unsets, nullptr) CUDA_VISIBLE_DEVICES for one test.
class VisibleDevices {
 public:
  explicit VisibleDevices(const char* value) {
    if (const char* old = std::getenv("CUDA_VISIBLE_DEVICES")) old_ = old;
    value ? setenv("CUDA_VISIBLE_DEVICES", value, 1) : unsetenv("CUDA_VISIBLE_DEVICES");
  }
  ~VisibleDevices() { old_ ? setenv("CUDA_VISIBLE_DEVICES", old_->c_str(), 1) : unsetenv("CUDA_VISIBLE_DEVICES"); }

 private:
  std::optional<std::string> old_;
};

TEST(SweepRank, BindsTheGpuOfItsLocalRankAmongTheVisibleOnes) {
  const VisibleDevices v("4,5");
  const SweepPlan gpu = plan_with_gpu(true);
  EXPECT_EQ(sweep_rank_gpu(gpu, FakeComm(8, 0, 2)), "4");
  EXPECT_EQ(sweep_rank_gpu(gpu, FakeComm(9, 1, 2)), "5");
  EXPECT_EQ(sweep_rank_gpu(gpu, FakeComm(10, 2, 3), /*warned=*/true), "4") << "more ranks than GPUs: they share";
  EXPECT_EQ(sweep_rank_gpu(plan_with_gpu(false), FakeComm(9, 1, 2)), "") << "a CPU plan binds no GPU";
  const VisibleDevices one("GPU-8f1a");  // Slurm's --gpus-per-task: one entry per task, a UUID or an index
  EXPECT_EQ(sweep_rank_gpu(gpu, FakeComm(3, 3, 4), true), "GPU-8f1a");
}

TEST(SweepRank, RefusesACudaPlanOnARankThatSeesNoGpu) {
  const VisibleDevices v("");
  try {
    sweep_rank_gpu(plan_with_gpu(true), FakeComm(5, 1, 2));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 5 on host"), std::string::npos) << m;
    EXPECT_NE(m.find("the plan has cuda sides but this rank sees no GPU"), std::string::npos) << m;
  }
}

std::string scratch() {
  const std::string d = testing::TempDir() + "/dsv41_sweep_rank_" + std::to_string(::getpid());
  std::filesystem::create_directories(d);
  return d;
}

// Runs `sh -c script` as an item process until it ends; its exit description.
std::string run_sh(const std::string& script, double timeout = 0, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  ItemProcess p({"/bin/sh", "-c", script}, scratch() + "/log", env, timeout);
  const auto t0 = std::chrono::steady_clock::now();
  while (!p.poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) return "test: no end";
  }
  EXPECT_GE(p.seconds(), 0);
  return p.exit();
}

TEST(SweepRank, SeesHowAnItemProcessEnded) {
  EXPECT_EQ(run_sh("exit 0"), "ok");
  EXPECT_EQ(run_sh("exit 3"), "exit 3");
  EXPECT_EQ(run_sh("kill -9 $$"), "signal 9 (Killed)");
  EXPECT_EQ(run_sh("kill -11 $$"), "signal 11 (Segmentation fault)");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run_sh("sleep 20", 0.2), "timeout after 0.2 s (killed)");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "killed at the timeout, not waited for";
  ItemProcess missing({"/no/such/dsv41"}, scratch() + "/log", {}, 0);
  while (!missing.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.exit().find("/no/such/dsv41"), std::string::npos) << missing.exit();
}

TEST(SweepRank, GivesTheItemProcessItsGpuAndKeepsItsOutput) {
  const std::string log = scratch() + "/log";
  std::filesystem::remove(log);
  EXPECT_EQ(run_sh("echo visible=$CUDA_VISIBLE_DEVICES; echo to-stderr >&2", 0, {{"CUDA_VISIBLE_DEVICES", "1"}}), "ok");
  const std::string out = file_tail(log, 2000);
  EXPECT_NE(out.find("visible=1"), std::string::npos) << out;
  EXPECT_NE(out.find("to-stderr"), std::string::npos) << "stderr goes to the log too: " << out;
  // The tail starts at a line: at most max_bytes, never half a line.
  std::ofstream(log) << std::string(100, 'a') << "\nlast line\n";
  EXPECT_EQ(file_tail(log, 20), "last line");
}

TEST(SweepRank, OutcomeMessagesRoundTripAndATruncatedOneIsRefused) {
  ItemOutcome o;
  o.item = 7;
  o.rank = 3;
  o.host = "node-a";
  o.gpu = "1";
  o.seconds = 12.5;
  o.exit = "signal 9 (Killed)";
  o.log_tail = "event 2/5";
  o.report = {0, 1, 2, 255};
  const std::vector<uint8_t> bytes = o.encode();
  const ItemOutcome b = ItemOutcome::decode(bytes);
  EXPECT_EQ(b.item, 7);
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.host, "node-a");
  EXPECT_EQ(b.gpu, "1");
  EXPECT_EQ(b.seconds, 12.5);
  EXPECT_EQ(b.exit, o.exit);
  EXPECT_EQ(b.log_tail, o.log_tail);
  EXPECT_EQ(b.report, o.report);
  const std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 2);
  EXPECT_THROW(ItemOutcome::decode(cut), Error);
}

}  // namespace
}  // namespace dsv41::scenarios::sweep
