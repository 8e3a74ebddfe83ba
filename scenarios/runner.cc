#include "scenarios/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "formats/error.h"
#include "scenarios/capture.h"
#include "scenarios/compare.h"
#include "scenarios/mutants.h"

namespace dsv41::scenarios {
namespace {

using reports::Comparison;
using reports::MetricRow;
using reports::ScenarioResult;
using reports::StepInfo;
using reports::StoredTensor;
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
    if (it == backends_.end()) it = backends_.emplace(key, make_backend(side_.backend, resources_)).first;
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
    const reference::StepRecord rec = backend(name).step(s, tokens, o, h, step_index);
    finish_capture(cap, rec, backend(name).caches(s));
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

// Keeps a tensor unless the same (step, layer, component, side) is kept already (a failure's
// tensors and a --save-tensors focus may name the same case).
void keep(Comparison& cmp, StoredTensor t) {
  for (const StoredTensor& u : cmp.tensors) {
    if (u.step == t.step && u.layer == t.layer && u.component == t.component && u.side == t.side) return;
  }
  cmp.tensors.push_back(std::move(t));
}

void store_item(Comparison& cmp, const CapturedItem& it, int64_t step, const std::string& side) {
  StoredTensor t;
  t.step = step;
  t.layer = it.layer;
  t.component = it.component;
  t.side = side;
  switch (it.kind) {
    case CapturedItem::kFloat:
      t.logical_dtype = it.type == ValueType::kBf16 ? "bf16" : "fp32";
      t.shape = it.f.shape();
      t.values.assign(it.f.data().begin(), it.f.data().end());
      break;
    case CapturedItem::kIndex:
      t.logical_dtype = "int32";
      t.shape = it.i.shape();
      t.values.assign(it.i.data().begin(), it.i.data().end());
      break;
    case CapturedItem::kMask:
      t.logical_dtype = "uint8";
      t.shape = it.m.shape();
      t.values.assign(it.m.data().begin(), it.m.data().end());
      break;
    case CapturedItem::kIds:
      t.logical_dtype = "int64";
      t.shape = it.ids_shape;
      t.values.assign(it.ids.begin(), it.ids.end());
      break;
  }
  keep(cmp, std::move(t));
}

// Keeps (both sides of) every item of this step the focus names, the logits included.
void store_focus(Comparison& cmp, const Focus& f, int64_t step, const StepCapture& a, const StepCapture& b) {
  for (const CapturedItem& it : a.items) {
    if (f.matches(step, it.layer, it.component)) store_item(cmp, it, step, "a");
  }
  for (const CapturedItem& it : b.items) {
    if (f.matches(step, it.layer, it.component)) store_item(cmp, it, step, "b");
  }
  for (const auto& [cap, side] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    for (const reference::CacheView& v : cap->caches) {
      if (!f.matches(step, v.layer, "cache." + v.kind)) continue;
      StoredTensor t;
      t.step = step;
      t.layer = v.layer;
      t.component = "cache." + v.kind;
      t.side = side;
      t.logical_dtype = "uint8";
      t.shape = {v.entries, v.entry_bytes};
      t.values.assign(v.bytes.begin(), v.bytes.end());
      keep(cmp, std::move(t));
    }
  }
  if (f.matches(step, -1, "logits")) {
    for (const auto& [cap, side] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
      if (cap->logits.empty()) continue;
      CapturedItem it;
      it.layer = -1;
      it.component = "logits";
      it.type = ValueType::kFp32;
      it.f = reference::Tensor<float>({1, static_cast<int64_t>(cap->logits.size())}, cap->logits, "logits");
      store_item(cmp, it, step, side);
    }
  }
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

}  // namespace

bool Focus::matches(int64_t s, int l, const std::string& c) const {
  return (step < 0 || s == step) && (layer == -2 || l == layer) && (component.empty() || c == component);
}

Focus parse_focus(const std::string& text) {
  Focus f;
  std::stringstream ss(text);
  std::string part;
  bool any = false;
  while (std::getline(ss, part, ',')) {
    const size_t eq = part.find('=');
    DSV41_CHECK(eq != std::string::npos, "--save-tensors '", text, "': '", part, "' is not key=value");
    const std::string k = part.substr(0, eq), v = part.substr(eq + 1);
    try {
      if (k == "step") {
        f.step = std::stoll(v);
      } else if (k == "layer") {
        f.layer = std::stoi(v);
      } else if (k == "component") {
        f.component = v;
      } else {
        DSV41_FAIL("--save-tensors '", text, "': unknown key '", k, "' (step, layer, component)");
      }
    } catch (const std::logic_error&) {
      DSV41_FAIL("--save-tensors '", text, "': '", v, "' is not a number");
    }
    any = true;
  }
  DSV41_CHECK(any, "--save-tensors: empty (e.g. step=3,layer=6,component=topk)");
  return f;
}

Expectation default_expectation(const Side& a, const Side& b, const Scenario& s, std::string* why) {
  const bool resumes = [&] {
    for (const Event& e : s.events) {
      if (e.kind == Event::kResume) return true;
    }
    return false;
  }();
  const auto exact_backend = [](const Side& x) { return backend_claim(x.backend) == Claim::kBitExact; };
  const auto exact_path = [&](const Side& x) {
    return !resumes || x.path == CachePath::kCold || x.path == CachePath::kFull || x.path == CachePath::kAlone;
  };
  const bool same_path = a.path == b.path && a.decoder_rows == b.decoder_rows;
  if (exact_backend(a) && exact_backend(b) && same_path) {
    *why = "both backends claim the reference's bits and take the same cache path: the same computation";
    return Expectation::kBitExact;
  }
  if (exact_backend(a) && exact_backend(b) && exact_path(a) && exact_path(b)) {
    *why = "both backends claim the reference's bits and no path replays (docs/sessions.md: chunking, full resume "
           "and separate sessions are exact)";
    return Expectation::kBitExact;
  }
  *why = !exact_backend(a) || !exact_backend(b)
             ? "a backend is approximate by design (ref-bf16kv: precision ablation)"
             : "bounded replay (global / decoder path) is approximate by design (docs/replay-divergence.md)";
  return Expectation::kMeasured;
}

namespace {

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
      cmp_.verdict = verdict();
      if (cmp_.verdict == Verdict::kMeasured) first_difference();
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
    return std::move(cmp_);
  }

 private:
  void run_event(size_t e) {
    const Event& ev = sc_.events[e];
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
      for (int64_t i = 0; i < ev.decode && !stop_; ++i) {
        run_step(ev.session, {argmax(last_logits_.at(ev.session))}, "decode", ev.probe);
      }
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

  void run_step(const std::string& session, const std::vector<int64_t>& tokens, const char* phase, bool probe) {
    const int64_t start = A_.session(session).pos();
    const bool prompt = std::string(phase) == "prefill";
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
    if (opt_.save_tensors) store_focus(cmp_, *opt_.save_tensors, step_, a, b);
    cmp_.rows.insert(cmp_.rows.end(), r.rows.begin(), r.rows.end());
    if (probe && boundary_.count(session)) {
      probe_rows(a, b, step_, ctx.session, boundary_.at(session), c_, cmp_.rows);
    } else if (probe) {
      ++probes_unmeasured_;
    }
    for (const std::string& v : r.vacuous_items) vacuous_items_.insert(v);
  }

  static reports::Divergence divergence_at(const MetricRow& r) {
    reports::Divergence d;
    d.step = r.step;
    d.session = r.session;
    d.position = r.position;
    d.layer = r.layer;
    d.component = r.component;
    d.metric = r.metric;
    d.value = r.value;
    return d;
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
      store_focus(cmp_, f, step_, a, b);
    }
  }

  Verdict verdict() {
    bool failed = false;
    for (const MetricRow& r : cmp_.rows) failed = failed || r.verdict == Verdict::kFail;
    if (failed) return Verdict::kFail;
    std::string gap = A_.missing_evidence();
    if (gap.empty()) gap = B_.missing_evidence();
    // Probe steps exist to measure recall on both sides of a resume boundary: without a
    // boundary, or when side A's selections never reach across it, the scenario has not tested
    // what it claims (missing evidence, never a pass).
    int64_t before = 0, after = 0, probe_rows_seen = 0;
    for (const MetricRow& r : cmp_.rows) {
      if (r.metric.rfind("probe_count", 0) == 0) ++probe_rows_seen;
      if (r.metric == "probe_count[d<-W]" || r.metric == "probe_count[-W<=d<0]") before += static_cast<int64_t>(r.value);
      if (r.metric == "probe_count[0<=d<W]" || r.metric == "probe_count[d>=W]") after += static_cast<int64_t>(r.value);
    }
    if (gap.empty() && probes_unmeasured_ > 0) {
      gap = std::to_string(probes_unmeasured_) + " probe step(s) ran without a resume boundary before them in their "
            "session: recall by distance was not measured";
    }
    if (gap.empty() && probe_rows_seen > 0 && (before == 0 || after == 0)) {
      gap = "side A's probe selections did not straddle the resume boundary (" + std::to_string(before) +
            " before, " + std::to_string(after) + " after it)";
    }
    if (gap.empty() && cmp_.items_compared == 0) gap = "nothing was compared";
    if (gap.empty()) {
      for (const MetricRow& r : cmp_.rows) {
        if (r.metric == "present" && r.value < 1.0) {
          gap = "an output is missing on one side (" + r.component + ", layer " + std::to_string(r.layer) + ", step " +
                std::to_string(r.step) + ")";
          break;
        }
      }
    }
    if (gap.empty() && !vacuous_items_.empty()) {
      gap = "outputs all zero on both sides (a vacuous comparison): " + *vacuous_items_.begin() +
            (vacuous_items_.size() > 1 ? " and " + std::to_string(vacuous_items_.size() - 1) + " more" : "");
    }
    if (!gap.empty()) {
      cmp_.notes.push_back(gap);
      return Verdict::kInconclusive;
    }
    return pair_.expect == Expectation::kMeasured ? Verdict::kMeasured : Verdict::kPass;
  }

  // Where a measured pair first differs (information: nothing is asserted; no tensors kept).
  void first_difference() {
    for (const MetricRow& r : cmp_.rows) {
      const bool exactness = r.metric == "bit_equal_frac" || r.metric == "rows_equal_frac" ||
                             r.metric == "bytes_equal_frac" || r.metric == "equal_frac";
      if (!exactness || r.value >= 1.0) continue;
      reports::Divergence d = divergence_at(r);
      d.tolerance.origin = "none";
      d.tolerance.higher_is_better = true;
      d.tolerance.bound = 1.0;
      d.tolerance.note = "measured pair: the first difference, not asserted";
      cmp_.first_divergence = d;
      return;
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
  std::map<std::string, int64_t> boundary_;                 // last resume position, per session
  std::set<std::string> notes_;
  int64_t step_ = 0, probes_unmeasured_ = 0;
  std::set<std::string> vacuous_items_;
  bool stop_ = false;
};

}  // namespace

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char ch : s) {
    const bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                    std::string("_@%+=:,./-").find(ch) != std::string::npos;
    plain = plain && ok;
  }
  if (plain) return s;
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

ScenarioPlan plan_scenario(const Scenario& sc, const reference::ModelConfig& c, const RunOptions& opt) {
  ScenarioPlan plan;
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
      out.comparisons.push_back(ComparisonRun(sc, res, opt, plan.tokens, rules, session_ids, pair, mode, steps).run());
    }
  }
  out.verdict = Verdict::kPass;
  for (const Comparison& cmp : out.comparisons) {
    out.verdict = reports::worse(out.verdict, cmp.verdict);
    if (cmp.verdict == Verdict::kError && out.error.empty()) {
      // The scenario's error says which comparison could not complete, and why.
      out.error = cmp.side_a + " vs " + cmp.side_b + " [" + cmp.mode + "]";
      for (const std::string& n : cmp.notes) {
        if (n.rfind("error: ", 0) == 0) {
          out.error += ": " + n.substr(7);
          break;
        }
      }
    }
  }
  if (out.comparisons.empty()) out.verdict = Verdict::kInconclusive;
  return out;
}

}  // namespace dsv41::scenarios
