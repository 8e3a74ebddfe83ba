#include "scenarios/runner/replay_study.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace dsv41::scenarios::runner {
namespace {

using reference::model::Model;
using reference::model::ModelState;
using reference::model::StepRecord;
using reference::Tensor;

std::vector<int64_t> random_tokens(uint64_t seed, int64_t n, int64_t vocab) {
  std::vector<int64_t> out;
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out.push_back(static_cast<int64_t>((z ^ (z >> 31)) % static_cast<uint64_t>(vocab)));
  }
  return out;
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t first, int64_t n) {
  return {v.begin() + first, v.begin() + first + n};
}

// One step of a run, with every layer's output stream captured through the model's hooks.
struct Captured {
  StepRecord rec;
  std::map<int, std::vector<float>> streams;
};

Captured step(Model& m, ModelState& s, const std::vector<int64_t>& tokens) {
  Captured c;
  reference::model::ForwardHooks h;
  h.tensor = [&c](reference::model::Component what, int layer, Tensor<float>& v) {
    if (what == reference::model::Component::kOutStream) c.streams[layer] = v.data();
  };
  m.set_hooks(std::move(h));
  c.rec = m.forward_chunk(s, tokens);
  m.set_hooks({});
  return c;
}

// A global-only resume: the SWA rings are lost and rebuilt from the last window of tokens.
void resume(const Model& m, ModelState& s, const std::vector<int64_t>& history) {
  const int64_t n = std::min<int64_t>(s.pos, m.config().window_size);
  m.replay_local_state(s, slice(history, s.pos - n, n));
}

double jaccard(const int32_t* a, const int32_t* b, int64_t k) {
  std::set<int32_t> sa, sb;
  for (int64_t j = 0; j < k; ++j) {
    if (a[j] >= 0) sa.insert(a[j]);
    if (b[j] >= 0) sb.insert(b[j]);
  }
  if (sa.empty() && sb.empty()) return 1.0;
  int64_t inter = 0;
  for (int32_t v : sa) inter += sb.count(v);
  return static_cast<double>(inter) / static_cast<double>(sa.size() + sb.size() - inter);
}

ReplayStepResult compare(const Captured& ref, const Captured& got, int n_layers) {
  ReplayStepResult r;
  const std::vector<float>& p = ref.rec.logits;
  const std::vector<float>& q = got.rec.logits;
  DSV41_CHECK(p.size() == q.size() && !p.empty(), "replay study: logits of different sizes");
  double pmax = p[0], qmax = q[0];
  size_t parg = 0, qarg = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    DSV41_CHECK(std::isfinite(p[i]) && std::isfinite(q[i]), "replay study: non-finite logit at ", i);
    r.logit_max_abs = std::max(r.logit_max_abs, std::fabs(double{p[i]} - q[i]));
    if (p[i] > pmax) pmax = p[parg = i];
    if (q[i] > qmax) qmax = q[qarg = i];
  }
  r.top1_equal = parg == qarg;
  double zp = 0, zq = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    zp += std::exp(double{p[i]} - pmax);
    zq += std::exp(double{q[i]} - qmax);
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const double lp = double{p[i]} - pmax - std::log(zp), lq = double{q[i]} - qmax - std::log(zq);
    r.kl += std::exp(lp) * (lp - lq);
  }
  for (const auto& [layer, a] : ref.rec.topk) {
    const Tensor<int32_t>& b = got.rec.topk.at(layer);
    double sum = 0;
    for (int64_t t = 0; t < a.dim(0); ++t) sum += jaccard(a.row(t), b.row(t), a.dim(1));
    r.topk_jaccard.emplace_back(layer, a.dim(0) ? sum / static_cast<double>(a.dim(0)) : 1.0);
  }
  for (int l = 0; l < n_layers; ++l) {
    const std::vector<float>& a = ref.streams.at(l);
    const std::vector<float>& b = got.streams.at(l);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
      den += double{a[i]} * a[i];
    }
    r.stream_nmse.push_back(den > 0 ? num / den : num);
  }
  return r;
}

}  // namespace

std::vector<ReplayStepResult> run_replay_study(Model& model, const ReplayStudyOptions& opt) {
  const reference::ModelConfig& c = model.config();
  const int64_t L = opt.length > 0 ? opt.length : 3 * int64_t{c.window_size};
  const int64_t total = L + std::max<int64_t>(opt.steps, opt.turns * opt.turn_len);
  DSV41_CHECK(total <= c.max_seq_len, "replay study: ", total, " positions exceed max_seq_len ", c.max_seq_len);
  const std::vector<int64_t> tokens = random_tokens(opt.token_seed, total, c.vocab_size);
  std::vector<ReplayStepResult> out;
  const int cases = static_cast<int>(opt.resumptions.size()) + opt.turns;
  int done = 0;
  const auto report = [&](const std::string& what) {
    if (opt.progress) opt.progress(done, cases, what);
  };

  for (int k : opt.resumptions) {
    DSV41_CHECK(k >= 1 && k < L, "replay study: ", k, " resumptions do not fit a prompt of ", L);
    report(std::to_string(k) + " resumption" + (k == 1 ? "" : "s") + ": prompt of " + std::to_string(L) +
           " tokens, then " + std::to_string(opt.steps) + " decode steps");
    ModelState ref = model.new_state(), res = model.new_state();
    int64_t at = 0;
    for (int i = 1; i <= k + 1; ++i) {
      const int64_t next = i <= k ? L * i / (k + 1) : L;
      if (next == at) continue;
      if (at > 0) resume(model, res, tokens);
      model.forward_chunk(ref, slice(tokens, at, next - at));
      model.forward_chunk(res, slice(tokens, at, next - at));
      at = next;
    }
    for (int sidx = 0; sidx < opt.steps; ++sidx) {
      const std::vector<int64_t> t = slice(tokens, L + sidx, 1);
      const Captured a = step(model, ref, t), b = step(model, res, t);
      ReplayStepResult r = compare(a, b, c.n_layers);
      r.experiment = "resumptions";
      r.resumptions = k;
      r.step = sidx + 1;
      out.push_back(std::move(r));
    }
    ++done;
  }

  ModelState ref = model.new_state(), res = model.new_state();
  model.forward_chunk(ref, slice(tokens, 0, L));
  model.forward_chunk(res, slice(tokens, 0, L));
  for (int turn = 0; turn < opt.turns; ++turn) {
    report("follow-up turn " + std::to_string(turn + 1) + "/" + std::to_string(opt.turns) + " (" +
           std::to_string(opt.turn_len) + " tokens after a resume)");
    resume(model, res, tokens);
    const std::vector<int64_t> t = slice(tokens, L + turn * opt.turn_len, opt.turn_len);
    const Captured a = step(model, ref, t), b = step(model, res, t);
    ReplayStepResult r = compare(a, b, c.n_layers);
    r.experiment = "turns";
    r.resumptions = turn + 1;
    r.step = turn + 1;
    out.push_back(std::move(r));
    ++done;
  }
  report("");
  return out;
}

std::string replay_study_markdown(const std::vector<ReplayStepResult>& rs) {
  std::ostringstream os;
  os << "| experiment | resumptions | step | logits max abs diff | KL (nats) | top-1 equal | "
        "top-k Jaccard (mean over indexer layers) | worst layer stream NMSE |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  char buf[256];
  for (const ReplayStepResult& r : rs) {
    double jac = 0;
    for (const auto& [l, j] : r.topk_jaccard) jac += j;
    jac = r.topk_jaccard.empty() ? 1.0 : jac / static_cast<double>(r.topk_jaccard.size());
    const double worst = r.stream_nmse.empty() ? 0 : *std::max_element(r.stream_nmse.begin(), r.stream_nmse.end());
    std::snprintf(buf, sizeof buf, "| %s | %d | %d | %.4g | %.3g | %s | %.3f | %.3g |\n", r.experiment.c_str(),
                  r.resumptions, r.step, r.logit_max_abs, r.kl, r.top1_equal ? "yes" : "no", jac, worst);
    os << buf;
  }
  return os.str();
}

std::string replay_study_json(const std::vector<ReplayStepResult>& rs) {
  std::ostringstream os;
  os.precision(9);
  os << "[";
  for (size_t i = 0; i < rs.size(); ++i) {
    const ReplayStepResult& r = rs[i];
    os << (i ? ",\n " : "\n ") << "{\"experiment\": \"" << r.experiment << "\", \"resumptions\": " << r.resumptions
       << ", \"step\": " << r.step << ", \"logit_max_abs\": " << r.logit_max_abs << ", \"kl\": " << r.kl
       << ", \"top1_equal\": " << (r.top1_equal ? "true" : "false") << ", \"topk_jaccard\": {";
    for (size_t j = 0; j < r.topk_jaccard.size(); ++j) {
      os << (j ? ", " : "") << "\"layer" << r.topk_jaccard[j].first << "\": " << r.topk_jaccard[j].second;
    }
    os << "}, \"stream_nmse\": [";
    for (size_t j = 0; j < r.stream_nmse.size(); ++j) os << (j ? ", " : "") << r.stream_nmse[j];
    os << "]}";
  }
  os << "\n]\n";
  return os.str();
}

}  // namespace dsv41::scenarios::runner
