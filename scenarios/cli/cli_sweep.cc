// dsv41 sweep: a plan's work items (scenarios x models x sides x modes x seeds) run over MPI ranks,
// one merged HDF5 report (scenarios/sweep/sweep.h, docs/sweep.md). Exit codes as `dsv41 run`: 0 pass
// (or measured only), 1 a divergence beyond tolerance, 2 bad input or an item's error, 3 inconclusive.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "base/error.h"
#include "reference/ops/tensor.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/cli/cli.h"
#include "scenarios/sweep/sweep.h"

namespace dsv41::scenarios::cli {
namespace {

struct SweepArgs {
  std::string plan;
  sweep::SweepOptions o;
  bool list = false;
  sweep::WorkerArgs worker;
};

// Refuses a plan whose largest item would not fit this host's memory with one item per local rank
// (the reference holds every weight as fp32 in each backend's copy, as `dsv41 run` checks).
void check_memory(const sweep::SweepPlan& plan, int local_ranks) {
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (have <= 0) return;
  for (const sweep::SweepItem& it : plan.items) {
    double values = 0;
    for (const reference::checkpoint::TensorSpec& t : reference::checkpoint::expected_tensors(plan.models[it.model].loaded)) {
      values += static_cast<double>(reference::Tensor<float>::count(t.shape));
    }
    const double need = it.weight_copies * 4.0 * values * local_ranks;
    DSV41_CHECK(need <= have, "sweep plan '", plan.source, "': item ", it.index, " (", it.name, ") would hold ",
                static_cast<int64_t>(need / 1e9), " GB of fp32 weights (", it.weight_copies, " copies x ", local_ranks,
                " rank(s) on this host), this machine has ", static_cast<int64_t>(have / 1e9),
                " GB; use a smaller config or fewer ranks per host");
  }
}

void print_items(const sweep::SweepPlan& plan) {
  std::cout << "sweep plan " << plan.source << " (" << plan.name << "): " << plan.items.size() << " item(s)\n";
  for (const sweep::SweepItem& it : plan.items) {
    std::printf("  %4zu  %-60s  model %s, est. cost %.3g%s\n", it.index, it.name.c_str(),
                plan.models[it.model].name.c_str(), it.estimated_cost, it.uses_gpu ? ", GPU" : "");
  }
  std::cout << "MPI: " << (sweep::built_with_mpi() ? "built with MPI" : "built without MPI (one process)") << "\n";
}

int run(SweepArgs& a, const std::string& command_line) {
  if (a.worker.item >= 0) {  // an item process: never MPI, whatever the environment says
    return sweep::run_sweep_item(sweep::load_sweep_plan(a.plan), a.worker);
  }
  a.o.plan_path = a.plan;
  a.o.command_line = command_line;
  DSV41_CHECK(!a.o.resume || !a.o.work_dir.empty(), "--resume: needs --work-dir (the folder of the earlier run's items)");
  DSV41_CHECK(a.o.deal == "queue" || a.o.deal == "static", "--deal '", a.o.deal, "': not queue or static");
  std::unique_ptr<sweep::Comm> comm = sweep::make_comm();
  // 1. Every rank checks the plan and its GPU; rank 0 the outputs. One failure stops all, before any work.
  std::optional<sweep::SweepPlan> plan;
  std::string error;
  try {
    plan = sweep::load_sweep_plan(a.plan);
    if (!a.list) {
      sweep::sweep_rank_gpu(*plan, *comm);
      check_memory(*plan, comm->local_size());
      if (comm->rank() == 0) {
        const std::filesystem::path out_dir = std::filesystem::path(a.o.output).parent_path();
        DSV41_CHECK(out_dir.empty() || std::filesystem::is_directory(out_dir), "-o '", a.o.output, "': directory '",
                    out_dir.string(), "' does not exist");
        output::VerbFiles inputs;  // outputs never alias them (base/output_file.h)
        inputs.input(a.plan, "sweep plan");
        for (const sweep::SweepModel& m : plan->models) {
          inputs.input(m.config, "config of model '" + m.name + "'").input(m.weights, "weights of model '" + m.name + "'");
          inputs.input(m.token_map, "token map of model '" + m.name + "'");
        }
        for (const sweep::SweepItem& it : plan->items) inputs.input(it.scenario_ref, "scenario of item '" + it.name + "'");
        runner::check_report_outputs(a.o.output, a.o.junit, inputs);
        if (!a.o.work_dir.empty()) {
          std::filesystem::create_directories(a.o.work_dir);
          DSV41_CHECK(std::filesystem::is_directory(a.o.work_dir), "--work-dir '", a.o.work_dir, "': not a directory");
        }
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<int> failed = comm->all_gather(error.empty() ? 0 : 1);
  if (!error.empty()) {
    // Each rank's own message once: rank 0's, or a rank's whose problem rank 0 does not share.
    if (comm->rank() == 0 || failed[0] == 0) {
      std::cerr << "dsv41: error: " << (comm->rank() == 0 ? "" : "rank " + std::to_string(comm->rank()) + ": ")
                << error << "\n";
    }
    return runner::kExitBadInput;
  }
  if (std::count(failed.begin(), failed.end(), 1) > 0) return runner::kExitBadInput;
  if (a.list) {
    if (comm->rank() == 0) print_items(*plan);
    return runner::kExitOk;
  }
  // 2. The sweep. A rank that fails now would leave the others waiting: end them all.
  try {
    return sweep::run_sweep(*plan, a.o, *comm);
  } catch (const std::exception& e) {
    std::cerr << "dsv41: error: " << (comm->size() > 1 ? "rank " + std::to_string(comm->rank()) + ": " : "")
              << e.what() << "\n";
    if (comm->size() > 1) comm->abort_all(runner::kExitBadInput);
    return runner::kExitBadInput;
  }
}

}  // namespace

Verb add_sweep_verb(CLI::App& parent) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* app = parent.add_subcommand(
      "sweep", "run a sweep plan (scenarios x models x sides x modes x seeds) over MPI ranks, or in one process "
               "without mpirun; one merged HDF5 report (docs/sweep.md)");
  app->add_option("plan", a->plan, "the sweep plan (.json)")->required();
  app->add_option("-o,--output", a->o.output, "the merged HDF5 report (written atomically by rank 0)");
  app->add_option("--junit", a->o.junit, "also write JUnit XML here");
  app->add_option("--deal", a->o.deal, "how items reach the ranks: queue (rank 0 hands out the next item, largest "
                                       "estimated cost first) or static (round-robin of that order)");
  app->add_option("--threads", a->o.threads,
                  "reference threads per item process (default: DSV41_THREADS, else cores / ranks on the host)")
      ->check(CLI::Range(1, 1024));
  finite_option(app->add_option("--item-timeout", a->o.item_timeout, "kill an item's process after this many seconds (its "
                                                                      "verdict: error); default: no limit"),
                0.0, 1048576.0, /*lo_open=*/true);
  app->add_option("--work-dir", a->o.work_dir, "keep each item's report here (rank 0); default: a temporary "
                                               "folder beside the report, removed");
  app->add_flag("--resume", a->o.resume, "reuse the item reports in --work-dir that ran exactly these items");
  app->add_option("--rows", a->o.rows, "worst metrics shown in the summary")->check(CLI::Range(0, 100000));
  app->add_flag("--list", a->list, "list the plan's items and exit");
  app->add_flag("-q,--quiet", a->o.quiet, "no progress lines");
  // The item process's own arguments (set by the ranks) and the test hook: not for users.
  app->add_option("--worker", a->worker.item)->group("");
  app->add_option("--worker-out", a->worker.out)->group("");
  app->add_option("--worker-rank", a->worker.rank)->group("");
  app->add_option("--worker-parent", a->worker.parent)->group("");
  app->add_flag("--worker-kill", a->worker.kill_mid_item)->group("");
  app->add_option("--test-kill-item", a->o.test_kill_item)->group("");
  app->add_option("--test-kill-rank", a->o.test_kill_rank)->group("");
  return {app, [a, app] {
            a->worker.threads = a->o.threads;
            const std::string cmd = command_line_of(*app, "sweep", "plan");
            return run(*a, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
