// scenarios/runner/runner_plan.cc: plan_scenario, what a scenario will run, checked before any work
// (scenarios/runner/runner.h).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/compare.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/runner/replay_plan.h"
#include "scenarios/runner/runner.h"
#include "scenarios/runner/verdict.h"

namespace dsv41::scenarios::runner {

// Refuses a scenario one of whose sessions would pass max_seq_len, before any token is planned or
// step run: its prompts, decode steps and speculative rounds (each at least one token) add up.
static void check_session_lengths(const Scenario& sc, const reference::ModelConfig& c) {
  const auto segments_length = [&](const std::vector<TokenSegment>& segs) {
    int64_t n = 0;
    for (const TokenSegment& seg : segs) {
      if (seg.kind == TokenSegment::kLiteral) n += static_cast<int64_t>(seg.ids.size());
      if (seg.kind == TokenSegment::kRandom) n += seg.count;
      if (seg.kind == TokenSegment::kSpan || seg.kind == TokenSegment::kNear) {
        for (const TokenSegment& part : sc.spans.at(seg.span)) {
          n += part.kind == TokenSegment::kLiteral ? static_cast<int64_t>(part.ids.size()) : part.count;
        }
      }
    }
    return n;
  };
  std::map<std::string, int64_t> length;
  for (size_t e = 0; e < sc.events.size(); ++e) {
    const Event& ev = sc.events[e];
    int64_t& n = length[ev.session];
    if (ev.kind == Event::kPrompt) n += segments_length(ev.segments);
    if (ev.kind == Event::kDecode) n += ev.decode;
    if (ev.kind == Event::kSpeculate) n += ev.speculate.rounds;
    DSV41_CHECK(n <= c.max_seq_len, "scenario '", sc.name, "': events[", e, "]: session '", ev.session,
                "' reaches at least ", n, " tokens, past max_seq_len = ", c.max_seq_len, " of the config");
  }
}

// Sampled replay (scenarios/runner/replay_plan.h): --replay / --replay-seed override the pairs' specs;
// a replaying pair compares teacher-forced steps only.
static void plan_replay(const Scenario& sc, const RunOptions& opt, ScenarioPlan& plan) {
  bool any = false;
  for (Pair& p : plan.pairs) {
    if (opt.replay_extra) {
      DSV41_CHECK(*opt.replay_extra >= 0, "--replay: the number of extra sampled steps must be >= 0, got ",
                  *opt.replay_extra);
      if (!p.replay) p.replay = ReplaySpec{};
      p.replay->extra = *opt.replay_extra;
    }
    if (opt.replay_seed && p.replay) p.replay->seed = *opt.replay_seed;
    any = any || p.replay.has_value();
    std::optional<ReplaySample> sample;
    if (p.replay) {
      DSV41_CHECK(std::find(plan.modes.begin(), plan.modes.end(), "free-running") == plan.modes.end(), "scenario '",
                  sc.name, "': pair ", p.a.text(), " vs ", p.b.text(), ": sampled replay starts side B from side A's "
                  "state at each sampled step and forces A's values: it compares teacher-forced steps only "
                  "(--mode teacher-forced)");
      DSV41_CHECK(!p.a.plain && !p.b.plain, "scenario '", sc.name, "': pair ", p.a.text(), " vs ", p.b.text(),
                  ": sampled replay needs the same steps on both sides (no /plain side)");
      sample = sample_replay_steps(sc, plan.tokens, *p.replay);
    }
    plan.replay.push_back(sample);
  }
  DSV41_CHECK(!opt.replay_seed || any, "--replay-seed: scenario '", sc.name, "' has no pair that replays sampled "
              "steps (give --replay K, or a pair's \"replay\")");
}

// The largest [T, N] fp32 score matrix of a prompt step (N: the keys the last row reaches in the
// index layer of the smallest ratio).
static void largest_scores(const Scenario& sc, const reference::ModelConfig& c, ScenarioPlan& plan) {
  int ratio = 0;
  for (int l : c.index_source_layers) {
    const int r = c.compress_ratios[static_cast<size_t>(l)];
    if (r > 0 && (ratio == 0 || r < ratio)) ratio = r;
  }
  if (ratio == 0) return;
  std::map<std::string, int64_t> pos;
  int64_t step = 0;
  const auto take = [&](int64_t& p, int64_t t) {
    const int64_t bytes = t * ((p + t) / ratio) * static_cast<int64_t>(sizeof(float));
    if (bytes > plan.largest_scores_bytes) {
      plan.largest_scores_bytes = bytes;
      plan.largest_scores_step = step;
    }
    p += t;
    ++step;
  };
  for (size_t e = 0; e < sc.events.size(); ++e) {
    const Event& ev = sc.events[e];
    int64_t& p = pos[ev.session];
    if (ev.kind == Event::kPrompt) {
      const int64_t n = static_cast<int64_t>(plan.tokens.prompts[e].size()), chunk = ev.chunk > 0 ? ev.chunk : n;
      for (int64_t first = 0; first < n; first += chunk) take(p, std::min(chunk, n - first));
    } else if (ev.kind == Event::kDecode) {
      for (int64_t i = 0; i < ev.decode; ++i) take(p, 1);
    } else if (ev.kind == Event::kSpeculate) {
      for (int64_t i = 0; i < ev.speculate.rounds; ++i) take(p, 1);  // (a verify step is a few rows: small)
    } else {
      ++step;
    }
  }
}

ScenarioPlan plan_scenario(const Scenario& sc, const reference::ModelConfig& c, const RunOptions& opt) {
  ScenarioPlan plan;
  check_session_lengths(sc, c);
  plan.tokens = plan_tokens(sc, c.vocab_size);
  plan.pairs = sc.pairs;
  if (!opt.sides.empty()) {
    DSV41_CHECK(opt.sides.size() == 2, "--sides: expected two sides A,B, got ", opt.sides.size());
    Pair p;
    p.a = parse_side(opt.sides[0]);
    p.b = parse_side(opt.sides[1]);
    p.expect = default_expectation(p.a, p.b, sc, &p.why);
    // A pair the scenario declares keeps its declared expectation.
    for (const Pair& q : sc.pairs) {
      if (q.a.text() == p.a.text() && q.b.text() == p.b.text()) p = q;
    }
    // A scenario that samples its steps (a scale scenario, docs/scale.md) samples them whatever the
    // sides: its size is the scenario's, and a full comparison of every step would capture and
    // compare the [chunk, keys] index scores of every step on the host.
    for (const Pair& q : sc.pairs) {
      if (!p.replay && q.replay) p.replay = q.replay;
    }
    plan.pairs = {p};
  }
  DSV41_CHECK(!plan.pairs.empty(), "scenario '", sc.name, "' declares no pairs: give --sides A,B");
  for (const Pair& p : plan.pairs) {
    for (const Side* side : {&p.a, &p.b}) {
      DSV41_CHECK(side->path != CachePath::kDecoder || side->decoder_rows >= c.window_size, "scenario '", sc.name,
                  "': side '", side->text(), "': decoder replay needs at least window_size = ", c.window_size,
                  " rows (docs/sessions.md: R = W + the speculative block), else the later layers' rings keep holes");
      if (const std::optional<defects::Mutation> m = backend_mutation(side->backend)) {
        DSV41_CHECK(m->layer < c.n_layers, "scenario '", sc.name, "': side '", side->text(), "': layer ", m->layer,
                    " is not a layer of this model (0 .. ", c.n_layers - 1, ")");
      }
    }
  }
  plan.modes = opt.modes.empty() ? sc.modes : opt.modes;
  for (const std::string& m : plan.modes) {
    DSV41_CHECK(m == "free-running" || m == "teacher-forced", "mode '", m, "': not free-running or teacher-forced");
  }
  for (const Event& e : sc.events) {
    if (e.kind != Event::kSpeculate) continue;
    DSV41_CHECK(e.speculate.drafter != SpeculateSpec::kDSpark || c.n_mtp_layers > 0, "scenario '", sc.name,
                "': a speculate event with dspark drafts needs DSpark blocks, the config has n_mtp_layers = 0 (use "
                "\"drafts\": \"lookahead:N\")");
    for (const Pair& p : plan.pairs) {
      const bool plain = p.a.plain || p.b.plain;
      DSV41_CHECK(!plain || std::find(plan.modes.begin(), plan.modes.end(), "teacher-forced") == plan.modes.end(),
                  "scenario '", sc.name, "': pair ", p.a.text(), " vs ", p.b.text(), ": teacher forcing needs the same "
                  "steps on both sides, and a plain side decodes a speculative round one token at a time: run it "
                  "free-running (--mode free-running)");
      DSV41_CHECK(!plain || e.speculate.temperature == 0, "scenario '", sc.name, "': pair ", p.a.text(), " vs ",
                  p.b.text(), ": a plain side decodes greedily, and speculative sampling preserves the target's "
                  "distribution, not its tokens: compare plain sides at temperature 0");
    }
  }
  for (const judge::ToleranceRule& r : sc.tolerances) {
    const std::vector<std::string>& metrics = known_metrics();
    DSV41_CHECK(std::find(metrics.begin(), metrics.end(), r.metric) != metrics.end(), "scenario '", sc.name,
                "': tolerance rule for '", r.component, "': unknown metric '", r.metric, "' (docs/scenarios.md lists them)");
    const std::string& pat = r.component;
    bool known = pat == "*";
    for (const std::string& comp : known_components()) {
      known = known || comp == pat ||
              (!pat.empty() && pat.back() == '*' && comp.rfind(pat.substr(0, pat.size() - 1), 0) == 0);
    }
    DSV41_CHECK(known, "scenario '", sc.name, "': tolerance rule component '", pat,
                "' matches no component (docs/scenarios.md lists them)");
  }
  plan.rules = sc.tolerances;
  plan.explicit_rules = sc.tolerances;
  if (sc.default_tolerances) {
    const std::vector<judge::ToleranceRule> defaults = default_tolerance_rules();
    plan.rules.insert(plan.rules.end(), defaults.begin(), defaults.end());
  }
  plan_replay(sc, opt, plan);
  largest_scores(sc, c, plan);
  std::set<std::string> sessions;
  for (const Event& e : sc.events) sessions.insert(e.session);
  plan.sessions = static_cast<int>(sessions.size());
  return plan;
}

}  // namespace dsv41::scenarios::runner
