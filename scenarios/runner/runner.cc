#include "scenarios/runner/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "base/error.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/compare.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/runner/keep.h"
#include "reference/ops/sampling.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/runner/rounds.h"
#include "scenarios/runner/runner_internal.h"
#include "scenarios/runner/runner_side.h"
#include "scenarios/runner/verdict.h"

namespace dsv41::scenarios::runner {
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

std::string scenario_ref(const Scenario& s) {
  return s.source.rfind("builtin:", 0) == 0 ? s.source.substr(8) : s.source;
}


// A pair judged by the derived bounds and the scenario's own rules, not the default rules
// (docs/scenarios.md "Order-variant pairs"): a tolerance pair one of whose backends claims
// order-variant results.
bool order_variant_pair(const Pair& p) {
  return p.expect == judge::Expectation::kTolerance &&
         (backend_claim(p.a.backend) == Claim::kOrderVariant || backend_claim(p.b.backend) == Claim::kOrderVariant);
}

// One pair of sides under one mode: both sides replay the scenario's events in lockstep and every
// step is compared. Fills one reports::Comparison (and the scenario's step list, once).
class ComparisonRun {
 public:
  ComparisonRun(const Scenario& sc, const BackendResources& res, const RunOptions& opt, const TokenPlan& plan,
                const std::vector<judge::ToleranceRule>& rules, const std::map<std::string, int>& session_ids,
                const Pair& pair, const std::string& mode, std::vector<StepInfo>* steps,
                const std::optional<ReplaySample>& replay)
      : sc_(sc), c_(res.config), res_(res), opt_(opt), plan_(plan), rules_(rules), session_ids_(session_ids),
        pair_(pair), forced_(mode == "teacher-forced"), derived_(order_variant_pair(pair)),
        accumulation_(backend_accumulation(pair.a.backend) == judge::Accumulation::kFp8TensorCore
                          ? judge::Accumulation::kFp8TensorCore
                          : backend_accumulation(pair.b.backend)), steps_(steps),
        A_(pair.a, res), B_(pair.b, res) {
    cmp_.side_a = pair.a.text();
    cmp_.side_b = pair.b.text();
    cmp_.mode = mode;
    cmp_.expectation = name(pair.expect);
    cmp_.expectation_origin = pair.why;
    if (derived_) {
      cmp_.expectation_origin +=
          forced_ ? "; order-variant, teacher-forced: every component within its own derived bound, the selections' "
                    "tie rule, the caches valid and decoded within their derived bound, a logits flip only inside the "
                    "tie band (scenarios/judge/order_variant.h, docs/scenarios.md \"Order-variant pairs\")"
                  : "; order-variant, free-running: a session's first step from position 0 judged by the chain bounds "
                    "(judge::free_running_bound; measured where the chain holds a selection); later steps measured "
                    "(their state carries earlier differences through selections), except the rows exact on every pair";
      if (!sc.tolerances.empty()) cmp_.expectation_origin += "; the scenario's tolerance rules win for what they bound";
      if (accumulation_ == judge::Accumulation::kFp8TensorCore) {
        cmp_.expectation_origin += "; accumulation fp8-tensor-core (a side runs its fp8 linears on tensor cores: "
                                   "scenarios/judge/derived_bounds.h A4-A5)";
      }
    }
    if (replay) {
      sampled_ = true;
      checked_.insert(replay->steps.begin(), replay->steps.end());
      cmp_.replay = reports::ReplayRecord{replay->seed, replay->total, replay->steps};
      A_.skip_index_scores();
      B_.skip_index_scores();
    }
  }

  Comparison run() {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (size_t e = 0; e < sc_.events.size() && !stop_; ++e) run_event(e);
      join_b();
      evidence_.backend_gap = A_.missing_evidence();
      if (evidence_.backend_gap.empty()) evidence_.backend_gap = B_.missing_evidence();
      cmp_.verdict = judge::comparison_verdict(cmp_, pair_.expect, evidence_);
      if (derived_ && !forced_ && cmp_.verdict == Verdict::kPass) measured_if_flipped();
      if (cmp_.verdict == Verdict::kMeasured) {
        // Where a measured pair first differs (information: nothing is asserted; no tensors kept).
        if (std::optional<reports::Divergence> d = judge::first_difference(cmp_.rows)) cmp_.first_divergence = *d;
      }
    } catch (const Error& err) {
      cmp_.verdict = Verdict::kError;
      cmp_.notes.push_back(std::string("error: ") + err.what());
    } catch (const std::exception& err) {
      cmp_.verdict = Verdict::kError;
      cmp_.notes.push_back(std::string("error: unexpected failure: ") + err.what());
    }
    settle_b();  // after an error of side A: side B's step in flight ends before B is read
    if (sampled_) {
      std::ostringstream n;
      n << "sampled replay (seed " << cmp_.replay->seed << "): side B replayed " << cmp_.replay->steps_checked.size()
        << " of " << cmp_.replay->steps_total << " steps teacher-forced from side A's state (" <<
        step_ranges(cmp_.replay->steps_checked) << "); the other steps are neither pass nor fail; index_scores "
        "not captured (the selections made from them are compared)";
      notes_.insert(n.str());
    }
    for (const std::string& n : notes_) cmp_.notes.push_back(n);
    for (const std::string& n : sc_.notes) cmp_.notes.push_back(n);
    cmp_.sides = {A_.measure("a"), B_.measure("b")};
    cmp_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opt_.time_sides) {  // stderr only: wall times are volatile and stay out of the report
      std::ostringstream line;
      line.setf(std::ios::fixed);
      line.precision(3);
      line << "dsv41 run: time " << sc_.name << " [" << cmp_.mode << "]: " << cmp_.side_a << " setup "
           << A_.setup_seconds << " s steps " << A_.step_seconds() << " s; " << cmp_.side_b << " setup "
           << B_.setup_seconds << " s steps " << B_.step_seconds() << " s; " << step_ << " steps\n";
      std::cerr << line.str();
    }
    return std::move(cmp_);
  }

 private:
  // Free-running, an order-variant pair's logits rows are measured (no derived bound through the
  // whole forward): a top-1 token that differs is neither explained nor failed, so the comparison
  // is measured, never a pass with tokens flipped (as conform's end-to-end comparison).
  void measured_if_flipped() {
    int64_t steps = 0, flipped = 0;
    for (const MetricRow& r : cmp_.rows) {
      if (r.component != "logits" || r.metric != "top1_agree") continue;
      ++steps;
      flipped += r.value < 1.0;
    }
    if (flipped == 0) return;
    cmp_.verdict = Verdict::kMeasured;
    cmp_.notes.push_back("free-running, side A's top-1 token is not side B's at " + std::to_string(flipped) + " of " +
                         std::to_string(steps) + " steps; no end-to-end bound says whether a flip is a near tie, so "
                         "this comparison is measured, not passed (the teacher-forced comparison judges each component)");
  }

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
        run_step(ev.session, {ids.begin() + first, ids.begin() + std::min(n, first + chunk)}, "prefill", ev.probe,
                 /*last_chunk=*/first + chunk >= n);
      }
    } else if (ev.kind == Event::kDecode) {
      for (int64_t i = 0; i < ev.decode && !stop_; ++i) run_step(ev.session, {next_token(ev.session)}, "decode", ev.probe);
    } else if (ev.kind == Event::kSpeculate) {
      for (int64_t r = 0; r < ev.speculate.rounds && !stop_; ++r) run_round(ev, r);
    } else {
      const int64_t pos = A_.session(ev.session).pos();
      if (sampled_ && !checked_.count(step_)) {  // sampled replay: side A alone
        A_.resume(ev.session, /*views=*/false);
        boundary_[ev.session] = pos;
        record_step(ev.session, "resume", pos, 0, {"resume"});
        advance();
        return;
      }
      // Sampled replay: side B loads A's state before the resume, then resumes by its own path.
      const std::string& session = ev.session;
      std::shared_ptr<const AState> from_a;
      if (sampled_) from_a = a_state(session);
      auto a = std::make_shared<const StepCapture>(A_.resume(session));
      auto b = std::make_shared<StepCapture>();
      launch_b(
          [this, from_a, b, session] {
            if (from_a) B_.load(session, from_a->saved, from_a->pending_decoder);
            *b = B_.resume(session);
          },
          [this, a, b, session, step = step_] { compare(session, *a, *b, false, step); });
      boundary_[session] = pos;
      record_step(session, "resume", pos, 0, {"resume"});
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

  // One speculative round (scenarios/runner/rounds.h): side A plans and decides, both sides keep A's
  // decision, the kept positions and both accept decisions are compared.
  void run_round(const Event& ev, int64_t round) {
    position("round");
    const std::string session = ev.session;
    const int64_t start = A_.session(session).pos(), step = step_;
    const uint64_t seed = stream_seed(sc_.seed, "round:" + std::to_string(step));
    reference::SamplingParams sampling;
    sampling.temperature = ev.speculate.temperature;
    sampling.top_p = ev.speculate.top_p;
    const int64_t current = next_token(session, &sampling, seed ^ 0x5eedull);
    const bool b_runs = !sampled_ || checked_.count(step) > 0;
    std::shared_ptr<const AState> from_a;
    if (sampled_ && b_runs) from_a = a_state(session);
    // DSpark drafts: both sides draft (teacher-forced from A's when the mode is), A's is the proposal.
    std::shared_ptr<DraftSide> da;
    const bool dspark = ev.speculate.drafter == SpeculateSpec::kDSpark;
    const uint64_t draft_seed = dspark ? stream_seed(sc_.seed, "draft:" + std::to_string(step)) : 0;
    if (dspark) {
      da = std::make_shared<DraftSide>(A_.timed([&] {
        return run_draft(A_.backend(session), A_.session(session), current, ev.speculate, draft_seed, nullptr, step);
      }));
    }
    auto plan = std::make_shared<const RoundPlan>(A_.timed([&] {
      return plan_round(A_.backend(session), A_.session(session), current, ev.speculate, round, seed,
                        da ? &da->result : nullptr);
    }));
    auto a = std::make_shared<RoundSide>(run_round_side(A_, session, *plan, pair_.a.plain, std::nullopt, nullptr, step));
    if (a->decision.next_token >= 0) pending_[session] = a->decision.next_token;
    record_step(session, "speculate", start, a->kept + 1,
                a->kept < plan->k ? std::vector<std::string>{"partial_accept"} : std::vector<std::string>{});
    if (!b_runs) {  // sampled replay: side A alone
      advance();
      return;
    }
    auto b = std::make_shared<RoundSide>();
    auto db = std::make_shared<std::optional<DraftSide>>();
    launch_b(
        [this, from_a, session, spec = ev.speculate, current, draft_seed, plan, a, da, b, db, step] {
          if (from_a) B_.load(session, from_a->saved, from_a->pending_decoder);
          if (da) {
            *db = B_.timed([&] {
              return run_draft(B_.backend(session), B_.session(session), current, spec, draft_seed,
                               forced_ ? &da->capture : nullptr, step);
            });
          }
          *b = run_round_side(B_, session, *plan, pair_.b.plain, a->kept, forced_ ? &a->verify : nullptr, step);
        },
        [this, session, start, plan, a, da, b, db, step] {
          if (da) {  // the draft's outputs lead the round's capture: they came first
            a->capture.items.insert(a->capture.items.begin(), da->capture.items.begin(), da->capture.items.end());
            b->capture.items.insert(b->capture.items.begin(), (*db)->capture.items.begin(),
                                    (*db)->capture.items.end());
          }
          align_columns(a->capture, b->capture);
          for (const auto& [side, which] : {std::pair{a.get(), "a"}, std::pair{b.get(), "b"}}) {
            const std::vector<reports::AcceptanceRow> rows =
                acceptance_rows(*plan, *side, which, step, session_ids_.at(session), start);
            cmp_.acceptance.insert(cmp_.acceptance.end(), rows.begin(), rows.end());
          }
          // The rollback replayed the kept tokens hook-free on both sides: B's caches now hold rows
          // no forcing reached (an order-variant pair measures their decoded values from here on).
          if (forced_ && derived_ && unforced_caches_.insert(session).second) {
            notes_.insert("teacher-forced: after session " + session + "'s first speculative round (step " +
                          std::to_string(step) + ") its caches hold the rows the rollback replayed without forcing "
                          "(reference::model::roll_back is hook-free): their decoded values and their readers (attn_out, "
                          "index_scores, topk, candidates, dspark_attn_out) are measured from then on, the caches' "
                          "validity still checked");
          }
          compare(session, a->capture, b->capture, false, step);
        });
    advance();
  }

  RoundSide run_round_side(SideRunner& side, const std::string& session, const RoundPlan& plan, bool plain,
                           std::optional<int64_t> keep, const StepCapture* forced, int64_t step) {
    return side.timed(
        [&] { return runner::run_round(side.backend(session), side.session(session), plan, plain, keep, forced, step); });
  }

  void run_step(const std::string& session, const std::vector<int64_t>& tokens, const char* phase, bool probe,
                bool last_chunk = false) {
    position(phase);
    const int64_t start = A_.session(session).pos(), step = step_;
    const bool prompt = std::string(phase) == "prefill";
    if (prompt) pending_.erase(session);  // a new prompt drops a round's pending token
    if (sampled_ && !checked_.count(step)) {  // sampled replay: side A alone, nothing recorded
      last_logits_[session] = A_.step_unrecorded(session, tokens, step, prompt);
      record_step(session, phase, start, static_cast<int64_t>(tokens.size()), {});
      advance();  // (the last chunk of a prompt is always sampled: its bytes are checked below)
      return;
    }
    std::shared_ptr<const AState> from_a;
    if (sampled_) from_a = a_state(session);
    auto a = std::make_shared<const StepCapture>(A_.step(session, tokens, step, nullptr, prompt));
    last_logits_[session] = a->logits;
    record_step(session, phase, start, static_cast<int64_t>(tokens.size()), {});
    auto b = std::make_shared<StepCapture>();
    const bool bytes = prompt && last_chunk && sc_.check_bytes;
    launch_b(
        [this, from_a, session, tokens, prompt, a, b, step] {
          if (from_a) B_.load(session, from_a->saved, from_a->pending_decoder);
          *b = B_.step(session, tokens, step, forced_ ? a.get() : nullptr, prompt);
        },
        [this, session, probe, bytes, a, b, step, boundary = boundary_of(session)] {
          compare(session, *a, *b, probe, step, boundary);
          if (bytes) {
            bytes_rows("a", a->caches, a->start_pos + a->tokens, session, step);
            bytes_rows("b", b->caches, b->start_pos + b->tokens, session, step);
          }
        });
    advance();
  }

  // Side A's state before a sampled step (saved with the rings in the official bytes, to be loaded
  // by side B in full mode) and A's pending decoder replay.
  struct AState {
    SavedState saved;
    bool pending_decoder = false;
  };
  std::shared_ptr<const AState> a_state(const std::string& session) {
    return std::make_shared<const AState>(AState{A_.save_full(session), A_.pending_decoder(session)});
  }

  // Side B's part of a step: `work` (B's step; in a sampled replay B first loads A's state) and
  // `finish` (the step's comparison). In a sampled replay the work runs on a worker thread while
  // side A goes on with the next steps (side B alone is slow: the CPU reference) and finish runs
  // here when it is joined: before B's next step and at the end, so every row keeps step order;
  // otherwise (lockstep) both run here at once.
  void launch_b(std::function<void()> work, std::function<void()> finish) {
    join_b();
    if (!sampled_ || !opt_.replay_beside_a) {
      work();
      finish();
      return;
    }
    b_work_ = std::async(std::launch::async, std::move(work));
    b_finish_ = std::move(finish);
  }
  void join_b() {
    if (!b_work_.valid()) return;
    b_work_.get();  // side B's error is re-thrown here
    const std::function<void()> finish = std::move(b_finish_);
    b_finish_ = nullptr;
    finish();
  }
  // After an error: side B's work in flight ends (its result is dropped) before B is read.
  void settle_b() {
    if (b_work_.valid()) b_work_.wait();
  }

  std::optional<int64_t> boundary_of(const std::string& session) const {
    const auto it = boundary_.find(session);
    return it == boundary_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }

  // The global bytes a side holds after a prompt event against `dsv41 bytes` (runner_internal.h).
  void bytes_rows(const std::string& which, const std::vector<reference::model::CacheView>& views, int64_t tokens,
                  const std::string& session, int64_t step) {
    const Side& side = which == "a" ? pair_.a : pair_.b;
    if (backend_claim(side.backend) == Claim::kApproximate) {
      notes_.insert("global bytes per token not checked for side " + which + " (" + side.text() +
                    "): its caches are not the official formats");
      return;
    }
    std::string detail;
    const std::vector<MetricRow> rows =
        global_bytes_rows(views, tokens, c_, which, step, session_ids_.at(session), &detail);
    cmp_.rows.insert(cmp_.rows.end(), rows.begin(), rows.end());
    if (!detail.empty() && !cmp_.first_divergence) {
      reports::Divergence d = judge::divergence_at(rows.back());
      d.tolerance = *rows.back().tolerance;
      d.detail = detail;
      cmp_.first_divergence = d;
    }
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

  void compare(const std::string& session, const StepCapture& a, const StepCapture& b, bool probe, int64_t step,
               std::optional<int64_t> boundary = std::nullopt) {
    CompareContext ctx;
    ctx.step = step;
    ctx.session = session_ids_.at(session);
    ctx.expect = pair_.expect;
    ctx.why = pair_.why;
    ctx.rules = &rules_;
    ctx.candidate_block_size = c_.candidate_block_size;
    ctx.candidate_source_layer = c_.candidate_source_layer;
    ctx.teacher_forced = forced_;
    if (derived_) {
      ctx.derived = &c_;
      ctx.chain_bounded = !forced_ && a.start_pos == 0;
      ctx.unforced_caches = forced_ && unforced_caches_.count(session) > 0;
      ctx.accumulation = accumulation_;
      ctx.topk_tie_rel = forced_ ? judge::topk_tie_band(c_, accumulation_) : 0.0;
      if (forced_) {  // the experts' ties: A's gate input is B's too (forced)
        for (const CapturedItem& it : a.items) {
          const CapturedItem* x = it.component == "experts" ? a.find(it.layer, "ffn_in") : nullptr;
          if (x == nullptr || it.layer < 0 || it.layer >= c_.n_layers || x->f.rank() != 2) continue;
          ctx.expert_scores[it.layer] =
              expert_tie_scores(x->f, res_.weights.blocks[static_cast<size_t>(it.layer)], c_, it.layer);
        }
      }
    }
    const StepComparison r = compare_step(a, b, ctx);
    cmp_.items_compared += r.items;
    ++cmp_.steps_compared;
    for (const std::string& n : r.notes) notes_.insert(n);
    if (r.first_failure_row >= 0 && !cmp_.first_divergence) {
      divergence(r.rows[static_cast<size_t>(r.first_failure_row)], r.first_failure_detail, a, b);
    }
    if (opt_.save_tensors) keep_focus(cmp_, *opt_.save_tensors, step, a, b);
    cmp_.rows.insert(cmp_.rows.end(), r.rows.begin(), r.rows.end());
    if (probe && boundary) {
      probe_rows(a, b, step, ctx.session, *boundary, c_, cmp_.rows);
    } else if (probe) {
      ++evidence_.probes_unmeasured;
    }
    for (const std::string& v : r.vacuous_items) evidence_.vacuous_items.insert(v);
    for (const std::string& v : r.nonfinite_items) evidence_.nonfinite_items.insert(v);
  }

  // The first failing row: where, how much, and the command that reruns just that case.
  void divergence(const MetricRow& r, const std::string& detail, const StepCapture& a, const StepCapture& b) {
    reports::Divergence d = judge::divergence_at(r);
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
      keep_focus(cmp_, f, r.step, a, b);
    }
  }

  const Scenario& sc_;
  const reference::ModelConfig& c_;
  const BackendResources& res_;
  const RunOptions& opt_;
  const TokenPlan& plan_;
  const std::vector<judge::ToleranceRule>& rules_;
  const std::map<std::string, int>& session_ids_;
  const Pair& pair_;
  const bool forced_;
  const bool derived_;  // judged by the derived bounds (order_variant_pair)
  const judge::Accumulation accumulation_;  // the claim's accumulation (either side's)
  std::vector<StepInfo>* steps_;
  SideRunner A_, B_;
  Comparison cmp_;
  std::map<std::string, std::vector<float>> last_logits_;  // side A's last logits, per session
  std::map<std::string, int64_t> pending_;                  // a round's next token, not yet fed
  std::map<std::string, int64_t> boundary_;                 // last resume position, per session
  std::set<std::string> unforced_caches_;  // teacher-forced sessions whose caches hold unforced rows (a rollback)
  std::set<std::string> notes_;
  judge::Evidence evidence_;  // what the verdict weighs besides the rows (backend gap: filled at the end)
  int64_t step_ = 0;
  bool stop_ = false;
  bool sampled_ = false;          // sampled replay: side B runs the steps in checked_ only
  std::set<int64_t> checked_;
  size_t event_ = 0;  // the event running now
  // Side B's work in flight (sampled replay) and the comparison to run once it is joined; last, so
  // that the work ends before any member it uses goes.
  std::future<void> b_work_;
  std::function<void()> b_finish_;
};

}  // namespace

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
  const std::vector<judge::ToleranceRule>& rules = plan.rules;
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
      const std::optional<ReplaySample>& replay = plan.replay[static_cast<size_t>(&pair - pairs.data())];
      const std::vector<judge::ToleranceRule>& pair_rules = order_variant_pair(pair) ? plan.explicit_rules : rules;
      out.comparisons.push_back(
          ComparisonRun(sc, res, o, plan.tokens, pair_rules, session_ids, pair, mode, steps, replay).run());
    }
  }
  out.verdict = judge::scenario_verdict(out.comparisons, &out.error);
  return out;
}

}  // namespace dsv41::scenarios::runner
