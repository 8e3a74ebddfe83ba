#include "scenarios/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "formats/error.h"
#include "scenarios/capture.h"
#include "scenarios/compare.h"
#include "scenarios/keep.h"
#include "reference/sampling.h"
#include "scenarios/mutants.h"
#include "scenarios/rounds.h"
#include "scenarios/verdict.h"

namespace dsv41::scenarios {
namespace {

using reports::Comparison;
using reports::MetricRow;
using reports::ScenarioResult;
using reports::StepInfo;
using reports::Verdict;

int64_t argmax(const std::vector<float>& v) {
  DSV41_CHECK(!v.empty(), "decode: side A produced no logits to take the next token from");
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int64_t>(best);
}

// One side of a comparison: its backend(s) and sessions.
class SideRunner {
 public:
  SideRunner(Side side, const BackendResources& r) : side_(std::move(side)), resources_(r) {}

  Backend& backend(const std::string& session) {
    const std::string key = side_.path == CachePath::kAlone ? session : std::string();
    auto it = backends_.find(key);
    if (it == backends_.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      it = backends_.emplace(key, make_backend(side_.backend, resources_)).first;
      setup_seconds += since(t0);
    }
    return *it->second;
  }

  BackendSession& session(const std::string& name) {
    auto it = sessions_.find(name);
    if (it == sessions_.end()) it = sessions_.emplace(name, backend(name).new_session()).first;
    return *it->second;
  }

  // One step; records the capture (forced by `forced` when given).
  StepCapture step(const std::string& name, const std::vector<int64_t>& tokens, int64_t step_index,
                   const StepCapture* forced, bool prompt) {
    BackendSession& s = session(name);
    reference::StepOptions o;
    // Decoder replay applies to the first prompt step after a resume (a decode step in between
    // leaves it pending).
    if (prompt && pending_decoder_[name] && side_.path == CachePath::kDecoder) o.decoder_replay_rows = side_.decoder_rows;
    if (prompt) pending_decoder_[name] = false;
    StepCapture cap;
    const reference::ForwardHooks h = capture_hooks(cap, forced);
    Backend& b = backend(name);
    const auto t0 = std::chrono::steady_clock::now();
    const reference::StepRecord rec = b.step(s, tokens, o, h, step_index);
    step_seconds += since(t0);
    finish_capture(cap, rec, b.caches(s));
    return cap;
  }

  // The session pauses and resumes by this side's cache path; returns the caches after it.
  StepCapture resume(const std::string& name) {
    Backend& b = backend(name);
    BackendSession& s = session(name);
    StepCapture cap;
    cap.start_pos = s.pos();
    switch (side_.path) {
      case CachePath::kCold:
      case CachePath::kAlone:
        break;
      case CachePath::kFull: {
        const SavedState saved = b.save(s, /*include_swa=*/true);
        sessions_[name] = b.restore(saved, reference::ResumeMode::kFull);
        break;
      }
      case CachePath::kGlobal:
      case CachePath::kDecoder: {
        const SavedState saved = b.save(s, /*include_swa=*/false);
        sessions_[name] = b.restore(saved, reference::ResumeMode::kGlobalOnly);
        pending_decoder_[name] = true;
        break;
      }
    }
    cap.caches = b.caches(*sessions_[name]);
    return cap;
  }

  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Wall time of this side (RunOptions::time_sides): making its backends; its steps and rounds.
  double setup_seconds = 0, step_seconds = 0;

  // What any of this side's backends could not show ("" when nothing is missing).
  std::string missing_evidence() const {
    for (const auto& [key, b] : backends_) {
      const std::string m = b->missing_evidence();
      if (!m.empty()) return m;
    }
    return "";
  }

 private:
  Side side_;
  const BackendResources& resources_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  std::map<std::string, std::unique_ptr<BackendSession>> sessions_;
  std::map<std::string, bool> pending_decoder_;
};

std::string scenario_ref(const Scenario& s) {
  return s.source.rfind("builtin:", 0) == 0 ? s.source.substr(8) : s.source;
}

// Recall of A's selected positions by B at a probe step, split by the distance of each position
// (its group's first token) to the session's last resume boundary.
void probe_rows(const StepCapture& a, const StepCapture& b, int64_t step, int session, int64_t boundary,
                const reference::ModelConfig& c, std::vector<MetricRow>& rows) {
  const int64_t W = c.window_size;
  const char* names[4] = {"probe_recall[d<-W]", "probe_recall[-W<=d<0]", "probe_recall[0<=d<W]", "probe_recall[d>=W]"};
  const char* counts[4] = {"probe_count[d<-W]", "probe_count[-W<=d<0]", "probe_count[0<=d<W]", "probe_count[d>=W]"};
  for (const CapturedItem& ia : a.items) {
    if (ia.component != "topk") continue;
    const CapturedItem* ib = b.find(ia.layer, "topk");
    if (ib == nullptr) continue;
    const int ratio = c.compress_ratios[static_cast<size_t>(ia.layer)];
    int64_t total[4] = {0, 0, 0, 0}, kept[4] = {0, 0, 0, 0};
    const int64_t rows_a = ia.i.dim(0), rows_b = ib->i.dim(0), k = ia.i.dim(1);
    for (int64_t t = 0; t < std::min(rows_a, rows_b); ++t) {
      const int32_t* ra = ia.i.row(rows_a - 1 - t);
      const int32_t* rb = ib->i.row(rows_b - 1 - t);
      for (int64_t j = 0; j < k; ++j) {
        if (ra[j] < 0) continue;
        const int64_t d = static_cast<int64_t>(ra[j]) * ratio - boundary;
        const int bucket = d < -W ? 0 : d < 0 ? 1 : d < W ? 2 : 3;
        ++total[bucket];
        for (int64_t q = 0; q < ib->i.dim(1); ++q) {
          if (rb[q] == ra[j]) {
            ++kept[bucket];
            break;
          }
        }
      }
    }
    for (int bkt = 0; bkt < 4; ++bkt) {
      MetricRow r;
      r.step = step;
      r.session = session;
      r.position = a.start_pos;
      r.layer = ia.layer;
      r.component = "topk";
      r.metric = counts[bkt];
      r.value = static_cast<double>(total[bkt]);
      rows.push_back(r);
      if (total[bkt] == 0) continue;
      r.metric = names[bkt];
      r.value = static_cast<double>(kept[bkt]) / static_cast<double>(total[bkt]);
      rows.push_back(r);
    }
  }
}

// One pair of sides under one mode: both sides replay the scenario's events in lockstep and every
// step is compared. Fills one reports::Comparison (and the scenario's step list, once).
class ComparisonRun {
 public:
  ComparisonRun(const Scenario& sc, const BackendResources& res, const RunOptions& opt, const TokenPlan& plan,
                const std::vector<ToleranceRule>& rules, const std::map<std::string, int>& session_ids,
                const Pair& pair, const std::string& mode, std::vector<StepInfo>* steps)
      : sc_(sc), c_(res.config), opt_(opt), plan_(plan), rules_(rules), session_ids_(session_ids), pair_(pair),
        forced_(mode == "teacher-forced"), steps_(steps), A_(pair.a, res), B_(pair.b, res) {
    cmp_.side_a = pair.a.text();
    cmp_.side_b = pair.b.text();
    cmp_.mode = mode;
    cmp_.expectation = name(pair.expect);
    cmp_.expectation_origin = pair.why;
  }

  Comparison run() {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (size_t e = 0; e < sc_.events.size() && !stop_; ++e) run_event(e);
      evidence_.backend_gap = A_.missing_evidence();
      if (evidence_.backend_gap.empty()) evidence_.backend_gap = B_.missing_evidence();
      cmp_.verdict = comparison_verdict(cmp_, pair_.expect, evidence_);
      if (cmp_.verdict == Verdict::kMeasured) {
        // Where a measured pair first differs (information: nothing is asserted; no tensors kept).
        if (std::optional<reports::Divergence> d = first_difference(cmp_.rows)) cmp_.first_divergence = *d;
      }
    } catch (const Error& err) {
      cmp_.verdict = Verdict::kError;
      cmp_.notes.push_back(std::string("error: ") + err.what());
    } catch (const std::exception& err) {
      cmp_.verdict = Verdict::kError;
      cmp_.notes.push_back(std::string("error: unexpected failure: ") + err.what());
    }
    for (const std::string& n : notes_) cmp_.notes.push_back(n);
    for (const std::string& n : sc_.notes) cmp_.notes.push_back(n);
    cmp_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opt_.time_sides) {  // stderr only: wall times are volatile and stay out of the report
      std::ostringstream line;
      line.setf(std::ios::fixed);
      line.precision(3);
      line << "dsv41 run: time " << sc_.name << " [" << cmp_.mode << "]: " << cmp_.side_a << " setup "
           << A_.setup_seconds << " s steps " << A_.step_seconds << " s; " << cmp_.side_b << " setup "
           << B_.setup_seconds << " s steps " << B_.step_seconds << " s; " << step_ << " steps\n";
      std::cerr << line.str();
    }
    return std::move(cmp_);
  }

 private:
  void position(const char* phase) {
    if (!opt_.on_progress) return;
    RunPosition p;
    p.scenario = sc_.name;
    p.pair = cmp_.side_a + " vs " + cmp_.side_b;
    p.mode = cmp_.mode;
    p.event = event_;
    p.events = sc_.events.size();
    p.step = step_;
    p.phase = phase;
    opt_.on_progress(p);
  }

  void run_event(size_t e) {
    const Event& ev = sc_.events[e];
    event_ = e;
    position("");
    if (opt_.progress) {
      std::ostringstream p;
      p << sc_.name << " [" << cmp_.side_a << " vs " << cmp_.side_b << ", " << cmp_.mode << "] event " << e + 1 << "/"
        << sc_.events.size() << " (step " << step_ << ")";
      opt_.progress(p.str());
    }
    if (ev.kind == Event::kPrompt) {
      const std::vector<int64_t>& ids = plan_.prompts[e];
      const int64_t n = static_cast<int64_t>(ids.size()), chunk = ev.chunk > 0 ? ev.chunk : n;
      for (int64_t first = 0; first < n && !stop_; first += chunk) {
        run_step(ev.session, {ids.begin() + first, ids.begin() + std::min(n, first + chunk)}, "prefill", ev.probe);
      }
    } else if (ev.kind == Event::kDecode) {
      for (int64_t i = 0; i < ev.decode && !stop_; ++i) run_step(ev.session, {next_token(ev.session)}, "decode", ev.probe);
    } else if (ev.kind == Event::kSpeculate) {
      for (int64_t r = 0; r < ev.speculate.rounds && !stop_; ++r) run_round(ev, r);
    } else {
      const int64_t pos = A_.session(ev.session).pos();
      const StepCapture a = A_.resume(ev.session);
      const StepCapture b = B_.resume(ev.session);
      boundary_[ev.session] = pos;
      record_step(ev.session, "resume", pos, 0, {"resume"});
      compare(ev.session, a, b, false);
      advance();
    }
  }

  // The token a decode step or a round starts with: the last round's next token, else side A's
  // argmax (a speculative round that samples draws it from A's distribution with `seed`).
  int64_t next_token(const std::string& session, const reference::SamplingParams* sampling = nullptr,
                     uint64_t seed = 0) {
    const auto pending = pending_.find(session);
    if (pending != pending_.end()) {
      const int64_t t = pending->second;
      pending_.erase(pending);
      return t;
    }
    const std::vector<float>& logits = last_logits_.at(session);
    if (sampling == nullptr || sampling->temperature == 0) return argmax(logits);
    reference::SampleRng rng(seed);
    return reference::sample_from(
        reference::target_distribution(logits.data(), static_cast<int64_t>(logits.size()), *sampling), rng);
  }

  // One speculative round (scenarios/rounds.h): side A plans and decides, both sides keep A's
  // decision, the kept positions and both accept decisions are compared.
  void run_round(const Event& ev, int64_t round) {
    position("round");
    const std::string& session = ev.session;
    const int64_t start = A_.session(session).pos();
    const uint64_t seed = stream_seed(sc_.seed, "round:" + std::to_string(step_));
    reference::SamplingParams sampling;
    sampling.temperature = ev.speculate.temperature;
    sampling.top_p = ev.speculate.top_p;
    const int64_t current = next_token(session, &sampling, seed ^ 0x5eedull);
    // DSpark drafts: both sides draft (teacher-forced from A's when the mode is), A's is the proposal.
    std::optional<DraftSide> da, db;
    if (ev.speculate.drafter == SpeculateSpec::kDSpark) {
      const uint64_t draft_seed = stream_seed(sc_.seed, "draft:" + std::to_string(step_));
      Backend& ba = A_.backend(session);
      BackendSession& sa = A_.session(session);
      auto t0 = std::chrono::steady_clock::now();
      da = run_draft(ba, sa, current, ev.speculate, draft_seed, nullptr, step_);
      A_.step_seconds += SideRunner::since(t0);
      Backend& bb = B_.backend(session);
      BackendSession& sb = B_.session(session);
      t0 = std::chrono::steady_clock::now();
      db = run_draft(bb, sb, current, ev.speculate, draft_seed, forced_ ? &da->capture : nullptr, step_);
      B_.step_seconds += SideRunner::since(t0);
    }
    const RoundPlan plan = plan_round(A_.backend(session), A_.session(session), current, ev.speculate, round, seed,
                                      da ? &da->result : nullptr);
    RoundSide a = run_round_side(A_, session, plan, pair_.a.plain, std::nullopt, nullptr);
    RoundSide b = run_round_side(B_, session, plan, pair_.b.plain, a.kept, forced_ ? &a.verify : nullptr);
    if (da) {  // the draft's outputs lead the round's capture: they came first
      a.capture.items.insert(a.capture.items.begin(), da->capture.items.begin(), da->capture.items.end());
      b.capture.items.insert(b.capture.items.begin(), db->capture.items.begin(), db->capture.items.end());
    }
    align_columns(a.capture, b.capture);
    if (a.decision.next_token >= 0) pending_[session] = a.decision.next_token;
    std::vector<std::string> marks;
    if (a.kept < plan.k) marks.push_back("partial_accept");
    record_step(session, "speculate", start, a.kept + 1, marks);
    for (const auto& [side, which] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      const std::vector<reports::AcceptanceRow> rows =
          acceptance_rows(plan, *side, which, step_, session_ids_.at(session), start);
      cmp_.acceptance.insert(cmp_.acceptance.end(), rows.begin(), rows.end());
    }
    compare(session, a.capture, b.capture, false);
    advance();
  }

  RoundSide run_round_side(SideRunner& side, const std::string& session, const RoundPlan& plan, bool plain,
                           std::optional<int64_t> keep, const StepCapture* forced) {
    Backend& b = side.backend(session);
    BackendSession& s = side.session(session);
    const auto t0 = std::chrono::steady_clock::now();
    RoundSide r = scenarios::run_round(b, s, plan, plain, keep, forced, step_);
    side.step_seconds += SideRunner::since(t0);
    return r;
  }

  void run_step(const std::string& session, const std::vector<int64_t>& tokens, const char* phase, bool probe) {
    position(phase);
    const int64_t start = A_.session(session).pos();
    const bool prompt = std::string(phase) == "prefill";
    if (prompt) pending_.erase(session);  // a new prompt drops a round's pending token
    const StepCapture a = A_.step(session, tokens, step_, nullptr, prompt);
    const StepCapture b = B_.step(session, tokens, step_, forced_ ? &a : nullptr, prompt);
    last_logits_[session] = a.logits;
    record_step(session, phase, start, static_cast<int64_t>(tokens.size()), {});
    compare(session, a, b, probe);
    advance();
  }

  void advance() {
    if (opt_.stop_after_step >= 0 && step_ >= opt_.stop_after_step) stop_ = true;
    ++step_;
  }

  void record_step(const std::string& session, const char* phase, int64_t start, int64_t n,
                   std::vector<std::string> marks) {
    if (steps_ == nullptr) return;
    StepInfo si;
    si.step = step_;
    si.session = session_ids_.at(session);
    si.phase = phase;
    si.start_pos = start;
    si.tokens = n;
    const int64_t W = c_.window_size;
    if (n > 0 && (start / W) != ((start + n - 1) / W)) marks.push_back("window_edge");
    si.boundaries = std::move(marks);
    steps_->push_back(std::move(si));
  }

  void compare(const std::string& session, const StepCapture& a, const StepCapture& b, bool probe) {
    CompareContext ctx;
    ctx.step = step_;
    ctx.session = session_ids_.at(session);
    ctx.expect = pair_.expect;
    ctx.why = pair_.why;
    ctx.rules = &rules_;
    ctx.candidate_block_size = c_.candidate_block_size;
    ctx.candidate_source_layer = c_.candidate_source_layer;
    ctx.teacher_forced = forced_;
    const StepComparison r = compare_step(a, b, ctx);
    cmp_.items_compared += r.items;
    ++cmp_.steps_compared;
    for (const std::string& n : r.notes) notes_.insert(n);
    if (r.first_failure_row >= 0 && !cmp_.first_divergence) {
      divergence(r.rows[static_cast<size_t>(r.first_failure_row)], r.first_failure_detail, a, b);
    }
    if (opt_.save_tensors) keep_focus(cmp_, *opt_.save_tensors, step_, a, b);
    cmp_.rows.insert(cmp_.rows.end(), r.rows.begin(), r.rows.end());
    if (probe && boundary_.count(session)) {
      probe_rows(a, b, step_, ctx.session, boundary_.at(session), c_, cmp_.rows);
    } else if (probe) {
      ++evidence_.probes_unmeasured;
    }
    for (const std::string& v : r.vacuous_items) evidence_.vacuous_items.insert(v);
    for (const std::string& v : r.nonfinite_items) evidence_.nonfinite_items.insert(v);
  }

  // The first failing row: where, how much, and the command that reruns just that case.
  void divergence(const MetricRow& r, const std::string& detail, const StepCapture& a, const StepCapture& b) {
    reports::Divergence d = divergence_at(r);
    d.tolerance = *r.tolerance;
    d.detail = detail;
    std::ostringstream cmd;
    cmd << opt_.rerun_prefix << " " << shell_quote(scenario_ref(sc_)) << " --sides "
        << shell_quote(cmp_.side_a + "," + cmp_.side_b) << " --mode " << cmp_.mode << " --stop-after-step " << r.step
        << " --save-tensors "
        << shell_quote("step=" + std::to_string(r.step) + ",layer=" + std::to_string(r.layer) + ",component=" + r.component)
        << " -o rerun.h5";
    d.rerun = cmd.str();
    cmp_.first_divergence = d;
    if (opt_.save_failure_tensors) {
      Focus f;
      f.step = r.step;
      f.layer = r.layer;
      f.component = r.component;
      keep_focus(cmp_, f, step_, a, b);
    }
  }

  const Scenario& sc_;
  const reference::ModelConfig& c_;
  const RunOptions& opt_;
  const TokenPlan& plan_;
  const std::vector<ToleranceRule>& rules_;
  const std::map<std::string, int>& session_ids_;
  const Pair& pair_;
  const bool forced_;
  std::vector<StepInfo>* steps_;
  SideRunner A_, B_;
  Comparison cmp_;
  std::map<std::string, std::vector<float>> last_logits_;  // side A's last logits, per session
  std::map<std::string, int64_t> pending_;                  // a round's next token, not yet fed
  std::map<std::string, int64_t> boundary_;                 // last resume position, per session
  std::set<std::string> notes_;
  Evidence evidence_;  // what the verdict weighs besides the rows (backend gap: filled at the end)
  int64_t step_ = 0;
  bool stop_ = false;
  size_t event_ = 0;  // the event running now
};

}  // namespace

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
    plan.pairs = {p};
  }
  DSV41_CHECK(!plan.pairs.empty(), "scenario '", sc.name, "' declares no pairs: give --sides A,B");
  for (const Pair& p : plan.pairs) {
    for (const Side* side : {&p.a, &p.b}) {
      DSV41_CHECK(side->path != CachePath::kDecoder || side->decoder_rows >= c.window_size, "scenario '", sc.name,
                  "': side '", side->text(), "': decoder replay needs at least window_size = ", c.window_size,
                  " rows (docs/sessions.md: R = W + the speculative block), else the later layers' rings keep holes");
      if (side->backend.rfind("mutant:", 0) == 0) {
        const Mutation m = parse_mutation(side->backend.substr(7));
        DSV41_CHECK(m.layer < c.n_layers, "scenario '", sc.name, "': side '", side->text(), "': layer ", m.layer,
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
  for (const ToleranceRule& r : sc.tolerances) {
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
  if (sc.default_tolerances) {
    const std::vector<ToleranceRule> defaults = default_tolerance_rules();
    plan.rules.insert(plan.rules.end(), defaults.begin(), defaults.end());
  }
  std::set<std::string> sessions;
  for (const Event& e : sc.events) sessions.insert(e.session);
  plan.sessions = static_cast<int>(sessions.size());
  return plan;
}

ScenarioResult scenario_result_header(const Scenario& sc) {
  ScenarioResult out;
  out.name = sc.name;
  out.kind = sc.kind;
  out.description = sc.description;
  out.source = sc.source;
  out.scenario_json = sc.json;
  out.seed = sc.seed;
  return out;
}

ScenarioResult run_scenario(const Scenario& sc, const BackendResources& res, const RunOptions& opt) {
  ScenarioResult out = scenario_result_header(sc);
  const ScenarioPlan plan = plan_scenario(sc, res.config, opt);
  const std::vector<Pair>& pairs = plan.pairs;
  const std::vector<std::string>& modes = plan.modes;
  const std::vector<ToleranceRule>& rules = plan.rules;
  std::map<std::string, int> session_ids;
  for (const Event& e : sc.events) session_ids.emplace(e.session, static_cast<int>(session_ids.size()));

  for (const Pair& pair : pairs) {
    for (const std::string& mode : modes) {
      // The step list is the same for every comparison: recorded by the first.
      std::vector<StepInfo>* steps = out.comparisons.empty() ? &out.steps : nullptr;
      RunOptions o = opt;  // the progress callback learns which comparison of how many runs
      if (opt.on_progress) {
        o.on_progress = [&opt, at = out.comparisons.size(), n = pairs.size() * modes.size()](const RunPosition& p) {
          RunPosition q = p;
          q.comparison = at;
          q.comparisons = n;
          opt.on_progress(q);
        };
      }
      out.comparisons.push_back(ComparisonRun(sc, res, o, plan.tokens, rules, session_ids, pair, mode, steps).run());
    }
  }
  out.verdict = scenario_verdict(out.comparisons, &out.error);
  return out;
}

}  // namespace dsv41::scenarios
