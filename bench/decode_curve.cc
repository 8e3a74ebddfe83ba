// bench/decode_curve.cc: the decode-cost curve (issue 32, item 5): the time of a one-token decode
// step at contexts 4K .. 1M on a backend (the production path: `cuda`), from states built directly
// at each context (bench/synthetic_state.h: caches of C positions' worth of valid packed entries,
// rings full, no prefill). Goal: the step at 2^20 costs <= 1.5x the step at 4096 (the seeds claim
// +25% FLOPs from 4K to 1M).
//
// Per context C: one Model over the backend's ops (scenarios/runner/backend_model.h, the names of
// `dsv41 forward --backend`), max_seq_len C + steps (--max-seq-len fit, the default: the state is
// sized to its context; `config` keeps the config's), the synthetic state (seed printed), --warmup
// untimed steps, then --steps timed one-token steps (seeded random tokens). Each step returns its
// logits to the host (StepRecord: the device's work and that download; StepOptions::logits_only,
// the selections stay where they are) and they must be finite and not all zero, else exit 2.
// Reported per context: step ms median / p10 / p90 / mean, the ratio of the median to the 4096
// step's (to the first context's when 4096 is not run), the state's bytes (allocated and held,
// where they live), the device's allocations and host synchronizations per step (a device backend:
// gpu::host_sync_counts; DSV41_CUDA_DEFER_CHECKS=1 defers the input checks) and the process's peak RSS. A
// table on stdout; --out PREFIX writes PREFIX.csv and PREFIX.json (atomically, after every
// context: a run cut short keeps what it measured).
//
// Usage:
//   dsv41_decode_curve [--backend ref|cuda-exact|cuda|ref-order:V] [--config tiny|FILE]
//       [--weights FILE] [--weight-seed S] [--contexts 4096,16384,...] [--steps 20] [--warmup 3]
//       [--seed S] [--max-seq-len fit|config|N] [--threads N] [--out PREFIX] [--chunk T] [--full-record]
// --chunk T: steps of T tokens (a prefill chunk at the context: with DSV41_REF_OP_TIMES=1 and
// --full-record, the profile of the million run's reference replay of its last chunk, scaled down).
// Default config: tiny (golden/oracle/config.json) with the oracle's weights; any other config gets
// generated weights (--weight-seed, printed) unless --weights names a file. bench/decode_curve.sh
// builds and runs the curve on the device.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/output_file.h"
#include "bench/synthetic_state.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "reference/model/model.h"
#include "reference/ops/config.h"
#include "reference/ops/numerics.h"
#include "scenarios/runner/backend_model.h"
#if defined(DSV41_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#endif

namespace {

using namespace dsv41;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Args {
  std::string backend = "ref", config = "tiny", weights, contexts = "4096,16384,65536,262144,1048576";
  std::string max_seq_len = "fit", out;
  uint64_t weight_seed = 0, seed = 0;
  int64_t steps = 20, warmup = 3;
  int64_t chunk = 1;         // tokens per step (1: decode; more: a prefill chunk at the context)
  bool full_record = false;  // StepOptions::logits_only off: the selections come back, as a replay's
  int threads = 0;
  int64_t positions() const { return (warmup + steps) * chunk; }  // past the context
};

// One context's measurement.
struct Point {
  int64_t context = 0, max_seq_len = 0;
  double build_s = 0;                     // the synthetic state
  std::vector<double> step_ms;            // [steps] in run order
  double median = 0, p10 = 0, p90 = 0, mean = 0, ratio = 0;
  bench::StateBytes bytes;
  std::string state_where;                // "device" or "host"
  int64_t device_alloc_after_state = -1;  // bytes device_alloc held after the state was built (-1: host)
  int64_t device_peak_alloc = -1;         // their high-water mark over the model, the state and the steps
  int64_t peak_rss = 0;                   // the process's (VmHWM), bytes
  // Host synchronizations per timed step (gpu::host_sync_counts over the timed steps; -1: host
  // backend): all, and device-to-host copies, host-to-device copies, device waits.
  double syncs = -1, syncs_d2h = -1, syncs_h2d = -1, syncs_device = -1;
  double staged_uploads = -1;  // uploads per timed step sent from the pinned ring (no host wait)
};

// DSV41_CUDA_DEFER_CHECKS as set ("unset": off; cuda/deferred_checks.h).
std::string defer_checks_env() {
  const char* env = std::getenv("DSV41_CUDA_DEFER_CHECKS");
  return env == nullptr ? "unset" : env;
}

// DSV41_CUDA_ASYNC_UPLOADS as set ("unset": off; cuda/upload_staging.cu).
std::string async_uploads_env() {
  const char* env = std::getenv("DSV41_CUDA_ASYNC_UPLOADS");
  return env == nullptr ? "unset" : env;
}

// The q-quantile of sorted values (nearest rank on [0, n-1]).
double quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  return sorted[static_cast<size_t>(std::lround(at))];
}

std::vector<int64_t> parse_contexts(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSV41_CHECK(used == item.size() && !item.empty() && v > 0, "--contexts: '", item,
                "' is not a positive integer (a comma-separated list of contexts, e.g. 4096,16384)");
    DSV41_CHECK(out.empty() || v > out.back(), "--contexts: ", v, " after ", out.back(), " (list them ascending)");
    out.push_back(v);
  }
  DSV41_CHECK(!out.empty(), "--contexts: empty list");
  return out;
}

// max_seq_len of the context's model: fit (context + steps, the least the run needs), config (the
// config's own), or a number.
int64_t max_seq_len_for(const std::string& policy, const reference::ModelConfig& c, int64_t context, int64_t steps) {
  if (policy == "fit") return context + steps;
  if (policy == "config") return c.max_seq_len;
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(policy, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSV41_CHECK(used == policy.size() && v > 0, "--max-seq-len '", policy, "': want fit, config or a positive integer");
  return v;
}

int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  123 kB"
  }
  return -1;
}

// A dsv41::Error unless the logits are finite and not all zero (a state the step could not read
// would give NaN or nothing).
void check_logits(const std::vector<float>& logits, int64_t context, int64_t step) {
  bool nonzero = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    DSV41_CHECK(std::isfinite(logits[i]), "context ", context, " step ", step, ": logit ", i, " is ", logits[i],
                " (the synthetic state gave a non-finite step)");
    nonzero |= logits[i] != 0.0f;
  }
  DSV41_CHECK(!logits.empty() && nonzero, "context ", context, " step ", step, ": every logit is zero");
}

Point run_context(const Args& a, const reference::ModelConfig& base, const reference::checkpoint::ModelWeights& w,
                  const std::vector<int64_t>& map, int64_t context) {
  Point p;
  p.context = context;
  const int64_t steps = a.warmup + a.steps, positions = a.positions();
  reference::ModelConfig c = base;
  c.max_seq_len = static_cast<int>(max_seq_len_for(a.max_seq_len, base, context, positions));
  p.max_seq_len = c.max_seq_len;
  reference::validate(c, "the config at max_seq_len " + std::to_string(c.max_seq_len));
  bench::check_synthetic_context(c, context, positions);

  scenarios::runner::BackendModel bm(a.backend);
#if defined(DSV41_HAVE_CUDA)
  if (bm.device()) gpu::reset_device_alloc_peak();
#endif
  reference::model::Model& model = bm.build(c, w, map);
  const auto t0 = Clock::now();
  reference::model::ModelState state = bench::synthetic_state(model, context, a.seed);
  p.build_s = seconds_since(t0);
  p.bytes = bench::state_bytes(state);
  p.state_where = bm.device() ? "device" : "host";
#if defined(DSV41_HAVE_CUDA)
  if (bm.device()) p.device_alloc_after_state = static_cast<int64_t>(gpu::device_memory_stats().alloc_bytes);
  // DSV41_CUDA_OP_TIMES: the state's build is not charged to the last op it marked.
  if (const auto* cuda = dynamic_cast<const gpu::CudaOps*>(&model.ops())) cuda->time_mark("(state build)");
#endif

  // Tokens of the steps: their own stream (seed + 1), so the state's draws do not depend on --steps.
  std::mt19937_64 rng(a.seed + 1);
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  reference::model::StepOptions opt;
  opt.logits_only = !a.full_record;
#if defined(DSV41_HAVE_CUDA)
  gpu::HostSyncCounts sync0;
  gpu::UploadStagingStats staged0;
#endif
  for (int64_t s = 0; s < steps; ++s) {
#if defined(DSV41_HAVE_CUDA)
    if (s == a.warmup) {
      sync0 = gpu::host_sync_counts();
      staged0 = gpu::upload_staging_stats();
    }
#endif
    const auto s0 = Clock::now();
    std::vector<int64_t> ids(static_cast<size_t>(a.chunk));  // [chunk] token ids
    for (int64_t& id : ids) id = token(rng);
    const reference::model::StepRecord r = model.forward_chunk(state, ids, opt);
    const double ms = 1e3 * seconds_since(s0);
    check_logits(r.logits, context, s);
    if (s >= a.warmup) p.step_ms.push_back(ms);
  }
#if defined(DSV41_HAVE_CUDA)
  if (bm.device()) {
    const gpu::HostSyncCounts sync1 = gpu::host_sync_counts();
    const auto per_step = [&](int64_t n) { return static_cast<double>(n) / static_cast<double>(a.steps); };
    p.syncs = per_step(sync1.total() - sync0.total());
    p.syncs_d2h = per_step(sync1.d2h - sync0.d2h);
    p.syncs_h2d = per_step(sync1.h2d - sync0.h2d);
    p.syncs_device = per_step(sync1.device - sync0.device);
    p.staged_uploads = per_step(gpu::upload_staging_stats().staged - staged0.staged);
  }
#endif
  std::vector<double> sorted = p.step_ms;
  std::sort(sorted.begin(), sorted.end());
  p.median = quantile(sorted, 0.5);
  p.p10 = quantile(sorted, 0.1);
  p.p90 = quantile(sorted, 0.9);
  p.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size());
#if defined(DSV41_HAVE_CUDA)
  if (bm.device()) p.device_peak_alloc = static_cast<int64_t>(gpu::device_memory_stats().peak_alloc_bytes);
#endif
  p.peak_rss = peak_rss_bytes();
  return p;
}

// DSV41_CUDA_PRODUCTION_OPS as set ("unset": the default, every production op).
std::string production_ops_env() {
  const char* env = std::getenv("DSV41_CUDA_PRODUCTION_OPS");
  return env == nullptr ? "unset" : env;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// The median of the 4096 step, else of the first context's.
const Point& base_point(const std::vector<Point>& pts) {
  for (const Point& p : pts) {
    if (p.context == 4096) return p;
  }
  return pts.front();
}

void print_table(const std::vector<Point>& pts) {
  const Point& b = base_point(pts);
  std::printf("\n%9s %10s %10s %10s %10s %9s %11s %11s %11s %10s %11s\n", "context", "median ms", "p10 ms", "p90 ms",
              "mean ms", "ratio", "state MiB", "held MiB", "dev peak", "state s", "syncs/step");
  for (const Point& p : pts) {
    const std::string dev_peak =
        p.device_peak_alloc < 0 ? "-" : std::to_string(static_cast<int64_t>(mib(p.device_peak_alloc))) + " MiB";
    char syncs[32] = "-";
    if (p.syncs >= 0) std::snprintf(syncs, sizeof syncs, "%.1f", p.syncs);
    std::printf("%9lld %10.3f %10.3f %10.3f %10.3f %9.3f %11.1f %11.1f %11s %10.2f %11s\n", static_cast<long long>(p.context),
                p.median, p.p10, p.p90, p.mean, p.median / b.median, mib(p.bytes.allocated), mib(p.bytes.held),
                dev_peak.c_str(), p.build_s, syncs);
  }
  std::printf("(ratio: the median over the median at context %lld; state: allocated caches, rings and compressors, "
              "on the %s; held: their valid part; syncs/step: host synchronizations per timed step, "
              "gpu::host_sync_counts)\n",
              static_cast<long long>(b.context), pts.front().state_where.c_str());
}

nlohmann::json to_json(const Args& a, const reference::ModelConfig& c, const std::string& weights_desc,
                       const std::vector<Point>& pts) {
  const Point& b = base_point(pts);
  nlohmann::json j;
  j["bench"] = "decode_curve";
  j["backend"] = a.backend;
  j["config"] = a.config;
  j["config_hash"] = reference::config_hash(c);
  j["weights"] = weights_desc;
  j["seeds"] = {{"state", a.seed}, {"tokens", a.seed + 1}, {"weights", a.weight_seed}};
  j["steps"] = a.steps;
  j["warmup"] = a.warmup;
  j["max_seq_len_policy"] = a.max_seq_len;
  j["cuda_production_ops_env"] = production_ops_env();
  j["cuda_defer_checks_env"] = defer_checks_env();
  j["cuda_async_uploads_env"] = async_uploads_env();
  j["reference_threads"] = reference::reference_threads();
  j["ratio_base_context"] = b.context;
  nlohmann::json rows = nlohmann::json::array();
  for (const Point& p : pts) {
    rows.push_back({{"context", p.context}, {"max_seq_len", p.max_seq_len}, {"median_ms", p.median},
                    {"p10_ms", p.p10}, {"p90_ms", p.p90}, {"mean_ms", p.mean}, {"ratio", p.median / b.median},
                    {"step_ms", p.step_ms}, {"state_where", p.state_where},
                    {"state_allocated_bytes", p.bytes.allocated}, {"state_held_bytes", p.bytes.held},
                    {"state_host_metadata_bytes", p.bytes.host_metadata},
                    {"device_alloc_after_state_bytes", p.device_alloc_after_state},
                    {"device_peak_alloc_bytes", p.device_peak_alloc}, {"peak_rss_bytes", p.peak_rss},
                    {"state_build_s", p.build_s},
                    {"host_syncs_per_step", {{"total", p.syncs}, {"d2h", p.syncs_d2h}, {"h2d", p.syncs_h2d},
                                             {"device", p.syncs_device}}},
                    {"staged_uploads_per_step", p.staged_uploads}});
  }
  j["points"] = rows;
  const auto at = [&](int64_t ctx) -> const Point* {
    for (const Point& p : pts) {
      if (p.context == ctx) return &p;
    }
    return nullptr;
  };
  if (at(4096) && at(1048576)) {
    const double r = at(1048576)->median / at(4096)->median;
    j["goal"] = {{"what", "median step at 1048576 <= 1.5 x the step at 4096"}, {"ratio", r}, {"met", r <= 1.5}};
  }
  return j;
}

std::string to_csv(const std::vector<Point>& pts) {
  const Point& b = base_point(pts);
  std::ostringstream o;
  o << "context,max_seq_len,median_ms,p10_ms,p90_ms,mean_ms,ratio,state_where,state_allocated_bytes,"
       "state_held_bytes,state_host_metadata_bytes,device_alloc_after_state_bytes,device_peak_alloc_bytes,"
       "peak_rss_bytes,state_build_s,host_syncs_per_step\n";
  for (const Point& p : pts) {
    o << p.context << ',' << p.max_seq_len << ',' << p.median << ',' << p.p10 << ',' << p.p90 << ',' << p.mean << ','
      << p.median / b.median << ',' << p.state_where << ',' << p.bytes.allocated << ',' << p.bytes.held << ','
      << p.bytes.host_metadata << ',' << p.device_alloc_after_state << ',' << p.device_peak_alloc << ','
      << p.peak_rss << ',' << p.build_s << ',' << p.syncs << '\n';
  }
  return o.str();
}

void write_outputs(const std::string& prefix, const std::string& json, const std::string& csv) {
  output::write_file_atomically(prefix + ".json", "decode curve JSON", json.data(), json.size());
  output::write_file_atomically(prefix + ".csv", "decode curve CSV", csv.data(), csv.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode step time against context on a backend, from synthetic states (bench/decode_curve.cc)"};
  Args a;
  app.add_option("--backend", a.backend, "ref, cuda-exact, cuda (production), ref-order:<variant>");
  app.add_option("--config", a.config, "config.json path or preset (default tiny: golden/oracle/config.json)");
  app.add_option("--weights", a.weights, "weights file (default: the oracle's for tiny, else generated)");
  app.add_option("--weight-seed", a.weight_seed, "seed of generated weights (printed)");
  app.add_option("--contexts", a.contexts, "comma-separated contexts, ascending");
  app.add_option("--steps", a.steps, "timed decode steps per context")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--chunk", a.chunk, "tokens per step (default 1; 4096: the million run's last prefill chunk)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_flag("--full-record", a.full_record, "return the step's selections too (a sampled replay's step)");
  app.add_option("--seed", a.seed, "seed of the synthetic state (the step tokens: seed + 1); printed");
  app.add_option("--max-seq-len", a.max_seq_len, "fit (context + steps), config, or N");
  app.add_option("--threads", a.threads, "reference threads (default: all cores)");
  app.add_option("--out", a.out, "write PREFIX.csv and PREFIX.json");
  CLI11_PARSE(app, argc, argv);
  try {
    scenarios::runner::BackendModel::validate(a.backend, "--backend", /*planted_defects=*/false);
    const std::vector<int64_t> contexts = parse_contexts(a.contexts);
    if (a.threads > 0) reference::set_reference_threads(a.threads);
    const reference::ModelConfig c = reference::load_config(a.config);
    // Every context checked before any work: a bad one fails in a second, not after an hour.
    for (int64_t ctx : contexts) {
      reference::ModelConfig at = c;
      at.max_seq_len = static_cast<int>(max_seq_len_for(a.max_seq_len, c, ctx, a.positions()));
      bench::check_synthetic_context(at, ctx, a.positions());
    }
    std::string weights = a.weights, weights_desc;
    if (weights.empty() && a.config == "tiny") weights = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/weights.safetensors";
    reference::checkpoint::ModelWeights w;
    if (!weights.empty()) {
      w = reference::checkpoint::ModelWeights::load(weights, c);
      weights_desc = "file:" + weights;
    } else {
      w = reference::checkpoint::ModelWeights::load(
          reference::checkpoint::safetensors::SafetensorsFile::from_entries(
              "generated weights", reference::checkpoint::generate_weights(c, a.weight_seed)),
          c);
      weights_desc = "generated:seed=" + std::to_string(a.weight_seed);
    }
    const std::vector<int64_t> map = reference::model::default_token_map(c);
    std::printf("decode curve: backend %s, config %s (hash %s), weights %s, state seed %llu (--seed), tokens seed %llu, "
                "%lld warm-up + %lld timed steps per context, max_seq_len %s, reference threads %d\n",
                a.backend.c_str(), a.config.c_str(), reference::config_hash(c).c_str(), weights_desc.c_str(),
                static_cast<unsigned long long>(a.seed), static_cast<unsigned long long>(a.seed + 1),
                static_cast<long long>(a.warmup), static_cast<long long>(a.steps), a.max_seq_len.c_str(),
                reference::reference_threads());
    std::printf("DSV41_CUDA_PRODUCTION_OPS=%s (the cuda backend's production kernels; docs/cuda.md), "
                "DSV41_CUDA_DEFER_CHECKS=%s, DSV41_CUDA_ASYNC_UPLOADS=%s\n",
                production_ops_env().c_str(), defer_checks_env().c_str(), async_uploads_env().c_str());
    std::fflush(stdout);

    std::vector<Point> pts;
    for (int64_t ctx : contexts) {
      pts.push_back(run_context(a, c, w, map, ctx));
      const Point& p = pts.back();
      std::printf("context %lld: state built in %.2f s (%.1f MiB on the %s), step median %.3f ms (p10 %.3f, p90 %.3f)",
                  static_cast<long long>(ctx), p.build_s, mib(p.bytes.allocated), p.state_where.c_str(), p.median,
                  p.p10, p.p90);
      if (p.syncs >= 0) {
        std::printf(", host syncs per step %.1f (d2h %.1f, h2d %.1f, device %.1f; %.1f uploads staged)", p.syncs,
                    p.syncs_d2h, p.syncs_h2d, p.syncs_device, p.staged_uploads);
      }
      std::printf("\n");
      std::fflush(stdout);
      if (!a.out.empty()) write_outputs(a.out, to_json(a, c, weights_desc, pts).dump(2) + "\n", to_csv(pts));
    }
    print_table(pts);
    const nlohmann::json j = to_json(a, c, weights_desc, pts);
    if (j.contains("goal")) {
      std::printf("goal: the 1048576 step <= 1.5x the 4096 step: %s (%.3fx)\n",
                  j["goal"]["met"].get<bool>() ? "met" : "NOT met", j["goal"]["ratio"].get<double>());
    }
    if (!a.out.empty()) std::printf("wrote %s.csv and %s.json\n", a.out.c_str(), a.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41_decode_curve: %s\n", e.what());
    return 2;
  }
}
