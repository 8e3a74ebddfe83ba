// scenarios/runner/forward_generate.cc: `dsv41 forward --generate` (scenarios/runner/forward_generate.h).
#include "scenarios/runner/forward_generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "base/error.h"
#include "reference/ops/numerics.h"

namespace dsv41::scenarios::runner {

using reference::ModelConfig;
using reference::model::StepRecord;
using reference::Tensor;

namespace {

double parse_number(const std::string& text, const char* option, const std::string& whole) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0') {
    DSV41_FAIL(option, " '", whole, "': '", text, "' is not a number");
  }
  return v;
}

// Rows [0, rows) and columns [0, cols) of a [T, width] tensor (cols clamped to the width).
template <typename T>
Tensor<T> cut(const Tensor<T>& x, int64_t rows, int64_t cols) {
  cols = std::min(cols, x.dim(1));
  Tensor<T> out({rows, cols}, x.name());
  for (int64_t t = 0; t < rows; ++t) std::copy(x.row(t), x.row(t) + cols, out.row(t));
  return out;
}

// A verify step's records cut to its first `rows` positions (the tokens the round kept): what a
// step over those tokens alone records. /topk widths and /candidates columns are cut to the kept
// end's reach (the cut entries of kept rows are padding: -1 / 0).
StepRecord kept_rows(const StepRecord& r, int64_t rows, const ModelConfig& c) {
  DSV41_CHECK(rows >= 1 && rows <= r.tokens && r.all_logits.rank() == 2 && r.all_logits.dim(0) == r.tokens,
              "generate: keep ", rows, " of a verify step's ", r.tokens, " rows (all logits ",
              r.all_logits.rank() == 2 ? r.all_logits.dim(0) : 0, ")");
  const int64_t end = r.start_pos + rows;
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  const auto reach = [&](int layer) {  // compressed positions a query before `end` can see
    return end / std::max(schedule[static_cast<size_t>(layer)].ratio, 1);
  };
  StepRecord out;
  out.start_pos = r.start_pos;
  out.tokens = rows;
  out.logits.assign(r.all_logits.row(rows - 1), r.all_logits.row(rows - 1) + c.vocab_size);
  out.all_logits = cut(r.all_logits, rows, c.vocab_size);  // [rows, vocab]: one per fed position
  for (const auto& [l, x] : r.topk) out.topk.emplace(l, cut(x, rows, std::min<int64_t>(c.index_topk, reach(l))));
  for (const auto& [l, x] : r.candidates) out.candidates.emplace(l, cut(x, rows, reach(l)));
  for (const auto& [l, x] : r.engram_ids) out.engram_ids.emplace(l, cut(x, rows, x.dim(1)));
  for (const auto& [l, x] : r.experts) out.experts.emplace(l, cut(x, rows, x.dim(1)));
  return out;
}

// The proposal of the first `n` drafts of a DSpark draft.
reference::model::Proposal proposal_of(const reference::model::DraftResult& d, int64_t n) {
  reference::model::Proposal p;
  p.tokens.assign(d.tokens.begin(), d.tokens.begin() + n);
  for (int64_t i = 0; i < n; ++i) p.probs.emplace_back(d.probs.row(i), d.probs.row(i) + d.probs.dim(1));
  p.confidence_logits.assign(d.confidence.begin(), d.confidence.begin() + n);
  return p;
}

}  // namespace

reference::model::VerifyPolicy parse_speculative(const std::string& text) {
  const bool integer = !text.empty() && std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  try {
    return reference::model::VerifyPolicy::parse(integer ? "fixed:" + text : text);
  } catch (const Error& e) {
    DSV41_FAIL("--speculative '", text, "': ", e.what(), " (an integer K means fixed:K)");
  }
}

reference::SamplingParams parse_sampling(const std::string& text) {
  const size_t comma = text.find(',');
  reference::SamplingParams s;
  s.temperature = parse_number(text.substr(0, comma), "--sampling", text);
  if (comma != std::string::npos) s.top_p = parse_number(text.substr(comma + 1), "--sampling", text);
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    DSV41_FAIL("--sampling '", text, "': temperature ", s.temperature, " (want a finite value >= 0; 0 is greedy)");
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) DSV41_FAIL("--sampling '", text, "': top-p ", s.top_p, " (want a value in (0, 1])");
  return s;
}

uint64_t split_seed(uint64_t s, uint64_t i) { return reference::splitmix64(s, i); }

GenerationRun generate(const reference::model::Model& model, reference::model::ModelState& state,
                       const std::vector<float>* prompt_logits, std::optional<int64_t> first_token,
                       const GenerateOptions& o, const GenerateObserver& observer) {
  const ModelConfig& c = model.config();
  DSV41_CHECK(o.tokens >= 1, "--generate ", o.tokens, ": at least one token");
  DSV41_CHECK((prompt_logits != nullptr) != first_token.has_value(),
              "generate: give the prompt's logits or the first token, not both or neither");
  const bool greedy = o.sampling.temperature == 0;
  reference::SampleRng token_rng(token_seed(o.seed));
  const auto pick = [&](const float* logits) {
    return greedy ? reference::argmax_token(logits, c.vocab_size)
                  : reference::sample_from(reference::target_distribution(logits, c.vocab_size, o.sampling), token_rng);
  };
  GenerationRun run;
  int64_t current = 0;
  if (prompt_logits != nullptr) {
    current = pick(prompt_logits->data());
    run.generated.push_back(current);
  } else {
    current = *first_token;
  }
  while (static_cast<int64_t>(run.generated.size()) < o.tokens) {
    const int64_t remaining = o.tokens - static_cast<int64_t>(run.generated.size());
    if (!o.speculative) {
      if (observer.before_step) observer.before_step();
      run.steps.push_back(model.decode(state, current));
      if (observer.after_step) observer.after_step(run.steps.back(), {current}, 1);
      run.fed.push_back(current);
      current = pick(run.steps.back().logits.data());
      run.generated.push_back(current);
      continue;
    }
    RoundRecord rec;
    const uint64_t r = run.rounds.size();
    rec.draft_seed = draft_seed(o.seed, r);
    rec.accept_seed = accept_seed(o.seed, r);
    rec.start_pos = state.pos;
    rec.current = current;
    const reference::model::DraftResult draft =
        model.draft(state, current, reference::model::DraftSampling{o.sampling.temperature, rec.draft_seed});
    // Offer at most remaining - 1 drafts: the round emits at most k + 1 <= remaining tokens.
    const int64_t offered = std::min<int64_t>(static_cast<int64_t>(draft.tokens.size()), remaining - 1);
    const reference::model::Proposal proposal = proposal_of(draft, offered);
    reference::model::SpeculativeOptions so;
    so.policy = *o.speculative;
    so.sampling = o.sampling;
    reference::SampleRng rng(rec.accept_seed);
    if (observer.before_step) observer.before_step();
    reference::model::SpeculativeRound round = reference::model::speculative_round(model, state, current, proposal, so, rng);
    if (observer.after_step) {
      std::vector<int64_t> ran = {current};
      ran.insert(ran.end(), round.verified.begin(), round.verified.end());
      observer.after_step(round.verify, ran, round.accepted + 1);
    }
    rec.drafts = proposal.tokens;
    double survival = 1;
    for (float z : proposal.confidence_logits) {
      rec.confidence.push_back(reference::model::confidence_of(z));
      survival *= rec.confidence.back();
      rec.survival.push_back(survival);
    }
    rec.verified = static_cast<int64_t>(round.verified.size());
    rec.accepted = round.accepted;
    rec.next_token = round.next_token;
    rec.accept_prob = round.accept_prob;
    run.steps.push_back(kept_rows(round.verify, round.accepted + 1, c));
    run.fed.push_back(current);
    run.fed.insert(run.fed.end(), round.verified.begin(), round.verified.begin() + round.accepted);
    run.generated.insert(run.generated.end(), round.emitted.begin(), round.emitted.end());
    current = round.next_token;
    run.rounds.push_back(std::move(rec));
  }
  DSV41_CHECK(static_cast<int64_t>(run.generated.size()) == o.tokens, "generate: ", run.generated.size(),
              " tokens generated, ", o.tokens, " asked for");
  run.pending = current;
  return run;
}

void write_generation(reports::H5Writer& w, const GenerationRun& run, const GenerateOptions& o, const ModelConfig& c) {
  w.write("/generated", run.generated, {static_cast<int64_t>(run.generated.size())});
  w.attr("/generated", "pending_token", run.pending);
  w.attr("/generated", "seed", o.seed);
  w.attr("/generated", "temperature", o.sampling.temperature);
  w.attr("/generated", "top_p", o.sampling.top_p);
  if (!o.speculative) return;
  const int64_t R = static_cast<int64_t>(run.rounds.size()), B = c.dspark_block_size;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<int64_t> start_pos, proposed, verified, accepted, next_token, drafts(static_cast<size_t>(R * B), -1);
  std::vector<uint64_t> dseeds, aseeds;
  std::vector<double> confidence(static_cast<size_t>(R * B), nan), survival(confidence), accept_prob(confidence);
  std::vector<int32_t> realised(static_cast<size_t>(R * B), -1);
  for (int64_t r = 0; r < R; ++r) {
    const RoundRecord& x = run.rounds[static_cast<size_t>(r)];
    start_pos.push_back(x.start_pos);
    proposed.push_back(static_cast<int64_t>(x.drafts.size()));
    verified.push_back(x.verified);
    accepted.push_back(x.accepted);
    next_token.push_back(x.next_token);
    dseeds.push_back(x.draft_seed);
    aseeds.push_back(x.accept_seed);
    for (size_t i = 0; i < x.drafts.size(); ++i) {
      const size_t at = static_cast<size_t>(r * B) + i;
      drafts[at] = x.drafts[i];
      confidence[at] = x.confidence[i];
      survival[at] = x.survival[i];
      const int64_t j = static_cast<int64_t>(i);
      realised[at] = j < x.accepted ? 1 : (j == x.accepted && j < x.verified ? 0 : -1);
      if (i < x.accept_prob.size()) accept_prob[at] = x.accept_prob[i];
    }
  }
  const std::vector<int64_t> rows = {R}, grid = {R, B};
  w.write("/speculative/start_pos", start_pos, rows);
  w.write("/speculative/proposed", proposed, rows);
  w.write("/speculative/verified", verified, rows);
  w.write("/speculative/accepted", accepted, rows);
  w.write("/speculative/next_token", next_token, rows);
  w.write("/speculative/draft_seed", dseeds, rows);
  w.write("/speculative/accept_seed", aseeds, rows);
  w.write("/speculative/draft_tokens", drafts, grid);
  w.write("/speculative/confidence", confidence, grid);
  w.write("/speculative/predicted_survival", survival, grid);
  w.write("/speculative/accept_prob", accept_prob, grid);
  w.write("/speculative/realised", realised, grid);
  w.attr("/speculative", "policy", o.speculative->str());
  w.attr("/speculative", "block_size", B);
  w.attr("/speculative", "rounds", R);
}

std::string speculative_summary(const GenerationRun& run, const GenerateOptions& o) {
  const double R = static_cast<double>(run.rounds.size());
  double accepted = 0;
  for (const RoundRecord& x : run.rounds) accepted += static_cast<double>(x.accepted);
  const double mean = R > 0 ? accepted / R : 0, per_round = R > 0 ? (accepted + R) / R : 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "speculative %s: %lld rounds, mean accepted length %.4g, %.4g tokens/round",
                o.speculative ? o.speculative->str().c_str() : "(none)", static_cast<long long>(run.rounds.size()),
                mean, per_round);
  return buf;
}

}  // namespace dsv41::scenarios::runner
