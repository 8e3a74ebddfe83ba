// bench/dspark_acceptance_run.cc: seeds, prompts, plain greedy and speculative decoding with DSpark
// drafts, collecting each round's observations (bench/dspark_acceptance.h).
#include <chrono>
#include <sstream>

#include "bench/dspark_acceptance.h"
#include "base/error.h"
#include "reference/ops/numerics.h"
#include "reference/ops/sampling.h"

namespace dsv41::bench {

using reference::model::DraftResult;
using reference::model::DraftSampling;
using reference::model::Model;
using reference::ModelConfig;
using reference::model::ModelState;
using reference::model::Proposal;
using reference::SampleRng;
using reference::model::SpeculativeOptions;
using reference::model::SpeculativeRound;
using reference::model::StepRecord;

uint64_t derive_seed(uint64_t seed, Stream stream, uint64_t weights, int64_t prompt, int64_t round) {
  uint64_t h = reference::splitmix64(seed);
  h = reference::splitmix64(h ^ static_cast<uint64_t>(stream));
  h = reference::splitmix64(h ^ weights);
  h = reference::splitmix64(h ^ static_cast<uint64_t>(prompt));
  return reference::splitmix64(h ^ static_cast<uint64_t>(round));
}

std::string seed_derivation_text() {
  return "seed(stream, w, p, r) = h(h(h(h(h(S) ^ stream) ^ w) ^ p) ^ r), h = SplitMix64's output function "
         "(x += 0x9e3779b97f4a7c15, then the two xor-shift-multiply steps); w = the weights seed (0 for --weights "
         "FILE), p = the prompt index, r = the prompt's round from 0; streams: 1 prompt tokens (w = 0, r = 0: every "
         "weights decodes the same prompts), 2 the first token after the prefill (r = 0, T > 0 only), 3 the round's "
         "DSpark draft (DraftSampling::seed), 4 the round's accept rule (SampleRng). Temperatures and policies share "
         "the seeds (common random numbers: policies differ only by what they verify).";
}

std::vector<std::vector<int64_t>> random_prompts(const ModelConfig& c, int64_t count, int64_t length, uint64_t seed) {
  DSV41_CHECK(c.vocab_size >= 2, "random prompts: the vocab (", c.vocab_size, ") needs at least 2 tokens");
  const uint64_t choices = static_cast<uint64_t>(c.vocab_size - 1);  // every id but the noise id
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t p = 0; p < count; ++p) {
    SampleRng rng(derive_seed(seed, Stream::kPrompt, 0, p, 0));
    std::vector<int64_t> prompt;  // [length] token ids
    for (int64_t t = 0; t < length; ++t) {
      int64_t id = static_cast<int64_t>(rng.next() % choices);
      if (c.n_mtp_layers > 0 && id >= c.dspark_noise_token_id) ++id;
      prompt.push_back(id);
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

namespace {

void check_length(const ModelConfig& c, int64_t prompt_len, int64_t tokens) {
  // The last round starts at prompt_len + tokens - 2 and drafts / verifies up to block - 1 beyond.
  const int64_t need = prompt_len + tokens + c.dspark_block_size;
  DSV41_CHECK(prompt_len >= 1 && tokens >= 1 && need <= c.max_seq_len, "decoding: a prompt of ", prompt_len,
              " tokens + ", tokens, " generated + the draft block ", c.dspark_block_size, " needs ", need,
              " positions; the config's max_seq_len is ", c.max_seq_len);
}

// The row of a [rows, vocab] fp32 tensor as a vector.
std::vector<float> row_of(const reference::Tensor<float>& t, int64_t row) {
  const float* r = t.row(row);
  return {r, r + t.dim(1)};
}

std::vector<float> to_float(const std::vector<double>& p) { return {p.begin(), p.end()}; }

}  // namespace

std::vector<int64_t> plain_greedy(const Model& model, const std::vector<int64_t>& prompt, int64_t tokens) {
  const ModelConfig& c = model.config();
  check_length(c, static_cast<int64_t>(prompt.size()), tokens);
  ModelState state = model.new_state();
  StepRecord step = model.prefill(state, prompt);
  std::vector<int64_t> out;  // [tokens]
  out.push_back(reference::argmax_token(step.logits.data(), c.vocab_size));
  while (static_cast<int64_t>(out.size()) < tokens) {
    step = model.decode(state, out.back());
    out.push_back(reference::argmax_token(step.logits.data(), c.vocab_size));
  }
  return out;
}

std::vector<int64_t> speculative_generate(const DecodeSetup& setup, const std::vector<int64_t>& prompt,
                                          int64_t prompt_index, AcceptanceStats& stats) {
  DSV41_CHECK(setup.model != nullptr, "speculative decoding: no model");
  const Model& model = *setup.model;
  const ModelConfig& c = model.config();
  DSV41_CHECK(c.n_mtp_layers > 0, "speculative decoding: the config has no DSpark blocks (n_mtp_layers = 0)");
  check_length(c, static_cast<int64_t>(prompt.size()), setup.tokens);
  const bool greedy = setup.sampling.temperature == 0;
  const auto t0 = std::chrono::steady_clock::now();

  ModelState state = model.new_state();
  const StepRecord prefill = model.prefill(state, prompt);
  int64_t current = 0;  // the token at state.pos: emitted, not yet run by the target
  if (greedy) {
    current = reference::argmax_token(prefill.logits.data(), c.vocab_size);
  } else {
    SampleRng first(derive_seed(setup.seed, Stream::kFirstToken, setup.weights_seed, prompt_index, 0));
    current = reference::sample_from(reference::target_distribution(prefill.logits.data(), c.vocab_size, setup.sampling),
                                     first);
  }
  std::vector<int64_t> generated = {current};

  SpeculativeOptions options;
  options.policy = setup.policy;
  options.sampling = setup.sampling;
  bool defect_fired = false;  // the planted defect's own record (the check below judges the tokens)
  options.hooks = scenarios::defects::round_defect_hooks(setup.defect, c, &defect_fired);
  for (int64_t round = 0; static_cast<int64_t>(generated.size()) < setup.tokens; ++round) {
    // The draft at T: block tokens, their distributions [B, vocab] and confidence logits [B].
    DraftSampling ds;
    ds.temperature = setup.sampling.temperature;
    ds.seed = derive_seed(setup.seed, Stream::kDraft, setup.weights_seed, prompt_index, round);
    const DraftResult draft = model.draft(state, current, ds);
    Proposal proposal;
    proposal.tokens = draft.tokens;
    proposal.confidence_logits = draft.confidence;
    if (!greedy) {
      for (int64_t i = 0; i < static_cast<int64_t>(draft.tokens.size()); ++i) {
        const float* p = draft.probs.row(i);
        proposal.probs.emplace_back(p, p + c.vocab_size);
      }
    }

    SampleRng accept_rng(derive_seed(setup.seed, Stream::kAccept, setup.weights_seed, prompt_index, round));
    const SpeculativeRound r = reference::model::speculative_round(model, state, current, proposal, options, accept_rng);
    const int64_t k = static_cast<int64_t>(r.verified.size());

    RoundObservation obs;
    obs.proposed = r.proposed;
    obs.verified = k;
    obs.accepted = r.accepted;
    obs.confidence = r.confidence;
    obs.survival = r.predicted_survival;
    DSV41_CHECK(static_cast<int64_t>(obs.confidence.size()) == k, "round ", round, " of prompt ", prompt_index,
                ": ", obs.confidence.size(), " confidence values for ", k, " verified drafts");
    for (int64_t i = 0; i < k && i <= r.accepted; ++i) {  // the decided drafts
      DecidedDraft d;
      d.position = static_cast<int>(i);
      d.prompt = prompt_index;
      d.confidence = r.confidence[static_cast<size_t>(i)];
      d.accepted = i < r.accepted;
      // The rule decided min(m + 1, k) drafts; a planted kAcceptOneMore keeps one it did not accept.
      d.accept_prob = i < static_cast<int64_t>(r.accept_prob.size()) ? r.accept_prob[static_cast<size_t>(i)] : 0.0;
      d.p_target = to_float(reference::target_distribution(r.verify.all_logits.row(i), c.vocab_size, setup.sampling));
      d.p_draft = row_of(draft.probs, i);
      stats.add_decided(std::move(d));
    }
    stats.add_round(std::move(obs));

    generated.insert(generated.end(), r.emitted.begin(), r.emitted.end());
    current = r.next_token;
  }
  const int64_t emitted = static_cast<int64_t>(generated.size()) - 1;  // by the rounds
  stats.add_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), emitted);
  generated.resize(static_cast<size_t>(setup.tokens));
  return generated;
}

}  // namespace dsv41::bench
