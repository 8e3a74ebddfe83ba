#include "scenarios/runner.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "formats/error.h"
#include "scenarios/capture.h"
#include "scenarios/compare.h"

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
                   const StepCapture* forced) {
    BackendSession& s = session(name);
    reference::StepOptions o;
    if (pending_decoder_[name] && side_.path == CachePath::kDecoder) o.decoder_replay_rows = side_.decoder_rows;
    pending_decoder_[name] = false;
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

 private:
  Side side_;
  const BackendResources& resources_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  std::map<std::string, std::unique_ptr<BackendSession>> sessions_;
  std::map<std::string, bool> pending_decoder_;
};

std::string quote_arg(const std::string& s) {
  if (s.find_first_of(" \t'\"$\\") == std::string::npos && !s.empty()) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string scenario_ref(const Scenario& s) {
  return s.source.rfind("builtin:", 0) == 0 ? s.source.substr(8) : s.source;
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
  cmp.tensors.push_back(std::move(t));
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
      cmp.tensors.push_back(std::move(t));
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
  const auto exact_backend = [](const Side& x) { return x.backend != "ref-bf16kv"; };
  const auto exact_path = [&](const Side& x) {
    return !resumes || x.path == CachePath::kCold || x.path == CachePath::kFull || x.path == CachePath::kAlone;
  };
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

ScenarioResult run_scenario(const Scenario& sc, const BackendResources& res, const RunOptions& opt) {
  ScenarioResult out;
  out.name = sc.name;
  out.kind = sc.kind;
  out.description = sc.description;
  out.source = sc.source;
  out.scenario_json = sc.json;
  out.seed = sc.seed;
  const reference::ModelConfig& c = res.config;
  const TokenPlan plan = plan_tokens(sc, c.vocab_size);

  std::vector<Pair> pairs = sc.pairs;
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
    pairs = {p};
  }
  DSV41_CHECK(!pairs.empty(), "scenario '", sc.name, "' declares no pairs: give --sides A,B");
  for (const Pair& p : pairs) {
    for (const Side* side : {&p.a, &p.b}) {
      DSV41_CHECK(side->path != CachePath::kDecoder || side->decoder_rows >= c.window_size, "side '", side->text(),
                  "': decoder replay needs at least window_size = ", c.window_size,
                  " rows (docs/sessions.md: R = W + the speculative block), else the later layers' rings keep holes");
    }
  }
  const std::vector<std::string> modes = opt.modes.empty() ? sc.modes : opt.modes;
  for (const std::string& m : modes) {
    DSV41_CHECK(m == "free-running" || m == "teacher-forced", "mode '", m, "': not free-running or teacher-forced");
  }
  const std::vector<ToleranceRule> defaults = default_tolerance_rules();
  std::vector<ToleranceRule> rules = sc.tolerances;
  if (sc.default_tolerances) rules.insert(rules.end(), defaults.begin(), defaults.end());

  std::map<std::string, int> session_ids;
  for (const Event& e : sc.events) session_ids.emplace(e.session, static_cast<int>(session_ids.size()));

  bool steps_recorded = false;
  for (const Pair& pair : pairs) {
    for (const std::string& mode : modes) {
      const auto t0 = std::chrono::steady_clock::now();
      Comparison cmp;
      cmp.side_a = pair.a.text();
      cmp.side_b = pair.b.text();
      cmp.mode = mode;
      cmp.expectation = name(pair.expect);
      cmp.expectation_origin = pair.why;
      const bool forced = mode == "teacher-forced";
      int64_t vacuous = 0;
      std::set<std::string> notes;
      try {
        SideRunner A(pair.a, res), B(pair.b, res);
        std::map<std::string, std::vector<float>> last_logits;  // side A's, per session
        std::map<std::string, int64_t> boundary;                 // last resume position, per session
        int64_t step = 0, probes = 0, probe_rows_seen = 0;
        bool stop = false;
        const auto record_step = [&](const std::string& session, const char* phase, int64_t start, int64_t n,
                                     std::vector<std::string> marks) {
          if (steps_recorded) return;
          StepInfo si;
          si.step = step;
          si.session = session_ids.at(session);
          si.phase = phase;
          si.start_pos = start;
          si.tokens = n;
          const int64_t W = c.window_size;
          if (n > 0 && (start / W) != ((start + n - 1) / W)) marks.push_back("window_edge");
          si.boundaries = std::move(marks);
          out.steps.push_back(std::move(si));
        };
        const auto compare = [&](const std::string& session, const StepCapture& a, const StepCapture& b, bool probe) {
          CompareContext ctx;
          ctx.step = step;
          ctx.session = session_ids.at(session);
          ctx.expect = pair.expect;
          ctx.why = pair.why;
          ctx.rules = &rules;
          ctx.candidate_block_size = c.candidate_block_size;
          ctx.candidate_source_layer = c.candidate_source_layer;
          ctx.teacher_forced = forced;
          StepComparison sc2 = compare_step(a, b, ctx);
          vacuous += sc2.vacuous;
          cmp.items_compared += sc2.items;
          ++cmp.steps_compared;
          for (const std::string& n : sc2.notes) notes.insert(n);
          if (sc2.first_failure_row >= 0 && !cmp.first_divergence) {
            const MetricRow& r = sc2.rows[static_cast<size_t>(sc2.first_failure_row)];
            reports::Divergence d;
            d.step = r.step;
            d.session = r.session;
            d.position = r.position;
            d.layer = r.layer;
            d.component = r.component;
            d.metric = r.metric;
            d.value = r.value;
            d.tolerance = *r.tolerance;
            d.detail = sc2.first_failure_detail;
            std::ostringstream cmd;
            cmd << opt.rerun_prefix << " " << quote_arg(scenario_ref(sc)) << " --sides " << quote_arg(cmp.side_a + "," + cmp.side_b)
                << " --mode " << mode << " --stop-after-step " << r.step << " --save-tensors "
                << quote_arg("step=" + std::to_string(r.step) + ",layer=" + std::to_string(r.layer) +
                             ",component=" + r.component)
                << " -o rerun.h5";
            d.rerun = cmd.str();
            cmp.first_divergence = d;
            if (opt.save_failure_tensors) {
              Focus f;
              f.step = r.step;
              f.layer = r.layer;
              f.component = r.component;
              store_focus(cmp, f, step, a, b);
            }
          }
          if (opt.save_tensors) store_focus(cmp, *opt.save_tensors, step, a, b);
          cmp.rows.insert(cmp.rows.end(), sc2.rows.begin(), sc2.rows.end());
          if (probe) ++probes;
          if (probe && boundary.count(session)) {
            probe_rows(a, b, step, ctx.session, boundary.at(session), c, cmp.rows);
            ++probe_rows_seen;
          }
        };
        const auto run_step = [&](const std::string& session, const std::vector<int64_t>& tokens, const char* phase,
                                  bool probe) {
          const int64_t start = A.session(session).pos();
          StepCapture a = A.step(session, tokens, step, nullptr);
          StepCapture b = B.step(session, tokens, step, forced ? &a : nullptr);
          last_logits[session] = a.logits;
          record_step(session, phase, start, static_cast<int64_t>(tokens.size()), {});
          compare(session, a, b, probe);
          if (opt.stop_after_step >= 0 && step >= opt.stop_after_step) stop = true;
          ++step;
        };
        for (size_t e = 0; e < sc.events.size() && !stop; ++e) {
          const Event& ev = sc.events[e];
          if (opt.progress) {
            std::ostringstream p;
            p << sc.name << " [" << cmp.side_a << " vs " << cmp.side_b << ", " << mode << "] event " << e + 1 << "/"
              << sc.events.size() << " (step " << step << ")";
            opt.progress(p.str());
          }
          if (ev.kind == Event::kPrompt) {
            const std::vector<int64_t>& ids = plan.prompts[e];
            const int64_t n = static_cast<int64_t>(ids.size()), chunk = ev.chunk > 0 ? ev.chunk : n;
            for (int64_t first = 0; first < n && !stop; first += chunk) {
              const std::vector<int64_t> part(ids.begin() + first, ids.begin() + std::min(n, first + chunk));
              run_step(ev.session, part, "prefill", ev.probe);
            }
          } else if (ev.kind == Event::kDecode) {
            for (int64_t i = 0; i < ev.decode && !stop; ++i) {
              run_step(ev.session, {argmax(last_logits.at(ev.session))}, "decode", ev.probe);
            }
          } else {
            const int64_t pos = A.session(ev.session).pos();
            StepCapture a = A.resume(ev.session);
            StepCapture b = B.resume(ev.session);
            boundary[ev.session] = pos;
            record_step(ev.session, "resume", pos, 0, {"resume"});
            compare(ev.session, a, b, false);
            if (opt.stop_after_step >= 0 && step >= opt.stop_after_step) stop = true;
            ++step;
          }
        }
        steps_recorded = true;
        bool failed = false;
        for (const MetricRow& r : cmp.rows) failed = failed || r.verdict == Verdict::kFail;
        // Probe steps exist to measure recall on both sides of a resume boundary: without a
        // boundary, or when side A's selections never reach across it, the scenario has not
        // tested what it claims (missing evidence, never a pass).
        std::string probe_gap;
        if (probes > 0) {
          int64_t before = 0, after = 0;
          for (const MetricRow& r : cmp.rows) {
            if (r.metric == "probe_count[d<-W]" || r.metric == "probe_count[-W<=d<0]") before += static_cast<int64_t>(r.value);
            if (r.metric == "probe_count[0<=d<W]" || r.metric == "probe_count[d>=W]") after += static_cast<int64_t>(r.value);
          }
          if (boundary.empty() || probe_rows_seen == 0) {
            probe_gap = "probe steps ran without a resume boundary before them: recall by distance was not measured";
          } else if (before == 0 || after == 0) {
            probe_gap = "side A's probe selections did not straddle the resume boundary (" + std::to_string(before) +
                        " before, " + std::to_string(after) + " after it)";
          }
        }
        if (failed) {
          cmp.verdict = Verdict::kFail;
        } else if (cmp.items_compared == 0 || vacuous >= cmp.items_compared || !probe_gap.empty()) {
          cmp.verdict = Verdict::kInconclusive;
          cmp.notes.push_back(!probe_gap.empty()          ? probe_gap
                              : cmp.items_compared == 0   ? "nothing was compared"
                                                          : "every output was zero on both sides");
        } else {
          cmp.verdict = pair.expect == Expectation::kMeasured ? Verdict::kMeasured : Verdict::kPass;
        }
        if (!failed && pair.expect == Expectation::kMeasured) {
          // Where a measured pair first differs (informational: nothing is asserted).
          for (const MetricRow& r : cmp.rows) {
            if ((r.metric == "bit_equal_frac" || r.metric == "rows_equal_frac" || r.metric == "bytes_equal_frac" ||
                 r.metric == "equal_frac") && r.value < 1.0) {
              reports::Divergence d;
              d.step = r.step;
              d.session = r.session;
              d.position = r.position;
              d.layer = r.layer;
              d.component = r.component;
              d.metric = r.metric;
              d.value = r.value;
              d.tolerance.origin = "none";
              d.tolerance.higher_is_better = true;
              d.tolerance.bound = 1.0;
              d.tolerance.note = "measured pair: the first difference, not asserted";
              cmp.first_divergence = d;
              break;
            }
          }
        }
      } catch (const Error& err) {
        cmp.verdict = Verdict::kError;
        cmp.notes.push_back(std::string("error: ") + err.what());
      }
      for (const std::string& n : notes) cmp.notes.push_back(n);
      cmp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.comparisons.push_back(std::move(cmp));
    }
  }
  for (const std::string& n : sc.notes) {
    for (Comparison& cmp : out.comparisons) cmp.notes.push_back(n);
  }
  out.verdict = Verdict::kPass;
  for (const Comparison& cmp : out.comparisons) out.verdict = reports::worse(out.verdict, cmp.verdict);
  if (out.comparisons.empty()) out.verdict = Verdict::kInconclusive;
  return out;
}

}  // namespace dsv41::scenarios
