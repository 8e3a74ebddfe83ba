// scenarios/sweep/sweep.cc: `dsv41 sweep`'s ranks (scenarios/sweep/sweep.h, docs/sweep.md): dealing, each
// rank's item processes, and rank 0's merged report.
#include "scenarios/sweep/sweep.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/config.h"
#include "reference/ops/numerics.h"
#include "reports/report.h"
#include "scenarios/runner/run_meta.h"
#include "scenarios/runner/runner.h"
#include "base/sha256.h"
#include "scenarios/sweep/sweep_internal.h"

#if defined(DSV41_HAVE_CUDA)
#include "cuda/device.h"
#endif

namespace dsv41::scenarios::sweep {
namespace {

using Clock = std::chrono::steady_clock;

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep)) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

}  // namespace

std::string sweep_rank_gpu(const SweepPlan& plan, const Comm& comm, bool warned) {
  if (!plan.uses_gpu()) return "";
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    visible = split(v, ',');
  } else {
#if defined(DSV41_HAVE_CUDA)
    for (int i = 0; i < gpu::device_count(); ++i) visible.push_back(std::to_string(i));
#endif
  }
  DSV41_CHECK(!visible.empty(), "sweep: rank ", comm.rank(), " on host ", hostname(),
              ": the plan has cuda sides but this rank sees no GPU (CUDA_VISIBLE_DEVICES='",
              std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)", "')");
  if (comm.local_size() > static_cast<int>(visible.size()) && comm.local_rank() == 0 && !warned) {
    std::cerr << "dsv41 sweep: warning: " << comm.local_size() << " ranks on host " << hostname() << " share "
              << visible.size() << " GPU(s)\n";
  }
  return visible[static_cast<size_t>(comm.local_rank()) % visible.size()];
}

namespace {

// The reference threads of each item process.
int item_threads(const SweepOptions& o, const Comm& comm) {
  if (o.threads > 0) return o.threads;
  if (std::getenv("DSV41_THREADS") != nullptr) return reference::reference_threads();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, comm.local_size()));
}

// One rank's means to run items, one at a time.
class Rank {
 public:
  Rank(const SweepPlan& plan, const SweepOptions& o, Comm& comm, std::string scratch)
      : plan_(plan), o_(o), comm_(comm), scratch_(std::move(scratch)), host_(hostname()), gpu_(sweep_rank_gpu(plan, comm, /*warned=*/true)),
        threads_(item_threads(o, comm)), exe_(self_executable()),
        plan_path_(std::filesystem::absolute(o.plan_path).string()) {}

  int threads() const { return threads_; }
  bool busy() const { return proc_ != nullptr; }

  void start(int64_t item) {
    current_ = item;
    const std::string base = scratch_ + "/item-" + std::to_string(item);
    out_ = base + ".h5";
    log_ = base + ".log";
    std::filesystem::remove(out_);
    std::filesystem::remove(log_);
    std::vector<std::string> argv = {exe_,
                                     "sweep",
                                     plan_path_,
                                     "--worker",
                                     std::to_string(item),
                                     "--worker-out",
                                     out_,
                                     "--worker-rank",
                                     std::to_string(comm_.rank()),
                                     "--worker-parent",
                                     std::to_string(getpid()),
                                     "--threads",
                                     std::to_string(threads_)};
    if (o_.test_kill_item == item) argv.push_back("--worker-kill");
    std::vector<std::pair<std::string, std::string>> env;
    if (plan_.items[static_cast<size_t>(item)].uses_gpu) env.push_back({"CUDA_VISIBLE_DEVICES", gpu_});
    proc_ = std::make_unique<ItemProcess>(argv, log_, env, o_.item_timeout);
  }

  // The outcome once the item process has ended.
  std::optional<ItemOutcome> poll() {
    if (!proc_ || !proc_->poll()) return std::nullopt;
    ItemOutcome out;
    out.item = current_;
    out.rank = comm_.rank();
    out.host = host_;
    out.gpu = plan_.items[static_cast<size_t>(current_)].uses_gpu ? gpu_ : "";
    out.seconds = proc_->seconds();
    out.exit = proc_->exit();
    if (proc_->ok() && std::filesystem::exists(out_)) {
      std::ifstream in(out_, std::ios::binary);
      out.report.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (!proc_->ok()) out.log_tail = file_tail(log_, 2000);
    proc_.reset();
    std::filesystem::remove(out_);
    if (out.exit == "ok") std::filesystem::remove(log_);
    return out;
  }

 private:
  const SweepPlan& plan_;
  const SweepOptions& o_;
  Comm& comm_;
  std::string scratch_, host_, gpu_;
  int threads_;
  std::string exe_, plan_path_;
  std::unique_ptr<ItemProcess> proc_;
  int64_t current_ = -1;
  std::string out_, log_;
};

// The items in dealing order: largest estimated cost first (ties: plan order).
std::vector<int64_t> cost_order(const SweepPlan& plan) {
  std::vector<int64_t> order;
  for (const SweepItem& it : plan.items) order.push_back(static_cast<int64_t>(it.index));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return plan.items[static_cast<size_t>(a)].estimated_cost > plan.items[static_cast<size_t>(b)].estimated_cost;
  });
  return order;
}

// Which item a rank gets next: from one shared queue, or from its own static share.
class Dealer {
 public:
  Dealer(const std::vector<int64_t>& order, const std::string& deal, int ranks) : queues_(deal == "static" ? ranks : 1) {
    for (size_t i = 0; i < order.size(); ++i) queues_[deal == "static" ? i % static_cast<size_t>(ranks) : 0].push_back(order[i]);
  }
  std::optional<int64_t> next(int rank) {
    std::vector<int64_t>& q = queues_[queues_.size() == 1 ? 0 : static_cast<size_t>(rank)];
    if (q.empty()) return std::nullopt;
    const int64_t item = q.front();
    q.erase(q.begin());
    return item;
  }

 private:
  std::vector<std::vector<int64_t>> queues_;
};

std::vector<uint8_t> item_message(int64_t item) {
  ByteWriter w;
  w.i64(item);
  return std::move(w.bytes);
}

// A rank other than 0: asks for items until rank 0 has none left for it. `kill_self` (tests):
// this rank's own process dies (SIGKILL) when it receives its second item, as a lost node would.
void serve(Rank& rank, Comm& comm, bool kill_self) {
  comm.send(0, kTagRequest, {});
  for (int received = 0;; ++received) {
    const CommMessage m = comm.receive(0);
    DSV41_CHECK(m.tag == kTagItem, "sweep: rank ", comm.rank(), ": unexpected message tag ", m.tag, " from rank 0");
    const int64_t item = ByteReader(m.bytes).i64();
    if (item < 0) return;
    if (kill_self && received == 1) ::raise(SIGKILL);
    rank.start(item);
    std::optional<ItemOutcome> out;
    while (!(out = rank.poll())) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    comm.send(0, kTagResult, out->encode());
  }
}

// ---- rank 0: the merged report ----

std::string join_distinct(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  std::set<std::string> seen;
  for (const std::string& x : v) {
    if (!seen.insert(x).second) continue;
    s += (s.empty() ? "" : sep) + x;
  }
  return s;
}

std::string item_path(const std::string& work_dir, int64_t item) { return work_dir + "/" + std::to_string(item) + ".h5"; }

// Keeps an item's report in the work folder as soon as it arrives (written beside, then renamed):
// a sweep that dies later can be resumed from what is there.
void persist(ItemOutcome& out, const std::string& work_dir) {
  if (out.report.empty() || out.exit == "resumed") return;
  const std::string path = item_path(work_dir, out.item);
  try {
    output::write_file_atomically(path, "sweep item report", out.report.data(), out.report.size());
  } catch (const std::exception& e) {
    out.exit = std::string("report lost: rank 0 could not keep it: ") + e.what();
    out.report.clear();
  }
}

// The result of an item from what its rank reported (its report, kept by persist, or an error
// that says why not).
reports::ScenarioResult item_result(const SweepItem& it, const ItemOutcome& out, const std::string& work_dir,
                                    std::string& gpu_seen) {
  std::string why;
  if (!out.report.empty()) {
    const std::string path = item_path(work_dir, static_cast<int64_t>(it.index));
    try {
      reports::RunReport r = reports::read_report(path, /*load_tensors=*/true);
      const std::vector<reports::ItemMeta> metas = reports::read_report_items(path);
      DSV41_CHECK(r.scenarios.size() == 1 && r.scenarios[0].name == it.name && metas.size() == 1,
                  "'", path, "' is not the report of item '", it.name, "'");
      gpu_seen = metas[0].gpu;
      return std::move(r.scenarios[0]);
    } catch (const std::exception& e) {
      why = std::string("its report could not be read: ") + e.what();
    }
  } else if (out.exit == "ok") {
    why = "its process exited 0 without writing its report";
  } else {
    why = "no report: " + out.exit;  // "signal 9 (Killed)", "timeout after S s (killed)", "exit 2", ...
  }
  reports::ScenarioResult r = runner::scenario_result_header(it.scenario);
  r.name = it.name;
  r.verdict = reports::Verdict::kError;
  r.error = "sweep item " + std::to_string(it.index) + ": " + why + " (where: /meta/volatile/items)" +
            (out.log_tail.empty() ? "" : "; its last output:\n" + out.log_tail);
  return r;
}

// A previous run's report of this item in --work-dir, when it ran exactly this item.
std::optional<ItemOutcome> resumed(const SweepPlan& plan, const SweepItem& it, const std::string& work_dir) {
  const std::string path = item_path(work_dir, static_cast<int64_t>(it.index));
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  try {
    const std::vector<reports::ItemMeta> m = reports::read_report_items(path);
    const reports::RunReport r = reports::read_report(path);
    const reports::ItemMeta want = stable_item_meta(plan, it);
    if (m.size() != 1 || r.scenarios.size() != 1 || r.scenarios[0].scenario_json != it.scenario.json) return std::nullopt;
    const reports::ItemMeta& got = m[0];
    if (got.item != want.item || got.scenario != want.scenario || got.model != want.model ||
        got.config_hash != want.config_hash || got.weights != want.weights || got.sides != want.sides ||
        got.modes != want.modes || got.seed != want.seed) {
      return std::nullopt;
    }
    std::ifstream in(path, std::ios::binary);
    ItemOutcome out;
    out.item = static_cast<int64_t>(it.index);
    out.rank = got.rank;
    out.host = got.host;
    out.gpu = got.gpu;
    out.seconds = got.seconds;
    out.exit = "resumed";
    out.report.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return out;
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable: run it again
  }
}

int write_merged(const SweepPlan& plan, const SweepOptions& o, const std::map<int64_t, ItemOutcome>& outcomes,
                 const std::string& work_dir, const Comm& comm, int threads, Clock::time_point t0) {
  reports::RunReport report;
  reports::RunMeta& meta = report.meta;
  std::vector<std::string> configs, hashes, weights, shas, sides;
  std::map<std::string, std::string> sha_of;  // weights file -> SHA-256
  for (const SweepModel& m : plan.models) {
    configs.push_back(m.config);
    hashes.push_back(m.config_hash);
    weights.push_back(m.weights_label());
    if (!m.weights.empty() && !sha_of.count(m.weights)) sha_of[m.weights] = sha256_file_hex(m.weights);
    shas.push_back(m.weights.empty() ? "" : sha_of[m.weights]);
    if (m.weights.empty()) meta.seeds["weights:" + m.name] = m.weight_seed;
  }
  meta.config_name = join_distinct(configs, ",");
  meta.config_hash = join_distinct(hashes, ",");
  meta.weights = join_distinct(weights, ",");
  meta.weights_sha256 = join_distinct(shas, ",");
  if (plan.models.size() == 1) {
    meta.config_json = reference::to_json_string(plan.models[0].loaded);
  } else {
    std::string j = "{";
    for (size_t i = 0; i < plan.models.size(); ++i) {
      j += (i ? ",\n\"" : "\n\"") + plan.models[i].name + "\": " + reference::to_json_string(plan.models[i].loaded);
    }
    meta.config_json = j + "\n}";
  }
  for (const std::vector<std::string>& pair : plan.sides) sides.insert(sides.end(), pair.begin(), pair.end());
  std::vector<std::string> distinct;
  for (const std::string& s : sides) {
    if (std::find(distinct.begin(), distinct.end(), s) == distinct.end()) distinct.push_back(s);
  }
  meta.sides = distinct;
  runner::stamp_run_meta(meta, o.command_line);
  meta.threads = threads;
  for (const SweepItem& it : plan.items) {
    const auto found = outcomes.find(static_cast<int64_t>(it.index));
    ItemOutcome out;
    if (found != outcomes.end()) {
      out = found->second;
    } else {
      out.exit = "not run";
      out.log_tail = "no rank reported it (the sweep ended early)";
    }
    std::string gpu = out.gpu;
    report.scenarios.push_back(item_result(it, out, work_dir, gpu));
    reports::ItemMeta im = stable_item_meta(plan, it);
    im.weights_sha256 = plan.models[it.model].weights.empty() ? "" : sha_of[plan.models[it.model].weights];
    im.rank = out.rank;
    im.host = out.host;
    im.gpu = gpu;
    im.seconds = out.seconds;
    im.exit = out.exit;
    meta.items.push_back(std::move(im));
    meta.seeds["scenario:" + it.name] = it.scenario.seed;
  }
  meta.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  report.verdict = reports::roll_up(report.scenarios);
  reports::write_report(o.output, report);
  if (!o.junit.empty()) reports::write_junit(o.junit, report);
  std::cout << reports::format_summary(report, o.rows);
  std::cout << "sweep: " << plan.items.size() << " items on " << comm.size() << " rank(s) in " << meta.seconds
            << " s; report: " << o.output << (o.junit.empty() ? "" : ", junit: " + o.junit) << "\n";
  return reports::exit_code(report.verdict);
}

// Rank 0: deals, runs its own share, collects every outcome, writes the report.
int lead(const SweepPlan& plan, const SweepOptions& o, Comm& comm, Rank& rank, const std::string& work_dir) {
  const Clock::time_point t0 = Clock::now();
  std::map<int64_t, ItemOutcome> outcomes;
  if (o.resume) {
    for (const SweepItem& it : plan.items) {
      if (std::optional<ItemOutcome> r = resumed(plan, it, work_dir)) outcomes[static_cast<int64_t>(it.index)] = *r;
    }
  }
  std::vector<int64_t> order;
  for (int64_t i : cost_order(plan)) {
    if (!outcomes.count(i)) order.push_back(i);
  }
  std::cerr << "dsv41 sweep: plan " << plan.source << ": " << plan.items.size() << " item(s)"
            << (outcomes.empty() ? "" : " (" + std::to_string(outcomes.size()) + " resumed from " + work_dir + ")")
            << ", " << plan.models.size() << " model(s), " << comm.size() << " rank(s) ("
            << comm.transport() << "), dealing " << o.deal << ", " << rank.threads() << " thread(s) per item\n";
  Dealer dealer(order, o.deal, comm.size());
  const auto report_line = [&](const ItemOutcome& out) {
    if (o.quiet) return;
    const SweepItem& it = plan.items[static_cast<size_t>(out.item)];
    std::fprintf(stderr, "[%7.1fs] item %zu/%zu %s: %s on rank %lld (%s%s), %.1f s\n",
                 std::chrono::duration<double>(Clock::now() - t0).count(), it.index + 1, plan.items.size(),
                 it.name.c_str(), out.exit.c_str(), static_cast<long long>(out.rank), out.host.c_str(),
                 out.gpu.empty() ? "" : (", GPU " + out.gpu).c_str(), out.seconds);
  };
  int released = 0;  // ranks told there is nothing more for them
  bool own_done = false;
  while (!own_done || released < comm.size() - 1) {
    bool idle = true;
    if (!own_done && !rank.busy()) {
      if (const std::optional<int64_t> item = dealer.next(0)) {
        rank.start(*item);
      } else {
        own_done = true;
      }
      idle = false;
    }
    if (std::optional<ItemOutcome> out = rank.poll()) {
      persist(*out, work_dir);
      report_line(*out);
      outcomes[out->item] = std::move(*out);
      idle = false;
    }
    if (std::optional<CommMessage> m = comm.poll()) {
      idle = false;
      if (m->tag == kTagResult) {
        ItemOutcome out = ItemOutcome::decode(m->bytes);
        persist(out, work_dir);
        report_line(out);
        outcomes[out.item] = std::move(out);
      } else {
        DSV41_CHECK(m->tag == kTagRequest, "sweep: rank 0: unexpected message tag ", m->tag, " from rank ", m->source);
      }
      const std::optional<int64_t> item = dealer.next(m->source);
      comm.send(m->source, kTagItem, item_message(item.value_or(-1)));
      if (!item) ++released;
    }
    if (idle) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return write_merged(plan, o, outcomes, work_dir, comm, rank.threads(), t0);
}

// Removes the folders `<prefix><pid>[...]` in `dir` (the prefix names this host) whose process no
// longer runs:
// what a killed sweep left behind (a rank ended by Open MPI's abort or a job's time limit runs no
// destructor).
void remove_stale(const std::filesystem::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_directory(ec)) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t digits = rest.find_first_not_of("0123456789");
    if (digits == 0) continue;
    const long pid = std::strtol(rest.substr(0, digits).c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

int run_sweep(const SweepPlan& plan, const SweepOptions& o, Comm& comm) {
  // Rank 0 keeps the item reports in the work folder; every rank has a private scratch folder.
  std::string work_dir = o.work_dir;
  bool remove_work = false;
  if (comm.rank() == 0 && work_dir.empty()) {
    const std::filesystem::path out = std::filesystem::absolute(o.output);
    const std::string prefix = out.filename().string() + ".sweep." + hostname() + ".";
    remove_stale(out.parent_path(), prefix);
    work_dir = (out.parent_path() / (prefix + std::to_string(getpid()))).string();
    remove_work = true;
  }
  if (comm.rank() == 0) std::filesystem::create_directories(work_dir);
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path tmp_dir = tmp && *tmp ? tmp : "/tmp";
  const std::string prefix = "dsv41-sweep." + hostname() + ".";  // pids are this host's: a shared folder stays safe
  remove_stale(tmp_dir, prefix);
  std::string pattern =
      (tmp_dir / (prefix + std::to_string(getpid()) + ".rank" + std::to_string(comm.rank()) + ".XXXXXX")).string();
  DSV41_CHECK(mkdtemp(pattern.data()) != nullptr, "sweep: rank ", comm.rank(), ": cannot create a scratch folder '",
              pattern, "'");
  const std::string scratch = pattern;
  struct Cleanup {
    std::string scratch, work;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(scratch, ec);
      if (!work.empty()) std::filesystem::remove_all(work, ec);
    }
  } cleanup{scratch, remove_work ? work_dir : ""};
  Rank rank(plan, o, comm, scratch);
  if (comm.rank() != 0) {
    serve(rank, comm, o.test_kill_rank == comm.rank());
    return runner::kExitOk;
  }
  return lead(plan, o, comm, rank, work_dir);
}

}  // namespace dsv41::scenarios::sweep
