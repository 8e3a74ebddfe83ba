// scenarios/selftest/small_zoo.cc: the small-bug zoo, its runs and its table (small_zoo.h).
#include "scenarios/selftest/small_zoo.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <unistd.h>

#include "base/error.h"
#include "reference/model/model.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/defects/small_bug_ops.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/runner/backend.h"
#include "scenarios/selftest/bug_zoo.h"

namespace dsv41::scenarios::selftest {
namespace {

namespace fs = std::filesystem;
using defects::BlockNorm;
using defects::CacheByteDefect;
using defects::RopeRows;
using formats::CacheFormat;
using OpsFactory = SmallBug::OpsFactory;
using reference::seam::Ops;

SmallBug ops_bug(std::string name, std::string description, std::string origin, std::string how, std::string component,
                 int layer, int64_t step, bool ci, OpsFactory make) {
  SmallBug b;
  b.name = std::move(name);
  b.description = std::move(description);
  b.origin = std::move(origin);
  b.how = "ops " + how;
  b.expected_component = std::move(component);
  b.expected_layer = layer;
  b.expected_step = step;
  b.ci = ci;
  b.make_ops = std::move(make);
  return b;
}

// A bug of the zoo (bug_zoo.h) that is small: its ops, origin and location as the zoo has them.
SmallBug from_zoo(const std::string& name, const std::string& how, bool ci) {
  const ZooBug& z = zoo_bug(name);
  DSV41_CHECK(z.kind == ZooKind::kOps, "small zoo: zoo bug '", name, "' is not an ops bug");
  SmallBug b = ops_bug(z.name, z.description, z.origin + " (the zoo's)", how, z.expected_component, z.expected_layer,
                       z.expected_step, ci, [mk = z.make_ops](const reference::ModelConfig& c, const Ops&) { return mk(c); });
  b.reference_only = true;  // the zoo's bugs recompute their op on the reference
  return b;
}

// Whether a root cause names where `b` was planted (SmallBug: the expected place, or for an
// every-layer bug one of the op's outputs at any layer, in the first step the bug changes).
bool located_where_planted(const SmallBug& b, const conform::RootCause& rc) {
  if (rc.step != b.expected_step) return false;
  if (rc.component == b.expected_component && rc.layer == b.expected_layer) return true;
  if (!b.every_layer) return false;
  return rc.component == b.expected_component ||
         std::find(b.also_components.begin(), b.also_components.end(), rc.component) != b.also_components.end();
}

// One row of a float component at (layer, step) times factor (mutants.h :x<factor>).
SmallBug row_bug(const std::string& name, const std::string& component, int layer, int64_t step, const char* factor,
                 std::string origin, bool ci) {
  SmallBug b;
  b.name = name;
  b.mutation = component + ":L" + std::to_string(layer) + ":S" + std::to_string(step) + ":x" + factor;
  b.description = "the last row of " + component + " at layer " + std::to_string(layer) + ", step " +
                  std::to_string(step) + " times " + factor;
  b.origin = std::move(origin);
  b.how = "mutant " + b.mutation;
  b.expected_component = component;
  b.expected_layer = layer;
  b.expected_step = step;
  b.ci = ci;
  return b;
}

std::vector<SmallBug> build_small_zoo() {
  std::vector<SmallBug> z;
  // Attention.
  z.push_back(ops_bug("softmax_scale_1pct", "layer 2's attention softmax scale x1.01 (head_dim^-0.5 off by 1%)",
                      "a scale constant folded into a fused attention kernel (sm_scale) computed from another dim or in "
                      "low precision; semantics.md: softmax_scale = head_dim^-0.5",
                      "sparse_attn (layer 2)", "attn_out", 2, 0, true,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_softmax_scale_ops(2, 1.01, base); }));
  z.push_back(ops_bug("rope_query_position_plus_one", "layer 0's query RoPE at position + 1",
                      "ports.md §2.8 (mlx-lm#1189: RoPE wrong per layer type); position ids counted from 1 on one path",
                      "rope_rows (layer 0 queries)", "attn_out", 0, 0, false, [](const reference::ModelConfig& c, const Ops& base) {
                        return defects::make_rope_shift_ops(c, 0, RopeRows::kQuery, 1, base);
                      }));
  z.push_back(ops_bug("rope_window_kv_position_plus_one", "layer 1's window-KV RoPE at position + 1",
                      "ports.md §2.8 (mlx-lm#1189); the decode position taken after the cache append",
                      "rope_rows (layer 1 window KV)", "cache.window_kv", 1, 0, false, [](const reference::ModelConfig& c, const Ops& base) {
                        return defects::make_rope_shift_ops(c, 1, RopeRows::kWindowKv, 1, base);
                      }));
  z.push_back(from_zoo("sink_in_numerator", "sparse_attn (every layer)", true));
  // Norms.
  z.push_back(ops_bug("norm_bf16_statistic", "layer 3's attn_norm with its rsqrt(mean(x^2) + eps) rounded to bf16",
                      "a norm kernel that keeps its statistic in the activations' dtype (the official RMSNorm computes "
                      "in fp32, semantics.md; HF's RMSNorm casts to fp32 for this reason)",
                      "rms_norm (layer 3 attn_norm)", "attn_in", 3, 0, true,
                      [](const reference::ModelConfig&, const Ops& base) {
                        return defects::make_norm_bf16_statistic_ops(3, BlockNorm::kAttnNorm, base);
                      }));
  // mHC.
  z.push_back(from_zoo("sinkhorn_one_short", "hc_mixes (every layer)", false));
  z.back().every_layer = true;  // hc_mixes writes both combs of every layer
  z.back().also_components = {"hc_attn_comb", "hc_ffn_comb"};
  // MoE.
  z.push_back(ops_bug("routed_expert_1pct", "expert 1's output x1.01 at layer 3 (routed in every step)",
                      "one expert's dequantisation or routing weight off by 1% (a grouped GEMM reading a per-expert "
                      "scale wrong)",
                      "moe_experts (layer 3, expert 1)", "ffn_out", 3, 0, true,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_expert_scale_ops(3, 1, 1.01, base); }));
  z.push_back(ops_bug("shared_expert_1pct", "the shared expert's output x1.01 at layer 5",
                      "the shared expert added with a scale (semantics.md: the shared expert has no weight; "
                      "ports scale it with route_scale or a TP reduction factor)",
                      "moe_experts (layer 5, shared expert)", "ffn_out", 5, 0, false,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_expert_scale_ops(5, -1, 1.01, base); }));
  // Engram.
  z.push_back(ops_bug("engram_gate_1pct", "layer 4's Engram gates x1.01",
                      "the gate's sigmoid(sign(dot) sqrt|dot|) (semantics.md) fused with a slightly wrong scale "
                      "(dim^-0.5 or a norm eps)",
                      "engram_gate_residual (layer 4)", "engram_out", 4, 0, false,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_engram_gate_scale_ops(4, 1.01, base); }));
  // Indexer and compressor.
  z.push_back(ops_bug("index_weight_scale_1pct", "layer 4's indexer weights scale (Di^-0.5 Hi^-0.5) x1.01",
                      "ports.md §2.1-2.2 (the indexer's constants and offsets are where sglang shipped bugs); a scale "
                      "constant stored in bf16",
                      "index_weights (layer 4)", "index_scores", 4, 0, true,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_index_weight_scale_ops(4, 1.01, base); }));
  z.push_back(ops_bug("compressor_score_1pct", "layer 2's compressor gate scores x1.01 (the pooling softmax's temperature)",
                      "ports.md §2.6 (vllm-ascend fork #76: the compressor); a score scale fused into wgate. Planted in the "
                      "compressor, whose own state (its pending kv and score rows) holds the scaled scores",
                      "compress (layer 2)", "cache.compressor", 2, 0, false,
                      [](const reference::ModelConfig&, const Ops& base) { return defects::make_compressor_score_scale_ops(2, 1.01, base); }));
  z.push_back(from_zoo("newest_block_not_pinned", "candidate_blocks (layer 6)", false));
  // Cache bytes: one byte of one entry, once.
  z.push_back(ops_bug("compressed_kv_scale_byte", "one E4M3 block scale of layer 4's newest compressed-KV entry one code up",
                      "ports.md §2.5 (vllm#40991: cache scales misplaced); a scale rounded another way in one block",
                      "write_entries (layer 4, step 0)", "cache.compressed_kv", 4, 0, true,
                      [](const reference::ModelConfig&, const Ops& base) {
                        return defects::make_cache_byte_ops(4, CacheFormat::kCompressedKvFp4, CacheByteDefect::kScaleByte, base);
                      }));
  z.push_back(ops_bug("window_kv_scale_byte", "one E8M0 block scale of layer 0's newest window-KV entry one code up (x2)",
                      "ports.md §2.5; formats/qdq.h: E8M0 scales are a ceil (a floor in one block)",
                      "write_entries (layer 0, step 0)", "cache.window_kv", 0, 0, false, [](const reference::ModelConfig&, const Ops& base) {
                        return defects::make_cache_byte_ops(0, CacheFormat::kWindowKvFp8, CacheByteDefect::kScaleByte, base);
                      }));
  z.push_back(ops_bug("index_keys_code_nibble", "one E2M1 code of layer 2's newest index-key entry one step off",
                      "formats/minifloat.h: E2M1 round-to-nearest-even; x/s against x*(1/s) moves a code at a boundary",
                      "write_entries (layer 2, step 0)", "cache.index_keys", 2, 0, true, [](const reference::ModelConfig&, const Ops& base) {
                        return defects::make_cache_byte_ops(2, CacheFormat::kIndexKeysFp4, CacheByteDefect::kCodeNibble, base);
                      }));
  // One row of a float component (the sensitivity sweep's mutant, docs/selftest.md "Sensitivity").
  const std::string row_origin = "one token's row with a gain error (a tile or a tail of a kernel scaled wrong)";
  z.push_back(row_bug("attn_out_row_1pct", "attn_out", 2, 1, "1.01", row_origin, false));
  z.push_back(row_bug("ffn_out_row_1pct", "ffn_out", 2, 1, "1.01", row_origin, false));
  z.push_back(row_bug("hc_attn_post_row_1pct", "hc_attn_post", 2, 1, "1.01", row_origin, false));
  z.push_back(row_bug("in_pre_row_0p1pct", "in_pre", 2, 1, "1.001", row_origin, false));
  z.push_back(row_bug("hc_ffn_comb_row_0p1pct", "hc_ffn_comb", 2, 1, "1.001", row_origin, true));
  return z;
}

// How near a checked row came to its bound (1: at it): value / bound, or for a higher-is-better
// metric (1 - value) / (1 - bound).
double bound_ratio(const reports::MetricRow& r) {
  const reports::Tolerance& t = *r.tolerance;
  if (t.higher_is_better) return t.bound < 1 ? (1 - r.value) / (1 - t.bound) : (r.value < t.bound ? 2.0 : 0.0);
  return t.bound > 0 ? r.value / t.bound : (r.value > 0 ? std::numeric_limits<double>::infinity() : 0.0);
}

// The checked row at (component, layer, step) nearest its bound, over every comparison; when no row
// there is checked (a component the claim leaves unchecked), the measured fraction furthest from 1.
std::string nearest_bound(const reports::RunReport& report, const std::string& component, int layer, int64_t step) {
  const reports::MetricRow* best = nullptr;
  const reports::MetricRow* measured = nullptr;
  const reports::Comparison* where = nullptr;
  double worst = -1;
  for (const reports::ScenarioResult& s : report.scenarios) {
    for (const reports::Comparison& cmp : s.comparisons) {
      for (const reports::MetricRow& r : cmp.rows) {
        if (r.component != component || r.layer != layer || r.step != step) continue;
        if (!r.tolerance) {
          const bool frac = r.metric.size() > 5 && r.metric.compare(r.metric.size() - 5, 5, "_frac") == 0;
          if (frac && (measured == nullptr || r.value < measured->value)) measured = &r;
          continue;
        }
        const double q = bound_ratio(r);
        if (q > worst) worst = q, best = &r, where = &cmp;
      }
    }
  }
  char line[256];
  if (best == nullptr) {
    if (measured == nullptr) return "";
    std::snprintf(line, sizeof line, "%s %.3g (measured, not checked)", measured->metric.c_str(), measured->value);
    return line;
  }
  std::snprintf(line, sizeof line, "%s %.3g / %.3g (%s)", best->metric.c_str(), best->value, best->tolerance->bound,
                where->mode.c_str());
  return line;
}

}  // namespace

const std::vector<SmallBug>& small_zoo() {
  static const std::vector<SmallBug> z = build_small_zoo();
  return z;
}

const SmallBug& small_bug(const std::string& name) {
  std::string names;
  for (const SmallBug& b : small_zoo()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  DSV41_FAIL("unknown small bug '", name, "' (the small-bug zoo: ", names, ")");
}

SmallZooResult run_small_zoo(const SmallZooOptions& o, std::ostream& progress) {
  const SelftestModel m = load_selftest_model(o.config, o.weights);
  const std::vector<int64_t> token_map = reference::model::default_token_map(m.config);
  // The backend the bugs are planted in, and the accumulation its claim admits.
  runner::BackendOps base_parts;
  if (!o.base.empty()) {
    base_parts = runner::make_backend_ops(o.base);
    DSV41_CHECK(!base_parts.mutation && base_parts.precision == reference::CachePrecision::kPacked &&
                    runner::backend_claim(o.base) != runner::Claim::kApproximate,
                "--base '", o.base, "': a backend with a planted defect or its own cache precision is not a base");
  }
  const Ops& base = base_parts.ops ? *base_parts.ops : reference::seam::reference_ops();
  const std::string accumulation = !o.accumulation.empty() || o.base.empty()
                                       ? o.accumulation
                                       : judge::name(runner::backend_accumulation(o.base));
  std::vector<const SmallBug*> bugs;
  for (const std::string& n : o.bugs) bugs.push_back(&small_bug(n));
  if (o.bugs.empty()) {
    for (const SmallBug& b : small_zoo()) {
      if (!o.ci || b.ci) bugs.push_back(&b);
    }
  }
  const std::string root =
      o.dir.empty() ? (fs::temp_directory_path() / ("dsv41_small_bugs_" + std::to_string(::getpid()))).string() : o.dir;
  fs::create_directories(root);
  const std::string clean_dir = root + "/clean";

  SmallZooResult result;
  auto run_one = [&](const SmallBug* bug) {
    SmallZooRow row;
    row.bug = bug ? bug->name : "clean";
    row.how = bug ? bug->how + (bug->reference_only && !o.base.empty() ? " (on the reference)" : "") : "-";
    row.expected = bug ? zoo_location(bug->expected_component, bug->expected_layer, bug->expected_step) : "no alarm";
    if (bug && bug->every_layer) {
      row.expected += " (every layer: or " + bug->expected_component;
      for (const std::string& c : bug->also_components) row.expected += c == bug->expected_component ? "" : ", " + c;
      row.expected += " at any layer, step " + std::to_string(bug->expected_step) + ")";
    }
    const std::string dir = bug ? root + "/" + bug->name : clean_dir;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      fs::remove_all(dir);
      std::unique_ptr<reference::seam::Ops> ops = bug && bug->make_ops ? bug->make_ops(m.config, base) : nullptr;
      std::optional<defects::Mutation> mutation;
      if (bug && !bug->mutation.empty()) mutation = defects::parse_mutation(bug->mutation);
      bool mutated = false;
      DumpDefects d;
      d.mutation = mutation ? &*mutation : nullptr;
      d.fired = &mutated;
      write_scenario_dump(dir, m.config, m.weights_path, m.weights, zoo_scenario(),
                          ops ? *ops : base,
                          "dsv41 selftest --small-bugs" + std::string(bug ? " --bugs " + bug->name : " (clean)"), d);
      row.fired = bug != nullptr && (!mutation || mutated) && dumps_differ(clean_dir, dir);
      conform::ConformOptions co;
      co.name = row.bug;
      co.order_variant = true;
      co.accumulation = accumulation;
      const reports::RunReport report = conform::conform(conform::read_port_dump(dir), m.weights, token_map, co);
      row.conform_exit = conform::conform_exit_code(report);
      row.flagged = row.conform_exit == 1;
      if (const std::optional<conform::RootCause> rc = conform::root_cause(report)) {
        std::ostringstream w;
        w << zoo_location(rc->component, rc->layer, rc->step) << " (" << rc->metric << " " << rc->value << ")";
        row.located_at = w.str();
        row.detail = rc->detail;
        row.located = bug && located_where_planted(*bug, *rc);
      }
      if (bug) row.at_planted = nearest_bound(report, bug->expected_component, bug->expected_layer, bug->expected_step);
      if (!bug) {
        row.verdict = row.conform_exit == 0 ? "ok" : "ALARM";
      } else if (!row.fired) {
        row.verdict = "NOT-FIRED";
      } else {
        row.verdict = !row.flagged ? "MISSED" : row.located ? "ok" : "MISLOCATED";
      }
    } catch (const std::exception& e) {
      row.verdict = "ERROR";
      row.detail = e.what();
      result.error = true;
    }
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (bug && !o.keep) fs::remove_all(dir);
    if (o.progress) {
      char line[768];
      std::snprintf(line, sizeof line, "selftest --small-bugs: %-34s %-10s %5.1f s  root cause %s; at the planted %s\n",
                    row.bug.c_str(), row.verdict.c_str(), row.seconds, row.located_at.empty() ? "-" : row.located_at.c_str(),
                    row.at_planted.empty() ? "-" : row.at_planted.c_str());
      progress << line << std::flush;
    }
    result.rows.push_back(std::move(row));
  };
  run_one(nullptr);  // the clean reference first: "fired" compares against its dump
  for (const SmallBug* b : bugs) run_one(b);
  if (!o.keep) fs::remove_all(clean_dir);
  if (!o.keep && o.dir.empty()) fs::remove_all(root);
  return result;
}

std::string format_small_zoo_table(const SmallZooResult& r) {
  std::ostringstream out;
  out << "| bug | how | planted at | fired | flagged | located where planted | root cause (metric value) | at the planted "
         "component: nearest checked row (value / bound) | verdict | s |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const SmallZooRow& row : r.rows) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", row.seconds);
    const bool clean = row.bug == "clean";
    out << "| " << row.bug << " | " << row.how << " | " << row.expected << " | " << (clean ? "-" : row.fired ? "yes" : "no")
        << " | " << (row.flagged ? "yes" : "no") << " (exit " << row.conform_exit << ") | "
        << (clean ? "-" : row.located ? "yes" : "no") << " | " << (row.located_at.empty() ? "-" : row.located_at) << " | "
        << (row.at_planted.empty() ? "-" : row.at_planted) << " | " << row.verdict << " | " << secs << " |\n";
  }
  const int bugs = static_cast<int>(r.rows.size()) - (!r.rows.empty() && r.rows.front().bug == "clean");
  const double f = small_zoo_located_fraction(r);
  char summary[128];
  std::snprintf(summary, sizeof summary, "\nlocated %.0f of %d small bugs (%.0f%%) under order-variant\n", f * bugs, bugs,
                100.0 * f);
  out << summary;
  return out.str();
}

double small_zoo_located_fraction(const SmallZooResult& r) {
  int bugs = 0, located = 0;
  for (const SmallZooRow& row : r.rows) {
    if (row.bug == "clean") continue;
    ++bugs;
    located += row.verdict == "ok";
  }
  return bugs ? static_cast<double>(located) / bugs : 1.0;
}

int small_zoo_exit_code(const SmallZooResult& r, double goal) {
  if (r.error) return 2;
  for (const SmallZooRow& row : r.rows) {
    if (row.verdict == "ALARM" || row.verdict == "NOT-FIRED") return 1;
  }
  return small_zoo_located_fraction(r) >= goal ? 0 : 1;
}

}  // namespace dsv41::scenarios::selftest
