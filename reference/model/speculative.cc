#include "reference/model/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <optional>

#include "base/error.h"

namespace dsv41::reference::model {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double parse_real(const std::string& text, const std::string& spec) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  DSV41_CHECK(!text.empty() && end != nullptr && *end == '\0' && std::isfinite(v), "verify policy '", spec,
              "': '", text, "' is not a number");
  return v;
}

}  // namespace

VerifyPolicy VerifyPolicy::parse(const std::string& spec) {
  const size_t colon = spec.find(':');
  DSV41_CHECK(colon != std::string::npos, "verify policy '", spec, "': expected fixed:K, threshold:TAU or survival:S");
  const std::string kind = spec.substr(0, colon), value = spec.substr(colon + 1);
  VerifyPolicy p;
  if (kind == "fixed") {
    const double k = parse_real(value, spec);
    DSV41_CHECK(k >= 1 && k <= 64 && k == std::floor(k), "verify policy '", spec, "': K must be an integer in [1, 64]");
    p.kind = Kind::kFixed;
    p.k = static_cast<int>(k);
  } else if (kind == "threshold" || kind == "survival") {
    p.kind = kind == "threshold" ? Kind::kThreshold : Kind::kSurvival;
    p.threshold = parse_real(value, spec);
    DSV41_CHECK(p.threshold >= 0 && p.threshold <= 1, "verify policy '", spec, "': the threshold must be in [0, 1]");
  } else {
    DSV41_FAIL("verify policy '", spec, "': unknown kind '", kind, "' (fixed:K, threshold:TAU, survival:S)");
  }
  return p;
}

std::string VerifyPolicy::str() const {
  if (kind == Kind::kFixed) return "fixed:" + std::to_string(k);
  std::ostringstream o;
  o << std::setprecision(17) << (kind == Kind::kThreshold ? "threshold:" : "survival:") << threshold;
  return o.str();  // reads back as the same policy
}

int64_t VerifyPolicy::choose(const std::vector<float>& confidence_logits, int64_t n) const {
  if (n <= 0) return 0;
  if (kind == Kind::kFixed) return std::min<int64_t>(k, n);
  DSV41_CHECK(static_cast<int64_t>(confidence_logits.size()) >= n, "verify policy ", str(), ": ",
              confidence_logits.size(), " confidence values for ", n, " drafts");
  int64_t chosen = 0;
  double survival = 1;
  for (int64_t i = 0; i < n; ++i) {
    const double c = sigmoid(confidence_logits[static_cast<size_t>(i)]);
    survival *= c;
    if ((kind == Kind::kThreshold ? c : survival) < threshold) break;
    ++chosen;
  }
  return std::max<int64_t>(chosen, 1);
}

Acceptance accept_drafts(const std::vector<std::vector<double>>& p_target, const std::vector<int64_t>& drafts,
                         const std::vector<std::vector<double>>& p_draft, bool greedy, SampleRng& rng) {
  const int64_t k = static_cast<int64_t>(drafts.size());
  DSV41_CHECK(static_cast<int64_t>(p_target.size()) == k + 1, "accept_drafts: ", p_target.size(),
              " target rows for ", k, " drafts (want k + 1)");
  DSV41_CHECK(greedy || static_cast<int64_t>(p_draft.size()) == k, "accept_drafts: ", p_draft.size(),
              " draft distributions for ", k, " drafts");
  const size_t vocab = p_target.front().size();
  const auto argmax = [](const std::vector<double>& p) {
    return static_cast<int64_t>(std::max_element(p.begin(), p.end()) - p.begin());  // the lowest id among equal
  };
  Acceptance a;
  for (int64_t i = 0; i < k; ++i) {
    const std::vector<double>& pt = p_target[static_cast<size_t>(i)];
    const int64_t d = drafts[static_cast<size_t>(i)];
    DSV41_CHECK(d >= 0 && static_cast<size_t>(d) < vocab && pt.size() == vocab, "accept_drafts: draft ", i,
                " = ", d, " outside the vocab ", vocab);
    if (greedy) {
      const bool ok = d == argmax(pt);
      a.accept_prob.push_back(ok ? 1.0 : 0.0);
      if (!ok) {
        a.next_token = argmax(pt);
        return a;
      }
    } else {
      const std::vector<double>& pd = p_draft[static_cast<size_t>(i)];
      DSV41_CHECK(pd.size() == vocab, "accept_drafts: draft distribution ", i, " has ", pd.size(), " entries");
      const double prob = std::min(1.0, pt[static_cast<size_t>(d)] / std::max(pd[static_cast<size_t>(d)], 1e-8));
      a.accept_prob.push_back(prob);
      if (!(rng.uniform() < prob)) {  // rejected: resample from the residual
        std::vector<double> residual(vocab);
        double mass = 0;
        for (size_t j = 0; j < vocab; ++j) mass += residual[j] = std::max(0.0, pt[j] - pd[j]);
        a.next_token = sample_from(mass > 0 ? residual : pt, rng);
        return a;
      }
    }
    ++a.accepted;
  }
  const std::vector<double>& last = p_target.back();  // every draft accepted: the bonus token
  a.next_token = greedy ? argmax(last) : sample_from(last, rng);
  return a;
}

double confidence_of(float logit) { return sigmoid(double{logit}); }

Verification verify_drafts(const Model& model, ModelState& state, int64_t current, const std::vector<int64_t>& drafts,
                           const std::vector<std::vector<double>>& p_draft, const SamplingParams& sampling,
                           SampleRng& rng) {
  const ModelConfig& c = model.config();
  const int64_t k = static_cast<int64_t>(drafts.size());
  const bool greedy = sampling.temperature == 0;
  std::vector<int64_t> tokens = {current};
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  StepOptions step;
  step.all_logits = true;
  Verification v;
  v.step = model.forward_chunk(state, tokens, step);
  std::vector<std::vector<double>> p_target;
  for (int64_t i = 0; i <= k; ++i) p_target.push_back(target_distribution(v.step.all_logits.row(i), c.vocab_size, sampling));
  v.decision = accept_drafts(p_target, drafts, greedy ? std::vector<std::vector<double>>{} : p_draft, greedy, rng);
  return v;
}

void roll_back(const Model& model, ModelState& state, const ModelState& before, const std::vector<int64_t>& tokens,
               int64_t m, const RoundHooks& hooks) {
  const int64_t k = static_cast<int64_t>(tokens.size()) - 1;
  DSV41_CHECK(m >= 0 && m <= k, "roll_back: keep ", m, " of ", k, " drafts");
  DSV41_CHECK(state.pos == before.pos + k + 1, "roll_back: the state is at ", state.pos, ", not after the verify step (",
              before.pos + k + 1, ")");
  if (m == k) return;
  std::optional<ModelState> verified;
  if (hooks.rolled_back) verified = state;
  state = before;
  StepOptions replay;
  replay.hooks_off = true;
  model.forward_chunk(state, std::vector<int64_t>(tokens.begin(), tokens.begin() + m + 1), replay);
  if (hooks.rolled_back) hooks.rolled_back(state, *verified);
}

SpeculativeRound speculative_round(const Model& model, ModelState& state, int64_t current, const Proposal& proposal,
                                   const SpeculativeOptions& o, SampleRng& rng) {
  const bool greedy = o.sampling.temperature == 0;
  SpeculativeRound r;
  r.start_pos = state.pos;
  r.current = current;
  r.proposed = static_cast<int64_t>(proposal.tokens.size());
  DSV41_CHECK(greedy || proposal.probs.size() == proposal.tokens.size(), "speculative round: sampling needs the ",
              proposal.tokens.size(), " drafts' distributions, the proposal holds ", proposal.probs.size());
  const int64_t k = o.policy.choose(proposal.confidence_logits, r.proposed);
  r.verified.assign(proposal.tokens.begin(), proposal.tokens.begin() + k);
  double survival = 1;
  for (int64_t i = 0; i < k && i < static_cast<int64_t>(proposal.confidence_logits.size()); ++i) {
    r.confidence.push_back(confidence_of(proposal.confidence_logits[static_cast<size_t>(i)]));
    survival *= r.confidence.back();
    r.predicted_survival.push_back(survival);
  }
  const ModelState before = state;
  std::vector<std::vector<double>> p_draft;
  if (!greedy) p_draft.assign(proposal.probs.begin(), proposal.probs.begin() + k);
  Verification v = verify_drafts(model, state, current, r.verified, p_draft, o.sampling, rng);
  if (o.hooks.decided) o.hooks.decided(v, k);
  r.verify = std::move(v.step);
  r.accepted = v.decision.accepted;
  r.next_token = v.decision.next_token;
  r.accept_prob = std::move(v.decision.accept_prob);
  r.emitted.assign(r.verified.begin(), r.verified.begin() + r.accepted);
  r.emitted.push_back(r.next_token);
  std::vector<int64_t> tokens = {current};
  tokens.insert(tokens.end(), r.verified.begin(), r.verified.end());
  roll_back(model, state, before, tokens, r.accepted, o.hooks);
  return r;
}

}  // namespace dsv41::reference::model
