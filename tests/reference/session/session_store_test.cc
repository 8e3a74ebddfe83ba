// reference/session/session_store: a saved and loaded session is the same state byte for byte, and a
// full resume continues with the same bits as a run that never paused (docs/session-store.md,
// docs/sessions.md). A global-only resume is encoder replay from the file: exact for a session no
// longer than the window, else the same rings and continuation as Model::replay_local_state on
// the in-memory state. Every single-bit flip and every truncation of a saved file is refused with
// a dsv41::Error, as are wrong configs, versions (format 1 included) and magics, inconsistent
// section tables and entries the formats cannot have written. The file size equals the byte
// accounting.
//
// Model: the tiny config with the official oracle weights and the oracle prompt tokens (window
// 64, kv sources 2 and 4 with ratio 2, 6 with ratio 1). Sizes are chosen per code path: odd
// saved positions leave a ratio-2 group pending; 37 < 64 leaves ring slots empty, 77 > 64 wraps
// the ring (and 77, 100 > 64 + 3 wrap the token tail of 67 ids); the continuation reaches more
// than index_topk = 32 ratio-2 positions, so the top-k selects for real. Sampled bit flips come
// from the printed data seed (DSV41_SEED overrides).
#include "tests/support/session_store_util.h"

namespace dsv41::reference::session {
namespace {

// ---- save + load ----

TEST_F(SessionStore, SaveLoadGivesTheSameStateByteForByte) {
  const Fixture f = fixture();
  // 1: empty ratio-2 caches; 37: a pending group, empty ring slots; 77: a wrapped ring and token
  // tail.
  const std::vector<int64_t> positions = {1, 12, 37, 77};
  const std::vector<model::ModelState> states = states_at(positions);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t n = positions[k];
    SCOPED_TRACE("saved at position " + std::to_string(n));
    const model::ModelState& s = states[k];
    const std::string path = scratch() + "/s" + std::to_string(n) + ".dsv41s";
    save_session(path, s, f.config, true);
    const LoadedSession l = load_session(path, f.config, *f.model);
    EXPECT_TRUE(l.has_swa);
    EXPECT_EQ(l.header.version, 3u);
    EXPECT_EQ(l.header.pos, n);
    {  // the token tail: the raw ids of the last min(n, 64 + 3) positions
      const std::vector<uint8_t> file = read_file(path);
      const size_t i = find_section(file, SessionSection::kTokenTail);
      const int64_t kept = std::min<int64_t>(n, f.config.window_size + f.config.engram_max_ngram_size - 1);
      ASSERT_EQ(static_cast<int64_t>(get_u64(file, table_entry(i) + 24)), kept);
      EXPECT_EQ(static_cast<int64_t>(get_u64(file, table_entry(i) + 16)), n - kept);
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < kept; ++k) {
        ids.push_back(static_cast<int64_t>(get_u64(file, section_offset(file, i) + 8 * static_cast<size_t>(k))));
      }
      EXPECT_EQ(ids, tokens(n - kept, kept));
    }
    EXPECT_EQ(l.header.config_hash, config_hash(f.config));
    EXPECT_EQ(carried_state(l.state, f.config, true), carried_state(s, f.config, true));
    // Saving the loaded state again writes the same file.
    EXPECT_EQ(session_bytes(l.state, f.config, true), read_file(path));

    // Without the SWA rings: the global state is the same, the rings are empty.
    save_session(path, s, f.config, false);
    const LoadedSession g = load_session(path, f.config, *f.model);
    EXPECT_FALSE(g.has_swa);
    EXPECT_EQ(carried_state(g.state, f.config, false), carried_state(s, f.config, false));
    for (const model::LayerState& ls : g.state.layers) {
      EXPECT_TRUE(std::all_of(ls.window_kv.positions.begin(), ls.window_kv.positions.end(), [](int64_t p) { return p == -1; }));
    }
  }
}

TEST_F(SessionStore, SavedStateIsNotTrivial) {
  const model::ModelState s = prefilled(37);
  ASSERT_EQ(s.layers[2].compressor->pending(), 1);  // 37 is odd: one token of a ratio-2 group waits
  EXPECT_EQ(s.layers[2].compressed_kv->size(), 18);
  EXPECT_EQ(s.layers[6].compressed_kv->size(), 37);
  const std::vector<uint8_t> bytes = session_bytes(s, fixture().config, true);
  const size_t pending = find_section(bytes, SessionSection::kCompressorPending, 2);
  EXPECT_EQ(get_u64(bytes, table_entry(pending) + 24), 1u);
  EXPECT_EQ(get_u64(bytes, table_entry(pending) + 16), 36u);  // the token of slot 0
}

// The continuation every resume test runs: from the state's position up to kPrompt in one step,
// then kSteps decode steps (kEnd positions in all).
constexpr int64_t kPrompt = 117, kSteps = 3, kEnd = kPrompt + kSteps;

Trace continue_session(model::ModelState& s) {
  const Fixture f = fixture();
  Trace tr;
  record(tr, f.model->forward_chunk(s, tokens(s.pos, kPrompt - s.pos)), f.config, kEnd);
  for (int64_t tok : tokens(kPrompt, kSteps)) record(tr, f.model->decode(s, tok), f.config, kEnd);
  return tr;
}

// The run that never pauses: kPrompt tokens in one step, then the decode steps.
struct Run {
  Trace trace;
  model::ModelState state;  // at kEnd
};
const Run& uninterrupted() {
  static const Run r = [] {
    model::ModelState s = fixture().model->new_state();
    Trace tr = continue_session(s);
    return Run{std::move(tr), std::move(s)};
  }();
  return r;
}

// `resumed` (a continuation from position n1) has the uninterrupted run's rows from n1 on, bit
// for bit; its logits are finite and not all zero, and the top-k selected for real.
void expect_rows_of_uninterrupted(const Trace& resumed, int64_t n1) {
  const Trace& whole = uninterrupted().trace;
  ASSERT_EQ(resumed.first, n1);
  ASSERT_EQ(resumed.logits.size(), static_cast<size_t>(kEnd - n1));
  const std::vector<std::vector<uint32_t>> whole_logits(whole.logits.begin() + n1, whole.logits.end());
  bool nonzero = false;
  for (const auto& row : resumed.logits) {
    for (uint32_t u : row) {
      ASSERT_LT(u & 0x7FFFFFFFu, 0x7F800000u) << "non-finite logit";
      nonzero |= (u & 0x7FFFFFFFu) != 0;
    }
  }
  ASSERT_TRUE(nonzero);
  EXPECT_EQ(resumed.logits, whole_logits) << "logits";
  EXPECT_EQ(resumed.topk, from_position(whole.topk, 0, n1)) << "top-k";
  EXPECT_EQ(resumed.candidates, from_position(whole.candidates, 0, n1)) << "candidates";
  EXPECT_EQ(resumed.engram, from_position(whole.engram, 0, n1)) << "Engram ids";
  EXPECT_EQ(resumed.experts, from_position(whole.experts, 0, n1)) << "experts";
  // The top-k selected for real: some row has index_topk valid ratio-2 positions.
  int64_t full_rows = 0;
  for (const auto& row : resumed.topk.at(2)) full_rows += row.back() >= 0 ? 1 : 0;
  EXPECT_GT(full_rows, 0);
}

// Full resume == never pausing: prefill n1 tokens, save, load into a fresh state, continue; the
// uninterrupted run prefills kPrompt tokens at once and takes the same decode steps.
TEST_F(SessionStore, FullResumeIsBitIdenticalToNeverPausing) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  for (int64_t n1 : {37, 77}) {
    SCOPED_TRACE("paused at position " + std::to_string(n1));
    const std::string path = scratch() + "/paused.dsv41s";
    save_session(path, prefilled(n1), c, true);
    LoadedSession l = load_session(path, c, *f.model);
    expect_rows_of_uninterrupted(continue_session(l.state), n1);
    EXPECT_EQ(carried_state(l.state, c, true), carried_state(uninterrupted().state, c, true)) << "final state";
  }
}

// A global-only resume of a session no longer than the window replays all of it: nothing is
// truncated, so the rings, the continuation and the final state are those of a full resume and
// of never pausing, bit for bit; from a file with or without its rings (global-only ignores them).
TEST_F(SessionStore, GlobalOnlyResumeOfAShortSessionIsExact) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  for (int64_t n1 : {37, 64}) {  // 64 = window_size: the longest session replayed whole
    SCOPED_TRACE("paused at position " + std::to_string(n1));
    const model::ModelState first = prefilled(n1);
    const std::string global = scratch() + "/global.dsv41s", full = scratch() + "/full.dsv41s";
    save_session(global, first, c, false);
    save_session(full, first, c, true);
    LoadedSession g = load_session(global, c, *f.model, ResumeMode::kGlobalOnly);
    EXPECT_EQ(g.mode, ResumeMode::kGlobalOnly);
    EXPECT_EQ(g.replayed_tokens, n1);
    EXPECT_EQ(carried_state(g.state, c, true), carried_state(first, c, true)) << "the replayed rings";
    // The same state from the file with rings (ignored) and from a full resume of it.
    EXPECT_EQ(carried_state(load_session(full, c, *f.model, ResumeMode::kGlobalOnly).state, c, true),
              carried_state(g.state, c, true));
    EXPECT_EQ(carried_state(load_session(full, c, *f.model).state, c, true), carried_state(g.state, c, true));
    expect_rows_of_uninterrupted(continue_session(g.state), n1);
    EXPECT_EQ(carried_state(g.state, c, true), carried_state(uninterrupted().state, c, true)) << "final state";
  }
}

// A longer session: the file path adds nothing to encoder replay. The loaded state has exactly
// the rings of Model::replay_local_state on an in-memory copy (whether the file had rings or
// not), the same continuation bit for bit, the global caches as saved, and layer 0's ring equal
// to the uninterrupted one (its KV depends on the token alone). The continuation differs from the
// uninterrupted run (approximate by design): measured and printed.
TEST_F(SessionStore, GlobalOnlyResumeOfALongSessionIsEncoderReplay) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  const int64_t P = 100, W = c.window_size;  // 100 > W + 3: the token tail wraps its 67 slots
  const model::ModelState first = prefilled(P);
  model::ModelState replayed = first;
  f.model->replay_local_state(replayed, tokens(P - W, W));
  EXPECT_NE(ring_bytes(replayed), ring_bytes(first)) << "truncated windows must show";

  std::vector<model::ModelState> loaded;
  for (bool with_swa : {false, true}) {
    SCOPED_TRACE(with_swa ? "file with SWA rings" : "file without SWA rings");
    const std::string path = scratch() + (with_swa ? "/full.dsv41s" : "/global.dsv41s");
    save_session(path, first, c, with_swa);
    LoadedSession g = load_session(path, c, *f.model, ResumeMode::kGlobalOnly);
    EXPECT_EQ(g.replayed_tokens, W);
    EXPECT_EQ(ring_bytes(g.state), ring_bytes(replayed)) << "rings = in-memory encoder replay";
    EXPECT_EQ(carried_state(g.state, c, false), carried_state(first, c, false)) << "global state as saved";
    EXPECT_EQ(g.state.layers[0].window_kv.bytes.data(), first.layers[0].window_kv.bytes.data()) << "layer 0's ring";
    EXPECT_EQ(g.state.layers[0].window_kv.positions, first.layers[0].window_kv.positions);
    loaded.push_back(std::move(g.state));
  }
  const Trace want = continue_session(replayed);
  for (model::ModelState& s : loaded) {
    const Trace got = continue_session(s);
    EXPECT_EQ(got.logits, want.logits) << "logits";
    EXPECT_EQ(got.topk, want.topk) << "top-k";
    EXPECT_EQ(got.candidates, want.candidates) << "candidates";
    EXPECT_EQ(got.engram, want.engram) << "Engram ids";
    EXPECT_EQ(got.experts, want.experts) << "experts";
    EXPECT_EQ(carried_state(s, c, true), carried_state(replayed, c, true)) << "final state";
  }
  // Against never pausing: the Engram ids are exact (they depend on the tokens alone), the
  // logits are not.
  const Trace& whole = uninterrupted().trace;
  EXPECT_EQ(want.engram, from_position(whole.engram, 0, P));
  double worst = 0;
  for (size_t t = 0; t < want.logits.size(); ++t) {
    for (size_t v = 0; v < want.logits[t].size(); ++v) {
      const double d = std::fabs(double{f32_from_bits(want.logits[t][v])} -
                                 double{f32_from_bits(whole.logits[static_cast<size_t>(P) + t][v])});
      worst = std::max(worst, d);
    }
  }
  std::printf("[global-only resume] P=%lld, W=%lld: max |logit diff| vs never pausing over %zu positions %.4g\n",
              static_cast<long long>(P), static_cast<long long>(W), want.logits.size(), worst);
  EXPECT_GT(worst, 0.0);
}

// The token tail must compress to the stored Engram tail (a file saved with another token map
// cannot be replayed), in either resume mode: an edited tail with valid CRCs is refused by a full
// resume too (issue 14).
TEST_F(SessionStore, ResumeChecksTheTokenTailAgainstTheEngramTail) {
  const Fixture f = fixture();
  std::vector<uint8_t> b = session_bytes(prefilled(12), f.config, false);
  const size_t i = find_section(b, SessionSection::kTokenTail);
  ASSERT_EQ(get_u64(b, table_entry(i) + 24), 12u);
  const size_t last = section_offset(b, i) + 8 * 11;  // position 11
  const uint64_t token = get_u64(b, last), other = (token + 2) % static_cast<uint64_t>(f.config.vocab_size);
  ASSERT_NE(f.model->token_map()[other], f.model->token_map()[token]);
  set_u64(b, last, other);
  fix_section_crc(b, i);
  const std::string e = error_of([&] {
    load_session_bytes(b, "patched.dsv41s", f.config, *f.model, ResumeMode::kGlobalOnly);
  });
  EXPECT_TRUE(has(e, "session file 'patched.dsv41s': global-only resume: the Engram tail holds compressed id ")) << e;
  EXPECT_TRUE(has(e, " at position 11, but its token " + std::to_string(other) + " maps to ")) << e;
  EXPECT_TRUE(has(e, "(was the session saved with another token map, or edited?)")) << e;
  const std::string full = load_error(b, f.config);
  EXPECT_TRUE(has(full, "session file 'patched.dsv41s': full resume: the Engram tail holds compressed id ")) << full;
  EXPECT_TRUE(has(full, " at position 11, but its token " + std::to_string(other) + " maps to ")) << full;
}

TEST_F(SessionStore, StateWithoutSwaCannotContinue) {
  const Fixture f = fixture();
  const std::string path = scratch() + "/global.dsv41s";
  save_session(path, prefilled(12), f.config, false);
  LoadedSession l = load_session(path, f.config, *f.model);
  ASSERT_FALSE(l.has_swa);
  const std::string e = error_of([&] { f.model->forward_chunk(l.state, tokens(12, 3)); });
  EXPECT_TRUE(has(e, "SWA ring does not hold position 0 (slot 0 holds -1)")) << e;
}

// ---- size == byte accounting ----

// file size - fixed bytes (header, table, the constant sections: pending, Engram tail, token
// tail, SWA and DSpark rings) ==
// global_bytes_for_tokens(P) (byte_accounting.h), == global_bytes_per_token x P when P is a
// multiple of every ratio. The constant sections are computed here from the config.
TEST_F(SessionStore, FileSizeMatchesTheByteAccounting) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  const ByteAccounting acc = byte_accounting(c);
  int64_t lcm_ratio = 1;
  for (const OwnerBytes& o : acc.owners) lcm_ratio = std::lcm(lcm_ratio, int64_t{o.ratio});
  const std::vector<int64_t> positions = {12, 13, 37, 64, 77};
  const std::vector<model::ModelState> states = states_at(positions);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t p = positions[k];
    const model::ModelState& s = states[k];
    for (bool swa : {true, false}) {
      SCOPED_TRACE("position " + std::to_string(p) + (swa ? " with" : " without") + " SWA");
      const std::string path = scratch() + "/s.dsv41s";
      save_session(path, s, c, swa);
      const int64_t size = static_cast<int64_t>(fs::file_size(path));
      int64_t sections = 2, pending = 0;  // + the Engram tail and the token tail
      for (const OwnerBytes& o : acc.owners) {
        sections += o.ratio > 1 ? 3 : 2;
        pending += (p % o.ratio) * c.head_dim * 2 * int64_t{sizeof(float)};
      }
      const int64_t engram = std::min<int64_t>(p, c.engram_max_ngram_size - 1) * int64_t{sizeof(int64_t)};
      const int64_t token_tail =
          std::min<int64_t>(p, c.window_size + c.engram_max_ngram_size - 1) * int64_t{sizeof(int64_t)};
      const int64_t rings = c.n_layers + c.n_mtp_layers;  // SWA, then DSpark (1 on the tiny config)
      ASSERT_EQ(c.n_mtp_layers, 1);
      const int64_t window_kv_bytes =
          swa ? rings * c.window_size * (8 + formats::entry_bytes(formats::CacheFormat::kWindowKvFp8, c.head_dim)) : 0;
      if (swa) sections += rings;
      const int64_t fixed = session_fixed_bytes(sections) + pending + engram + token_tail + window_kv_bytes;
      EXPECT_EQ(size - fixed, global_bytes_for_tokens(acc, p));
      if (p % lcm_ratio == 0) {
        EXPECT_EQ((size - fixed) * acc.global_bytes_per_token.den, acc.global_bytes_per_token.num * p);
      }
      std::printf("[session size] position %lld %s SWA: %lld bytes = %lld fixed + %lld cache entries "
                  "(accounting: %lld)\n",
                  static_cast<long long>(p), swa ? "with" : "without", static_cast<long long>(size),
                  static_cast<long long>(fixed), static_cast<long long>(size - fixed),
                  static_cast<long long>(global_bytes_for_tokens(acc, p)));
    }
  }
}

// The released config: the cache sections of the layout hold exactly the accounting's bytes.
TEST_F(SessionStore, ReleasedLayoutMatchesTheByteAccounting) {
  const ModelConfig c = load_config("full");
  const ByteAccounting acc = byte_accounting(c);
  for (int64_t p : {0, 1, 2, 999, 1000, 4096}) {
    int64_t cache = 0;
    for (const SessionSectionInfo& s : session_layout(c, p, true)) {
      if (s.kind == SessionSection::kCompressedKv || s.kind == SessionSection::kIndexKeys) cache += s.bytes();
    }
    EXPECT_EQ(cache, global_bytes_for_tokens(acc, p)) << "position " << p;
    if (p % 2 == 0) {
      EXPECT_EQ(cache * acc.global_bytes_per_token.den, acc.global_bytes_per_token.num * p);
    }
  }
  int64_t owners = 0, pooled = 0;
  for (const OwnerBytes& o : acc.owners) {
    ++owners;
    pooled += o.ratio > 1 ? 1 : 0;
  }
  EXPECT_EQ(static_cast<int64_t>(session_layout(c, 10, false).size()), 2 * owners + pooled + 2);
  ASSERT_EQ(c.n_mtp_layers, 3);  // the DSpark rings follow the SWA rings
  EXPECT_EQ(static_cast<int64_t>(session_layout(c, 10, true).size()),
            2 * owners + pooled + 2 + c.n_layers + c.n_mtp_layers);
  EXPECT_EQ(session_layout(c, 10, true).back().kind, SessionSection::kDSparkRing);
  EXPECT_EQ(session_layout(c, 10, true).back().layer, c.n_layers + c.n_mtp_layers - 1);
  for (int64_t p : {10, 4096}) {  // the token tail: window_size + engram_max_ngram_size - 1 = 131 ids at most
    const SessionSectionInfo t = session_layout(c, p, false).back();  // a copy: the vector is a temporary
    EXPECT_EQ(t.kind, SessionSection::kTokenTail);
    EXPECT_EQ(t.count, std::min<int64_t>(p, c.window_size + c.engram_max_ngram_size - 1));
  }
  for (const SessionSectionInfo& s : session_layout(c, 10, false)) {
    if (s.kind == SessionSection::kCompressedKv) {
      EXPECT_EQ(s.entry_bytes, formats::entry_bytes(formats::CacheFormat::kCompressedKvFp4, c.head_dim));
    }
    if (s.kind == SessionSection::kIndexKeys) {
      EXPECT_EQ(s.entry_bytes, formats::entry_bytes(formats::CacheFormat::kIndexKeysFp4, c.index_head_dim));
    }
  }
}

// ---- the restore methods ----

TEST(SessionStoreRestore, CacheRestoreChecksScales) {
  model::PackedCache kv("compressed KV cache", formats::CacheFormat::kCompressedKvFp4, 2, 2, 32, 4);
  std::vector<uint8_t> bytes(static_cast<size_t>(2 * kv.entry_bytes()), 0x11);
  // Entries of 18 bytes: 16 nibble bytes, then 2 E4M3 scales.
  for (size_t i : {16, 17, 34, 35}) bytes[i] = 0x30;
  kv.restore(bytes.data(), 2);
  EXPECT_EQ(kv.size(), 2);
  EXPECT_EQ(kv.entry(1)[0], 0x11);
  EXPECT_EQ(kv.read(seam::reference_ops(), 2, 2, 2).dim(0), 2);
  bytes[35] = 0x7F;  // E4M3 NaN
  EXPECT_TRUE(has(error_of([&] { kv.restore(bytes.data(), 2); }), "entry 1 block 1 has scale byte 0x7f"));
  EXPECT_TRUE(has(error_of([&] { kv.restore(bytes.data(), 5); }), "restore of 5 entries, capacity 4"));

  model::PackedCache keys("index-key cache", formats::CacheFormat::kIndexKeysFp4, 4, 2, 32, 3);
  std::vector<uint8_t> kb(static_cast<size_t>(keys.entry_bytes()), 0x22);
  kb[16] = 0x7F;
  keys.restore(kb.data(), 1);
  EXPECT_EQ(keys.size(), 1);
  kb[16] = 0xFF;  // E8M0 NaN
  EXPECT_TRUE(has(error_of([&] { keys.restore(kb.data(), 1); }), "entry 0 block 0 has scale byte 0xff"));
}

TEST(SessionStoreRestore, EngramTailRefusesEarlierReads) {
  EngramHistory h(2);
  h.restore(10, {5, 6, 7});
  EXPECT_EQ(h.size(), 13);
  EXPECT_EQ(h.first_position(), 10);
  EXPECT_EQ(h.at(12), 7);
  EXPECT_TRUE(has(error_of([&] { h.at(9); }), "position 9 is not held (the history holds positions 10 .. 12"));
  EXPECT_TRUE(has(error_of([&] { h.write(14, {1}); }), "would leave a gap"));
  h.write(13, {8, 9});
  EXPECT_EQ(h.ids(), (std::vector<int64_t>{5, 6, 7, 8, 9}));
  h.write(11, {4});  // rewrite inside the tail
  EXPECT_EQ(h.ids(), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(h.size(), 12);
  EXPECT_TRUE(has(error_of([&] { h.write(9, {1}); }), "write at position 9 before the restored tail"));
}

// ---- atomic writes ----

TEST_F(SessionStoreFiles, AtomicWriteLeavesOnlyTheFile) {
  const std::string dir = scratch(), path = dir + "/s.dsv41s";
  save_session(path, prefilled(12), fixture().config, true);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"s.dsv41s"});
  // Overwriting replaces the file, again without leftovers.
  save_session(path, prefilled(13), fixture().config, false);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"s.dsv41s"});
  EXPECT_EQ(read_session_header(path, fixture().config).pos, 13);
}

TEST_F(SessionStoreFiles, FailedWritesKeepTheExistingFile) {
  const ModelConfig& c = fixture().config;
  const std::string dir = scratch(), path = dir + "/s.dsv41s";
  const model::ModelState s = prefilled(12);
  save_session(path, s, c, true);
  const std::vector<uint8_t> good = read_file(path);
  const model::ModelState other = prefilled(13);

  // Something in the place of the old per-process temp name: temp names are unique per writer
  // (base/output_file.h), so the save goes through and the stranger is left alone.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_directories(tmp);
  EXPECT_NO_THROW(save_session(path, other, c, true));
  EXPECT_NE(read_file(path), good);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"s.dsv41s", "s.dsv41s.tmp." + std::to_string(::getpid())}));
  fs::remove(tmp);
  save_session(path, s, c, true);
  ASSERT_EQ(read_file(path), good);

  // An inconsistent state fails before any file is touched.
  model::ModelState broken = prefilled(13);
  broken.pos = 14;
  EXPECT_TRUE(has(error_of([&] { save_session(path, broken, c, true); }), "save_session:"));
  EXPECT_EQ(read_file(path), good);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"s.dsv41s"});

  // The target is a directory: refused before a temp file exists (base/output_file.h).
  const std::string target = dir + "/target";
  fs::create_directories(target + "/inside");
  std::string e = error_of([&] { save_session(target, other, c, true); });
  EXPECT_TRUE(has(e, "cannot write session file '" + target + "': it is a directory")) << e;
  EXPECT_TRUE(fs::is_directory(target + "/inside"));
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"s.dsv41s", "target"}));

  // A directory that does not exist.
  e = error_of([&] { save_session(dir + "/absent/s.dsv41s", other, c, true); });
  EXPECT_TRUE(has(e, "directory '" + dir + "/absent' does not exist")) << e;
  EXPECT_FALSE(fs::exists(dir + "/absent"));
}

}  // namespace
}  // namespace dsv41::reference::session
