// scenarios/sweep/sweep_item.cc: one item of a sweep in a process of its own (scenarios/sweep/sweep.h): the
// item process itself (run_sweep_item) and how a rank starts, watches and ends one (ItemProcess).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "reference/ops/config.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/runner/run_meta.h"
#include "scenarios/runner/id_list.h"
#include "scenarios/runner/runner.h"
#include "scenarios/sweep/sweep.h"
#include "scenarios/sweep/sweep_internal.h"

#if defined(DSV41_HAVE_CUDA)
#include "cuda/device.h"
#endif

extern char** environ;

namespace dsv41::scenarios::sweep {

// ---- what a rank reports about an item ----

std::vector<uint8_t> ItemOutcome::encode() const {
  ByteWriter w;
  w.i64(item);
  w.i64(rank);
  w.str(host);
  w.str(gpu);
  w.f64(seconds);
  w.str(exit);
  w.str(log_tail);
  w.blob(report);
  return std::move(w.bytes);
}

ItemOutcome ItemOutcome::decode(const std::vector<uint8_t>& bytes) {
  ByteReader r(bytes);
  ItemOutcome o;
  o.item = r.i64();
  o.rank = r.i64();
  o.host = r.str();
  o.gpu = r.str();
  o.seconds = r.f64();
  o.exit = r.str();
  o.log_tail = r.str();
  o.report = r.blob();
  return o;
}

// ---- the item process, seen from its rank ----

ItemProcess::ItemProcess(const std::vector<std::string>& argv, const std::string& log_path,
                         const std::vector<std::pair<std::string, std::string>>& env, double timeout_seconds)
    : timeout_(timeout_seconds), start_(std::chrono::steady_clock::now()) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : env) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    pid_ = -1;
    done_ = true;
    end_ = start_;
    exit_ = "could not start '" + argv[0] + "': " + std::strerror(rc);
  }
}

ItemProcess::~ItemProcess() {
  if (done_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

double ItemProcess::seconds() const {
  return std::chrono::duration<double>((done_ ? end_ : std::chrono::steady_clock::now()) - start_).count();
}

bool ItemProcess::poll() {
  if (done_) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) {
    if (timeout_ <= 0 || seconds() < timeout_) return false;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    done_ = true;
    end_ = std::chrono::steady_clock::now();
    std::ostringstream s;
    s << "timeout after " << timeout_ << " s (killed)";
    exit_ = s.str();
    return true;
  }
  done_ = true;
  end_ = std::chrono::steady_clock::now();
  if (r < 0) {
    exit_ = std::string("lost: waitpid failed: ") + std::strerror(errno);
  } else if (WIFEXITED(status)) {
    ok_ = WEXITSTATUS(status) == 0;
    exit_ = ok_ ? "ok" : "exit " + std::to_string(WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    exit_ = "signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  } else {
    exit_ = "ended with status " + std::to_string(status);
  }
  return true;
}

std::string file_tail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  in.seekg(from);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (from > 0) {
    const size_t nl = s.find('\n');
    s = nl == std::string::npos ? s : s.substr(nl + 1);
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

std::string self_executable() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  DSV41_CHECK(!ec, "sweep: cannot find this executable (/proc/self/exe): ", ec.message());
  return p.string();
}

// ---- the item process itself ----

reports::ItemMeta stable_item_meta(const SweepPlan& plan, const SweepItem& item) {
  const SweepModel& m = plan.models[item.model];
  reports::ItemMeta meta;
  meta.item = item.name;
  meta.scenario = item.scenario_ref;
  meta.model = m.name;
  meta.config_name = m.config;
  meta.config_hash = m.config_hash;
  meta.weights = m.weights_label();
  meta.sides = item.sides.empty() ? "" : item.sides[0] + "," + item.sides[1];
  meta.modes = item.modes.empty() ? "" : item.modes[0];
  meta.seed = item.scenario.seed;
  meta.estimated_cost = item.estimated_cost;
  return meta;
}

namespace {

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// The model of an item: config, token map and weights, as `dsv41 run` builds them.
runner::BackendResources load_resources(const SweepModel& m) {
  runner::BackendResources res{m.loaded, {}, {}};
  res.token_map = m.token_map.empty() ? reference::model::default_token_map(m.loaded)
                                      : runner::parse_id_list("@" + m.token_map, "token_map");
  DSV41_CHECK(static_cast<int64_t>(res.token_map.size()) == m.loaded.vocab_size, "model '", m.name, "': token_map '",
              m.token_map, "': ", res.token_map.size(), " ids, but the config has a vocab of ", m.loaded.vocab_size);
  if (!m.weights.empty()) {
    res.weights = reference::checkpoint::ModelWeights::load(m.weights, m.loaded);
  } else {
    res.weights = reference::checkpoint::ModelWeights::load(
        reference::checkpoint::safetensors::SafetensorsFile::from_entries("generated weights",
                                                             reference::checkpoint::generate_weights(m.loaded, m.weight_seed)),
        m.loaded);
  }
  return res;
}

}  // namespace

int run_sweep_item(const SweepPlan& plan, const WorkerArgs& w) {
  // Die with the rank that started us (a killed rank leaves no item process running on).
  if (w.parent > 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != static_cast<pid_t>(w.parent)) return runner::kExitBadInput;
  }
  DSV41_CHECK(w.item >= 0 && w.item < static_cast<int64_t>(plan.items.size()), "sweep --worker ", w.item,
              ": the plan has ", plan.items.size(), " items");
  if (w.threads > 0) reference::set_reference_threads(w.threads);
  const auto t0 = std::chrono::steady_clock::now();
  const SweepItem& it = plan.items[static_cast<size_t>(w.item)];
  const SweepModel& m = plan.models[it.model];
  reports::ItemMeta meta = stable_item_meta(plan, it);
  meta.rank = w.rank;
  meta.host = hostname();
  if (it.uses_gpu) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    meta.gpu = visible ? visible : "";
#if defined(DSV41_HAVE_CUDA)
    if (gpu::device_count() > 0) meta.gpu += ": " + gpu::device_name(0);
#endif
  }
  std::cerr << "dsv41 sweep: item " << it.index << " " << it.name << " (scenario " << it.scenario_ref << ", model "
            << m.name << ", seed " << it.scenario.seed << ")\n";
  reports::ScenarioResult result;
  try {
    const runner::BackendResources res = load_resources(m);
    runner::RunOptions o;
    o.sides = it.sides;
    o.modes = it.modes;
    o.stop_after_step = plan.stop_after_step;
    o.rerun_prefix = m.rerun_prefix() + (it.seed ? " --seed " + std::to_string(*it.seed) : "");
    bool first = true;
    o.progress = [&](const std::string& line) {
      std::cerr << line << "\n";
      if (w.kill_mid_item && !first) ::raise(SIGKILL);  // after the first event: mid-item
      first = false;
    };
    result = runner::run_scenario(it.scenario, res, o);
  } catch (const std::exception& e) {
    // As `dsv41 run`: the item's failure is its verdict.
    result = runner::scenario_result_header(it.scenario);
    result.verdict = reports::Verdict::kError;
    result.error = e.what();
  }
  result.name = it.name;
  reports::RunReport report;
  report.meta.config_name = m.config;
  report.meta.config_hash = m.config_hash;
  report.meta.config_json = reference::to_json_string(m.loaded);
  report.meta.weights = m.weights_label();
  meta.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  meta.exit = "ok";
  report.meta.items = {meta};
  report.scenarios.push_back(std::move(result));
  report.verdict = reports::roll_up(report.scenarios);
  reports::write_report(w.out, report);
  std::cerr << "dsv41 sweep: item " << it.index << ": " << reports::name(report.verdict) << "\n";
  return runner::kExitOk;
}

}  // namespace dsv41::scenarios::sweep
