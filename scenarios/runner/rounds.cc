#include "scenarios/runner/rounds.h"

#include <cmath>
#include <limits>
#include <utility>

#include "base/error.h"
#include "reference/ops/sampling.h"

namespace dsv41::scenarios::runner {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The step index a backend gets for work inside a round that is not the round's own step (a
// lookahead, a plain side's one-token steps): no planted defect keys on it.
constexpr int64_t kNoStep = -1;

CapturedItem accept_item(const reference::model::Acceptance& d) {
  CapturedItem it;
  it.layer = -1;
  it.component = reference::model::name(reference::model::Component::kAccept);
  it.kind = CapturedItem::kIds;
  it.ids = {d.accepted, d.next_token};
  it.ids_shape = {2};
  return it;
}

// The candidate masks of a round compare on their reachable part (StepRecord::candidates): the
// pinned newest block of a row may extend past the row's reach by an amount that depends on where
// the step ends (a verify step ends k - m rows after the kept rows, a one-token step at the row).
void reachable_candidates(StepCapture& cap, const reference::model::StepRecord& rec) {
  for (CapturedItem& it : cap.items) {
    if (it.component != reference::model::name(reference::model::Component::kCandidates)) continue;
    const auto r = rec.candidates.find(it.layer);
    if (r != rec.candidates.end() && r->second.shape() == it.m.shape()) it.m = r->second;
  }
}

// A speculative side: one verify step, the own decision, the rollback to `keep` (or the decision).
RoundSide speculative(Backend& b, BackendSession& s, const RoundPlan& plan, std::optional<int64_t> keep,
                      const StepCapture* forced, int64_t step) {
  VerifyRequest req;
  req.current = plan.current;
  req.drafts = plan.drafts();
  if (plan.sampling.temperature > 0) req.p_draft.assign(plan.p_draft.begin(), plan.p_draft.begin() + plan.k);
  req.sampling = plan.sampling;
  req.seed = plan.seed;
  req.keep = keep;
  RoundSide out;
  const reference::model::ForwardHooks h = capture_hooks(out.verify, forced);
  VerifyResult v = b.verify(s, req, h, step);
  finish_capture(out.verify, v.step, {});
  reachable_candidates(out.verify, v.step);
  out.decision = v.decision;
  out.kept = v.kept;
  out.capture = first_rows(out.verify, v.kept + 1);
  const int64_t V = v.step.all_logits.dim(1);
  out.capture.logits.assign(v.step.all_logits.row(0), v.step.all_logits.row(0) + (v.kept + 1) * V);
  out.capture.logit_rows = v.kept + 1;
  return out;
}

// A plain side: the round's tokens one at a time. As side A it decodes while the drafts match its
// argmax (greedy decoding, counting how many drafts it reproduces); as side B it runs A's kept
// tokens and decides from what it ran.
RoundSide plain(Backend& b, BackendSession& s, const RoundPlan& plan, std::optional<int64_t> keep) {
  const std::vector<int64_t> drafts = plan.drafts();
  const int64_t k = plan.k;
  std::vector<StepCapture> steps;
  std::vector<int64_t> argmax;  // the argmax after each position run
  int64_t token = plan.current;
  for (int64_t i = 0;; ++i) {
    StepCapture cap;
    const reference::model::ForwardHooks h = capture_hooks(cap, nullptr);
    const reference::model::StepRecord rec = b.step(s, {token}, {}, h, kNoStep);
    finish_capture(cap, rec, {});
    reachable_candidates(cap, rec);
    argmax.push_back(reference::argmax_token(rec.logits.data(), static_cast<int64_t>(rec.logits.size())));
    steps.push_back(std::move(cap));
    const bool more = keep ? i < *keep : i < k && drafts[static_cast<size_t>(i)] == argmax.back();
    if (!more) break;
    token = drafts[static_cast<size_t>(i)];
  }
  const int64_t ran = static_cast<int64_t>(steps.size());  // positions run: kept + 1
  RoundSide out;
  out.kept = ran - 1;
  // The own decision from the argmaxes it has: d_i is accepted when it equals the argmax after
  // position i - 1; past what it ran (a draft A rejected and this side would accept), unknown.
  int64_t m = 0;
  while (m < k && m < ran && drafts[static_cast<size_t>(m)] == argmax[static_cast<size_t>(m)]) ++m;
  out.decision.accepted = m;
  out.decision.next_token = m < ran ? argmax[static_cast<size_t>(m)] : -1;
  for (int64_t i = 0; i < std::min(m + 1, k); ++i) out.decision.accept_prob.push_back(i < m ? 1.0 : 0.0);
  out.capture = concat_rows(steps);
  for (const StepCapture& c : steps) out.capture.logits.insert(out.capture.logits.end(), c.logits.begin(), c.logits.end());
  out.capture.logit_rows = ran;
  return out;
}

}  // namespace

DraftSide run_draft(Backend& backend, BackendSession& session, int64_t current, const SpeculateSpec& spec,
                    uint64_t draft_seed, const StepCapture* forced, int64_t step) {
  DraftSide out;
  reference::model::DraftSampling sampling;
  sampling.temperature = spec.temperature;
  sampling.seed = draft_seed;
  out.capture.start_pos = session.pos();
  out.capture.tokens = backend.config().dspark_block_size;
  out.result = backend.draft(session, current, sampling, capture_hooks(out.capture, forced), step);
  return out;
}

RoundPlan plan_round(Backend& backend, BackendSession& session, int64_t current, const SpeculateSpec& spec,
                     int64_t round, uint64_t seed, const reference::model::DraftResult* draft) {
  const int64_t vocab = backend.config().vocab_size;
  RoundPlan p;
  p.current = current;
  p.seed = seed;
  p.sampling.temperature = spec.temperature;
  p.sampling.top_p = spec.top_p;
  if (spec.drafter == SpeculateSpec::kLookahead) {
    // Side A's greedy continuation: the drafts a perfect greedy drafter proposes.
    std::unique_ptr<BackendSession> fork = backend.fork(session);
    int64_t token = current;
    for (int64_t i = 0; i < spec.lookahead; ++i) {
      const reference::model::StepRecord rec = backend.step(*fork, {token}, {}, {}, kNoStep);
      token = reference::argmax_token(rec.logits.data(), static_cast<int64_t>(rec.logits.size()));
      p.proposal.push_back(token);
    }
  } else {
    DSV41_CHECK(draft != nullptr, "speculate: dspark drafts need side A's draft");
    p.proposal = draft->tokens;
    p.confidence_logits = draft->confidence;
    if (spec.temperature > 0) {  // the distributions the drafts were drawn from (fp32 -> double, exact)
      for (int64_t i = 0; i < draft->probs.dim(0); ++i) {
        p.p_draft.emplace_back(draft->probs.row(i), draft->probs.row(i) + draft->probs.dim(1));
      }
    }
  }
  if (!spec.reject_at.empty()) {
    const int64_t at = spec.reject_at[static_cast<size_t>(round % static_cast<int64_t>(spec.reject_at.size()))];
    if (at >= 0 && at < static_cast<int64_t>(p.proposal.size())) {
      p.proposal[static_cast<size_t>(at)] = (p.proposal[static_cast<size_t>(at)] + 1) % vocab;
      p.corrupted = at;
    }
  }
  p.k = reference::model::VerifyPolicy::parse(spec.policy).choose(p.confidence_logits, static_cast<int64_t>(p.proposal.size()));
  return p;
}

RoundSide run_round(Backend& backend, BackendSession& session, const RoundPlan& plan, bool plain_side,
                    std::optional<int64_t> keep, const StepCapture* forced, int64_t step) {
  DSV41_CHECK(!plain_side || plan.sampling.temperature == 0, "a plain side decodes greedily: speculative sampling "
              "preserves the target distribution, not the tokens");
  DSV41_CHECK(!plain_side || forced == nullptr, "teacher forcing needs the same steps on both sides: a plain side "
              "runs one-token steps where a speculative side runs one verify step");
  RoundSide out = plain_side ? plain(backend, session, plan, keep) : speculative(backend, session, plan, keep, forced, step);
  out.capture.items.push_back(accept_item(out.decision));
  out.capture.caches = backend.caches(session);
  return out;
}

std::vector<reports::AcceptanceRow> acceptance_rows(const RoundPlan& plan, const RoundSide& side,
                                                    const std::string& which, int64_t step, int session,
                                                    int64_t start_pos) {
  reports::AcceptanceRow base;
  base.step = step;
  base.session = session;
  base.side = which;
  base.start_pos = start_pos;
  base.proposed = static_cast<int64_t>(plan.proposal.size());
  base.verified = plan.k;
  base.accepted = side.decision.accepted;
  base.kept = side.kept;
  base.next_token = side.decision.next_token;
  std::vector<reports::AcceptanceRow> rows;
  if (plan.proposal.empty()) {
    reports::AcceptanceRow r = base;
    r.draft_index = -1;
    r.confidence = r.predicted_survival = r.accept_prob = kNaN;
    r.realised = -1;
    rows.push_back(r);
    return rows;
  }
  double survival = 1;
  for (size_t i = 0; i < plan.proposal.size(); ++i) {
    reports::AcceptanceRow r = base;
    r.draft_index = static_cast<int64_t>(i);
    r.draft_token = plan.proposal[i];
    if (i < plan.confidence_logits.size()) {
      r.confidence = reference::model::confidence_of(plan.confidence_logits[i]);
      survival *= r.confidence;
      r.predicted_survival = survival;
    } else {
      r.confidence = r.predicted_survival = kNaN;
    }
    const int64_t idx = static_cast<int64_t>(i);
    const bool decided = idx < static_cast<int64_t>(side.decision.accept_prob.size());
    r.accept_prob = decided ? side.decision.accept_prob[i] : kNaN;
    r.realised = idx >= plan.k ? -1 : idx < side.decision.accepted ? 1 : decided ? 0 : -1;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace dsv41::scenarios::runner
