// scenarios/sweep/sweep.h
//
// `dsv41 sweep PLAN` (docs/sweep.md): the work items of a plan (scenarios/sweep/sweep_plan.h) dealt to
// the ranks (scenarios/sweep/sweep_comm.h), each item run in a process of its own (this executable again,
// `dsv41 sweep PLAN --worker K`), so that an item that crashes, is killed or hangs past
// --item-timeout becomes that item's `error` and the sweep goes on. Rank 0 deals the items (a work
// queue, largest estimated cost first, or a static round-robin split of that order), also runs
// items itself, receives every item's one-scenario report, and writes one report in the schema
// of docs/report-schema.md: the items in plan order, what each ran in /meta/items, where it ran
// (rank, host, GPU, wall time, how its process ended) in /meta/volatile/items. The content outside
// /meta/volatile is a function of the plan alone, whatever the number of ranks or the dealing.
//
// When the plan has `cuda` sides, each rank binds one GPU: CUDA_VISIBLE_DEVICES of its item
// processes is entry (local rank mod n) of the GPUs the rank sees (its own CUDA_VISIBLE_DEVICES,
// as Slurm sets it, or every device).
//
// Example:
//   SweepPlan plan = load_sweep_plan("plan.json");
//   std::unique_ptr<Comm> comm = make_comm();
//   SweepOptions o; o.output = "sweep.h5";
//   return run_sweep(plan, o, *comm);   // rank 0: the run's exit code; other ranks: 0
#pragma once

#include <cstdint>
#include <string>

#include "reports/report.h"
#include "scenarios/sweep/sweep_comm.h"
#include "scenarios/sweep/sweep_plan.h"

namespace dsv41::scenarios::sweep {

struct SweepOptions {
  std::string plan_path;             // the plan file (item processes read it again)
  std::string output = "dsv41-sweep.h5";
  std::string junit;                 // "" none
  std::string deal = "queue";        // "queue" or "static"
  int threads = 0;                   // reference threads per item process; 0: DSV41_THREADS, else cores / ranks on the host
  double item_timeout = 0;           // seconds; 0: none
  std::string work_dir;              // item reports kept here (rank 0); "": a temporary folder, removed
  bool resume = false;               // reuse the item reports of --work-dir that match the plan
  bool quiet = false;
  int rows = 20;
  int64_t test_kill_item = -1;       // tests: the process of this item kills itself (SIGKILL) after its first event
  int64_t test_kill_rank = -1;       // tests: this rank's own process (not an item's) kills itself at its second item
  std::string command_line;
};

// Runs the sweep on this rank; collective (every rank calls it). Rank 0 returns the run's exit
// code (reports::exit_code of the merged verdict); the other ranks 0, or 2 when they failed.
int run_sweep(const SweepPlan& plan, const SweepOptions& options, Comm& comm);

// The GPU this rank's cuda items run on ("" when the plan has no cuda side): entry (local rank
// mod n) of the GPUs the rank sees (CUDA_VISIBLE_DEVICES, else every device). A dsv41::Error when
// the plan has cuda sides and the rank sees none; a warning on stderr (unless `warned`) when more
// ranks than GPUs share a host.
std::string sweep_rank_gpu(const SweepPlan& plan, const Comm& comm, bool warned = false);

// The item process: runs item `item` of the plan and writes its one-scenario report (with its
// ItemMeta) to `out`. Returns 0 when the report was written (whatever its verdict).
struct WorkerArgs {
  int64_t item = -1;
  std::string out;
  int64_t rank = 0;
  int64_t parent = 0;                // the rank's pid: the item process dies with it
  int threads = 0;
  bool kill_mid_item = false;        // SIGKILL itself after its first event (tests)
};
int run_sweep_item(const SweepPlan& plan, const WorkerArgs& args);

// What the plan's items are, stable part only (no rank, host, time): shared by the item process
// and rank 0, so a resumed item is recognized.
reports::ItemMeta stable_item_meta(const SweepPlan& plan, const SweepItem& item);

}  // namespace dsv41::scenarios::sweep
