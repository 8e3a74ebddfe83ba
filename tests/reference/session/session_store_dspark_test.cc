// reference/session/session_store with DSpark (format 3, docs/session-store.md): a session saved in the
// middle of speculative decoding carries its DSpark rings (section kind 7), so after a full resume
// the rings are the never-paused ones bit for bit, the next Model::draft is identical (tokens,
// logits, probabilities and confidence as bits, greedy and sampled), and the speculative rounds
// after it emit the same tokens with the same verify logits. A global-only resume rebuilds the
// DSpark rings by encoder replay: exact for a session no longer than the window, else the rings
// (and drafts) of Model::replay_local_state on the in-memory state. A file saved without its
// local state loads with empty DSpark rings, and a draft on it is refused.
//
// Model: the tiny config with the official oracle weights (window 64, one DSpark block of 5) and
// the oracle prompt tokens. Sampled drafts use the printed data seed (DSV41_SEED overrides).
#include "reference/ops/sampling.h"
#include "reference/model/speculative.h"
#include "tests/support/session_store_util.h"

namespace dsv41::reference::session {
namespace {

// Every DSpark ring's stored bytes and slot positions.
std::vector<uint8_t> dspark_rings(const model::ModelState& s) {
  std::vector<uint8_t> out;
  for (const model::WindowKvRing& ring : s.dspark_window_kv) {
    out.insert(out.end(), ring.bytes.data().begin(), ring.bytes.data().end());
    const auto* p = reinterpret_cast<const uint8_t*>(ring.positions.data());
    out.insert(out.end(), p, p + ring.positions.size() * sizeof(int64_t));
  }
  return out;
}

// A draft's outputs as bits: tokens, logits, probabilities, confidence logits.
std::vector<uint32_t> draft_bits(const model::DraftResult& r) {
  std::vector<uint32_t> out;
  for (int64_t t : r.tokens) out.push_back(static_cast<uint32_t>(t));
  for (float v : r.logits.data()) out.push_back(f32_bits(v));
  for (float v : r.probs.data()) out.push_back(f32_bits(v));
  for (float v : r.confidence) out.push_back(f32_bits(v));
  return out;
}

// A draft is finite and not all zero (checked before two drafts are compared).
void expect_draft_is_real(const model::DraftResult& r) {
  ASSERT_FALSE(r.tokens.empty());
  bool nonzero = false;
  for (float v : r.logits.data()) {
    ASSERT_TRUE(std::isfinite(v)) << "non-finite draft logit";
    nonzero |= v != 0.0f;
  }
  for (float v : r.confidence) ASSERT_TRUE(std::isfinite(v)) << "non-finite confidence logit";
  ASSERT_TRUE(nonzero) << "all-zero draft logits";
}

// A ring that holds real entries: some slot filled, some byte non-zero.
void expect_rings_are_real(const model::ModelState& s) {
  ASSERT_EQ(s.dspark_window_kv.size(), 1u);
  const model::WindowKvRing& ring = s.dspark_window_kv[0];
  EXPECT_TRUE(std::any_of(ring.positions.begin(), ring.positions.end(), [](int64_t p) { return p >= 0; }));
  EXPECT_TRUE(std::any_of(ring.bytes.data().begin(), ring.bytes.data().end(), [](uint8_t b) { return b != 0; }));
}

model::Proposal proposal_of(const model::DraftResult& d) {
  model::Proposal p;
  p.tokens = d.tokens;
  for (int64_t i = 0; i < d.probs.dim(0); ++i) {
    p.probs.emplace_back(d.probs.row(i), d.probs.row(i) + d.probs.dim(1));
  }
  p.confidence_logits = d.confidence;
  return p;
}

// A session in the middle of speculative decoding: a prefill of `prompt` oracle tokens, then
// `rounds` greedy fixed:3 rounds drafted by Model::draft. `current` is the emitted token the
// target has not run yet (what the next draft continues).
struct Speculating {
  model::ModelState state;
  int64_t current = -1;
  int64_t emitted = 0;
};

// `rounds` more greedy fixed:3 rounds; returns the emitted tokens. On the oracle's random
// weights the DSpark drafts are (almost) never accepted, so every other round (r even) offers the
// target's own greedy token as its first draft (computed on a copy): those rounds keep at least
// two tokens, the others roll back to one.
std::vector<int64_t> advance(Speculating& s, int rounds) {
  const model::Model& m = *fixture().model;
  model::SpeculativeOptions o;
  o.policy = model::VerifyPolicy::parse("fixed:3");
  SampleRng unused(0);
  std::vector<int64_t> out;
  for (int r = 0; r < rounds; ++r) {
    model::Proposal p = proposal_of(m.draft(s.state, s.current));
    if (r % 2 == 0) {
      model::ModelState copy = s.state;
      p.tokens[0] = argmax_token(m.decode(copy, s.current).logits.data(), fixture().config.vocab_size);
    }
    const model::SpeculativeRound round = speculative_round(m, s.state, s.current, p, o, unused);
    if (r % 2 == 0) {
      EXPECT_GE(round.accepted, 1);
    }
    out.insert(out.end(), round.emitted.begin(), round.emitted.end());
    s.current = round.next_token;
  }
  s.emitted += static_cast<int64_t>(out.size());
  return out;
}

Speculating speculate(int64_t prompt, int rounds) {
  const model::Model& m = *fixture().model;
  Speculating s{m.new_state(), -1, 0};
  s.current = argmax_token(m.forward_chunk(s.state, tokens(0, prompt)).logits.data(), fixture().config.vocab_size);
  advance(s, rounds);
  return s;
}

class SessionStoreDSpark : public ScratchTest {};

// Full resume mid-speculation == never pausing: rings, drafts (greedy and sampled), and the
// rounds after it. Paused before the window wraps (37 + rounds) and after (77 + rounds).
TEST_F(SessionStoreDSpark, FullResumeDraftsAsNeverPausing) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  ASSERT_EQ(c.n_mtp_layers, 1);
  const uint64_t seed = test::seed_for("session_store_dspark/draft");
  std::printf("[dsv41] sampled draft seed %llu\n", static_cast<unsigned long long>(seed));
  for (int64_t prompt : {37, 77}) {
    SCOPED_TRACE("prefill of " + std::to_string(prompt) + " tokens");
    Speculating live = speculate(prompt, 3);
    ASSERT_GT(live.emitted, 3);  // some draft was accepted (rounds 0 and 2)
    expect_rings_are_real(live.state);
    const std::string path = scratch() + "/speculating.dsv41s";
    save_session(path, live.state, c, true);
    const std::vector<uint8_t> file = read_file(path);
    const size_t i = find_section(file, SessionSection::kDSparkRing, c.n_layers);
    EXPECT_EQ(get_u32(file, table_entry(i) + 12), 140u);  // 8 + 128 FP8 values + 4 E8M0 scales
    EXPECT_EQ(get_u64(file, table_entry(i) + 24), 64u);

    LoadedSession l = load_session(path, c, *f.model);
    ASSERT_EQ(l.state.pos, live.state.pos);
    EXPECT_EQ(dspark_rings(l.state), dspark_rings(live.state)) << "DSpark rings";
    EXPECT_EQ(carried_state(l.state, c, true), carried_state(live.state, c, true));
    EXPECT_EQ(session_bytes(l.state, c, true), file) << "saving the loaded state writes the same file";

    for (const model::DraftSampling& how : {model::DraftSampling{0.0, 0}, model::DraftSampling{0.8, seed}}) {
      SCOPED_TRACE("draft temperature " + std::to_string(how.temperature));
      const model::DraftResult want = f.model->draft(live.state, live.current, how);
      const model::DraftResult got = f.model->draft(l.state, live.current, how);
      expect_draft_is_real(want);
      EXPECT_EQ(draft_bits(got), draft_bits(want));
    }
    // The rounds after the resume: the same tokens, verify logits and rings.
    Speculating resumed{std::move(l.state), live.current, 0};
    EXPECT_EQ(advance(resumed, 2), advance(live, 2));
    EXPECT_EQ(dspark_rings(resumed.state), dspark_rings(live.state));
    EXPECT_EQ(draft_bits(f.model->draft(resumed.state, resumed.current)),
              draft_bits(f.model->draft(live.state, live.current)));
  }
}

// The rings are what makes the draft exact: without them (a file saved without its local state)
// a full resume's draft is refused, naming the ring.
TEST_F(SessionStoreDSpark, WithoutTheLocalStateADraftIsRefused) {
  const Fixture f = fixture();
  Speculating live = speculate(37, 1);
  const std::string path = scratch() + "/global.dsv41s";
  save_session(path, live.state, f.config, false);
  LoadedSession l = load_session(path, f.config, *f.model);
  ASSERT_FALSE(l.has_swa);
  for (int64_t p : l.state.dspark_window_kv.at(0).positions) ASSERT_EQ(p, -1);
  const std::string e = error_of([&] { f.model->draft(l.state, live.current); });
  EXPECT_TRUE(has(e, "draft: the DSpark ring of layer 10 holds position -1")) << e;
}

// Global-only resume: the DSpark rings rebuilt by encoder replay, from files with or without
// rings. P <= W: exact (the never-paused rings and drafts); P > W: Model::replay_local_state's.
TEST_F(SessionStoreDSpark, GlobalOnlyResumeReplaysTheDSparkRings) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  for (int64_t prompt : {30, 90}) {
    Speculating live = speculate(prompt, 2);
    const int64_t P = live.state.pos, W = c.window_size;
    SCOPED_TRACE("paused at position " + std::to_string(P));
    ASSERT_EQ(P <= W, prompt == 30);
    model::ModelState want = live.state;  // the in-memory encoder replay (for P <= W: the live state itself)
    if (P > W) {
      std::vector<int64_t> tail;
      for (int64_t q = P - W; q < P; ++q) tail.push_back(want.recent_tokens[static_cast<size_t>(q) % want.recent_tokens.size()]);
      f.model->replay_local_state(want, tail);
      EXPECT_NE(dspark_rings(want), dspark_rings(live.state)) << "truncated windows must show";
    }
    expect_rings_are_real(want);
    const model::DraftResult want_draft = f.model->draft(want, live.current);
    expect_draft_is_real(want_draft);
    for (bool with_rings : {false, true}) {
      SCOPED_TRACE(with_rings ? "file with rings" : "file without rings");
      const std::string path = scratch() + "/s.dsv41s";
      save_session(path, live.state, c, with_rings);
      LoadedSession g = load_session(path, c, *f.model, ResumeMode::kGlobalOnly);
      EXPECT_EQ(g.replayed_tokens, std::min(P, W));
      EXPECT_EQ(dspark_rings(g.state), dspark_rings(want)) << "DSpark rings";
      EXPECT_EQ(ring_bytes(g.state), ring_bytes(want)) << "SWA rings";
      EXPECT_EQ(draft_bits(f.model->draft(g.state, live.current)), draft_bits(want_draft));
    }
  }
}

}  // namespace
}  // namespace dsv41::reference::session
