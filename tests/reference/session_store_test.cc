// reference/session_store: a saved and loaded session is the same state byte for byte, and a
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
#include "reference/session_store.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/base.h"
#include "formats/cache_format.h"
#include "formats/error.h"
#include "golden/golden_io.h"
#include "reference/byte_accounting.h"
#include "reference/crc32c.h"
#include "reference/model.h"
#include "reference/weights.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

namespace fs = std::filesystem;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
constexpr int64_t kTokens = 120;  // oracle prompt tokens used (the longest run: 117 + 3 decode steps)

struct Fixture {
  const ModelConfig& config;
  const Model* model;
};

Fixture fixture() {
  const test::OracleModel& m = test::oracle_model();
  return {m.config, m.model.get()};
}

std::vector<int64_t> tokens(int64_t first, int64_t count) {
  EXPECT_LE(first + count, kTokens);
  return test::oracle_tokens(first, count);
}

// A state after prefilling the first n oracle tokens.
ModelState prefilled(int64_t n) {
  ModelState s = fixture().model->new_state();
  fixture().model->forward_chunk(s, tokens(0, n));
  return s;
}

// Copies of one run's state at each of the ascending positions (one forward per gap: chunking
// gives the same bits as one prefill, model_chunking_test).
std::vector<ModelState> states_at(const std::vector<int64_t>& positions) {
  std::vector<ModelState> out;
  ModelState s = fixture().model->new_state();
  for (int64_t p : positions) {
    if (p > s.pos) fixture().model->forward_chunk(s, tokens(s.pos, p - s.pos));
    out.push_back(s);
  }
  return out;
}

// The bytes of everything a session carries forward: pos; per layer the SWA ring (bytes and
// positions, with_swa only), the packed compressed-KV and index-key entries, the compressor's
// pending slots (the others are stale and carry no meaning); the Engram tail (the last
// max_ngram - 1 ids: the hash of a later position reads no further back); the raw tokens of the
// token tail's positions (the ring's other slots are never read).
std::vector<uint8_t> carried_state(const ModelState& s, const ModelConfig& c, bool with_swa) {
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  put(&s.pos, sizeof s.pos);
  for (const LayerState& ls : s.layers) {
    if (with_swa) {
      put(ls.ring.bytes.data(), ls.ring.bytes.size());
      put(ls.ring.positions.data(), ls.ring.positions.size() * sizeof(int64_t));
    }
    if (ls.kv_cache) {
      for (int64_t e = 0; e < ls.kv_cache->size(); ++e) put(ls.kv_cache->entry(e), static_cast<size_t>(ls.kv_cache->entry_bytes()));
    }
    if (ls.key_cache) {
      for (int64_t e = 0; e < ls.key_cache->size(); ++e) put(ls.key_cache->entry(e), static_cast<size_t>(ls.key_cache->entry_bytes()));
    }
    if (ls.compressor) {
      const CompressorState& cs = *ls.compressor;
      put(&cs.next_pos, sizeof cs.next_pos);
      for (int slot = 0; slot < cs.pending(); ++slot) {
        put(cs.kv.data() + slot * cs.dim, static_cast<size_t>(cs.dim) * sizeof(float));
        put(cs.score.data() + slot * cs.dim, static_cast<size_t>(cs.dim) * sizeof(float));
      }
    }
  }
  const int64_t tail = std::min<int64_t>(s.pos, c.engram_max_ngram_size - 1);
  for (int64_t p = s.pos - tail; p < s.pos; ++p) {
    const int64_t id = s.engram.at(p);
    put(&id, sizeof id);
  }
  const int64_t kept = static_cast<int64_t>(s.recent_tokens.size());
  for (int64_t p = s.pos - std::min(s.pos, kept); p < s.pos; ++p) {
    put(&s.recent_tokens[static_cast<size_t>(p % kept)], sizeof(int64_t));
  }
  return out;
}

using test::ring_bytes;

// Per-position records of a run, so runs with different step boundaries compare row by row.
struct Trace {
  int64_t first = 0;                                          // position of row 0
  std::vector<std::vector<uint32_t>> logits;                  // [positions][vocab] bits
  std::map<int, std::vector<std::vector<int32_t>>> topk;      // layer -> [positions][index_topk]
  std::map<int, std::vector<std::vector<uint8_t>>> candidates;  // layer -> [positions][width]
  std::map<int, std::vector<std::vector<int64_t>>> engram;    // layer -> [positions][cols]
  std::map<int, std::vector<std::vector<int32_t>>> experts;   // layer -> [positions][k]
};

// Appends one step's records; rows padded to fixed widths (top-k: -1 to index_topk;
// candidates: 0 to `width` compressed positions).
void record(Trace& tr, const StepRecord& r, const ModelConfig& c, int64_t width) {
  if (tr.logits.empty()) tr.first = r.start_pos;
  for (int64_t t = 0; t < r.tokens; ++t) {
    std::vector<uint32_t> row;
    for (int64_t v = 0; v < c.vocab_size; ++v) row.push_back(f32_bits(r.all_logits.at(t, v)));
    tr.logits.push_back(row);
  }
  for (const auto& [l, x] : r.topk) {
    for (int64_t t = 0; t < x.dim(0); ++t) {
      std::vector<int32_t> row(static_cast<size_t>(c.index_topk), -1);
      for (int64_t j = 0; j < x.dim(1); ++j) row[static_cast<size_t>(j)] = x.at(t, j);
      tr.topk[l].push_back(row);
    }
  }
  for (const auto& [l, x] : r.candidates) {
    for (int64_t t = 0; t < x.dim(0); ++t) {
      std::vector<uint8_t> row(static_cast<size_t>(width), 0);
      for (int64_t j = 0; j < x.dim(1); ++j) row[static_cast<size_t>(j)] = x.at(t, j);
      tr.candidates[l].push_back(row);
    }
  }
  for (const auto& [l, x] : r.engram_ids) {
    for (int64_t t = 0; t < x.dim(0); ++t) tr.engram[l].emplace_back(x.row(t), x.row(t) + x.dim(1));
  }
  for (const auto& [l, x] : r.experts) {
    for (int64_t t = 0; t < x.dim(0); ++t) tr.experts[l].emplace_back(x.row(t), x.row(t) + x.dim(1));
  }
}

// Rows of `a` from position `from` on.
template <typename Row>
std::map<int, std::vector<Row>> from_position(const std::map<int, std::vector<Row>>& m, int64_t first, int64_t from) {
  std::map<int, std::vector<Row>> out;
  for (const auto& [l, rows] : m) out[l].assign(rows.begin() + (from - first), rows.end());
  return out;
}

// ---- scratch files ----

// A per-process directory for the running test, removed when it passes.
std::string scratch() {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "/dsv41_session_store_test_" + std::to_string(::getpid()) + "_" +
                          t->test_suite_name() + "_" + t->name();
  fs::create_directories(dir);
  return dir;
}

class ScratchTest : public testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(scratch());
  }
};
class SessionStore : public ScratchTest {};
class SessionStoreFiles : public ScratchTest {};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the dsv41::Error that f throws; "(no error)" if it returns, "(other exception)"
// for anything that is not a dsv41::Error.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (...) {
    return "(other exception)";
  }
  return "(no error)";
}
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- the documented layout, for patching files (docs/session-store.md) ----

uint32_t get_u32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8 | uint32_t{b[at + 2]} << 16 | uint32_t{b[at + 3]} << 24;
}
uint64_t get_u64(const std::vector<uint8_t>& b, size_t at) {
  return uint64_t{get_u32(b, at)} | uint64_t{get_u32(b, at + 4)} << 32;
}
void set_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}
void set_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  set_u32(b, at, static_cast<uint32_t>(v));
  set_u32(b, at + 4, static_cast<uint32_t>(v >> 32));
}
size_t table_entry(size_t i) { return 48 + 44 * i; }
size_t n_sections(const std::vector<uint8_t>& b) { return get_u32(b, 40); }
size_t section_offset(const std::vector<uint8_t>& b, size_t i) { return get_u64(b, table_entry(i) + 32); }
size_t section_bytes(const std::vector<uint8_t>& b, size_t i) {
  return get_u32(b, table_entry(i) + 12) * get_u64(b, table_entry(i) + 24);
}
void fix_header_crc(std::vector<uint8_t>& b) { set_u32(b, 44, crc32c(b.data(), 44)); }
void fix_table_crc(std::vector<uint8_t>& b) {
  const size_t n = n_sections(b);
  set_u32(b, 48 + 44 * n, crc32c(b.data() + 48, 44 * n));
}
void fix_section_crc(std::vector<uint8_t>& b, size_t i) {
  set_u32(b, table_entry(i) + 40, crc32c(b.data() + section_offset(b, i), section_bytes(b, i)));
  fix_table_crc(b);
}
// Index of the first section of `kind` (and `layer`, unless -2).
size_t find_section(const std::vector<uint8_t>& b, SessionSection kind, int layer = -2) {
  for (size_t i = 0; i < n_sections(b); ++i) {
    if (get_u32(b, table_entry(i)) == static_cast<uint32_t>(kind) &&
        (layer == -2 || static_cast<int32_t>(get_u32(b, table_entry(i) + 4)) == layer)) {
      return i;
    }
  }
  ADD_FAILURE() << "no section of kind " << name(kind) << " layer " << layer;
  return 0;
}

std::string load_error(const std::vector<uint8_t>& bytes, const ModelConfig& c) {
  return error_of([&] { load_session_bytes(bytes, "patched.dsv41s", c, *fixture().model); });
}

// ---- save + load ----

TEST_F(SessionStore, SaveLoadGivesTheSameStateByteForByte) {
  const Fixture f = fixture();
  // 1: empty ratio-2 caches; 37: a pending group, empty ring slots; 77: a wrapped ring and token
  // tail.
  const std::vector<int64_t> positions = {1, 12, 37, 77};
  const std::vector<ModelState> states = states_at(positions);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t n = positions[k];
    SCOPED_TRACE("saved at position " + std::to_string(n));
    const ModelState& s = states[k];
    const std::string path = scratch() + "/s" + std::to_string(n) + ".dsv41s";
    save_session(path, s, f.config, true);
    const LoadedSession l = load_session(path, f.config, *f.model);
    EXPECT_TRUE(l.has_swa);
    EXPECT_EQ(l.header.version, 2u);
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
    for (const LayerState& ls : g.state.layers) {
      EXPECT_TRUE(std::all_of(ls.ring.positions.begin(), ls.ring.positions.end(), [](int64_t p) { return p == -1; }));
    }
  }
}

TEST_F(SessionStore, SavedStateIsNotTrivial) {
  const ModelState s = prefilled(37);
  ASSERT_EQ(s.layers[2].compressor->pending(), 1);  // 37 is odd: one token of a ratio-2 group waits
  EXPECT_EQ(s.layers[2].kv_cache->size(), 18);
  EXPECT_EQ(s.layers[6].kv_cache->size(), 37);
  const std::vector<uint8_t> bytes = session_bytes(s, fixture().config, true);
  const size_t pending = find_section(bytes, SessionSection::kCompressorPending, 2);
  EXPECT_EQ(get_u64(bytes, table_entry(pending) + 24), 1u);
  EXPECT_EQ(get_u64(bytes, table_entry(pending) + 16), 36u);  // the token of slot 0
}

// The continuation every resume test runs: from the state's position up to kPrompt in one step,
// then kSteps decode steps (kEnd positions in all).
constexpr int64_t kPrompt = 117, kSteps = 3, kEnd = kPrompt + kSteps;

Trace continue_session(ModelState& s) {
  const Fixture f = fixture();
  Trace tr;
  record(tr, f.model->forward_chunk(s, tokens(s.pos, kPrompt - s.pos)), f.config, kEnd);
  for (int64_t tok : tokens(kPrompt, kSteps)) record(tr, f.model->decode(s, tok), f.config, kEnd);
  return tr;
}

// The run that never pauses: kPrompt tokens in one step, then the decode steps.
struct Run {
  Trace trace;
  ModelState state;  // at kEnd
};
const Run& uninterrupted() {
  static const Run r = [] {
    ModelState s = fixture().model->new_state();
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
    const ModelState first = prefilled(n1);
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
  const ModelState first = prefilled(P);
  ModelState replayed = first;
  f.model->replay_local_state(replayed, tokens(P - W, W));
  EXPECT_NE(ring_bytes(replayed), ring_bytes(first)) << "truncated windows must show";

  std::vector<ModelState> loaded;
  for (bool with_swa : {false, true}) {
    SCOPED_TRACE(with_swa ? "file with SWA rings" : "file without SWA rings");
    const std::string path = scratch() + (with_swa ? "/full.dsv41s" : "/global.dsv41s");
    save_session(path, first, c, with_swa);
    LoadedSession g = load_session(path, c, *f.model, ResumeMode::kGlobalOnly);
    EXPECT_EQ(g.replayed_tokens, W);
    EXPECT_EQ(ring_bytes(g.state), ring_bytes(replayed)) << "rings = in-memory encoder replay";
    EXPECT_EQ(carried_state(g.state, c, false), carried_state(first, c, false)) << "global state as saved";
    EXPECT_EQ(g.state.layers[0].ring.bytes, first.layers[0].ring.bytes) << "layer 0's ring";
    EXPECT_EQ(g.state.layers[0].ring.positions, first.layers[0].ring.positions);
    loaded.push_back(std::move(g.state));
  }
  const Trace want = continue_session(replayed);
  for (ModelState& s : loaded) {
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
// cannot be replayed); a full resume does not read the token tail's ids into the Engram history.
TEST_F(SessionStore, GlobalOnlyResumeChecksTheTokenTailAgainstTheEngramTail) {
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
  EXPECT_TRUE(has(e, "(was the session saved with another token map?)")) << e;
  EXPECT_EQ(load_error(b, f.config), "(no error)");
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
// tail, SWA) ==
// global_bytes_for_tokens(P) (byte_accounting.h), == global_bytes_per_token x P when P is a
// multiple of every ratio. The constant sections are computed here from the config.
TEST_F(SessionStore, FileSizeMatchesTheByteAccounting) {
  const Fixture f = fixture();
  const ModelConfig& c = f.config;
  const ByteAccounting acc = byte_accounting(c);
  int64_t lcm_ratio = 1;
  for (const OwnerBytes& o : acc.owners) lcm_ratio = std::lcm(lcm_ratio, int64_t{o.ratio});
  const std::vector<int64_t> positions = {12, 13, 37, 64, 77};
  const std::vector<ModelState> states = states_at(positions);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t p = positions[k];
    const ModelState& s = states[k];
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
      const int64_t swa_bytes =
          swa ? c.n_layers * c.window_size * (8 + formats::entry_bytes(formats::CacheFormat::kSwaKvFp8, c.head_dim)) : 0;
      if (swa) sections += c.n_layers;
      const int64_t fixed = session_fixed_bytes(sections) + pending + engram + token_tail + swa_bytes;
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
  EXPECT_EQ(static_cast<int64_t>(session_layout(c, 10, true).size()), 2 * owners + pooled + 2 + c.n_layers);
  for (int64_t p : {10, 4096}) {  // the token tail: window_size + engram_max_ngram_size - 1 = 131 ids at most
    const SessionSectionInfo& t = session_layout(c, p, false).back();
    EXPECT_EQ(t.kind, SessionSection::kTokenTail);
    EXPECT_EQ(t.count, std::min<int64_t>(p, c.window_size + c.engram_max_ngram_size - 1));
  }
  for (const SessionSectionInfo& s : session_layout(c, 10, false)) {
    if (s.kind == SessionSection::kCompressedKv) {
      EXPECT_EQ(s.entry_bytes, formats::entry_bytes(formats::CacheFormat::kMainKvFp4, c.head_dim));
    }
    if (s.kind == SessionSection::kIndexKeys) {
      EXPECT_EQ(s.entry_bytes, formats::entry_bytes(formats::CacheFormat::kIndexKeyFp4, c.index_head_dim));
    }
  }
}

// ---- corruption ----

// Flips each bit in `bits` of `file` in turn (flipping it back after) and expects every load to
// be refused with a dsv41::Error naming the file; a flip inside a section's payload must be
// reported as that section's checksum mismatch.
void expect_every_flip_refused(std::vector<uint8_t> file, const std::vector<size_t>& bits) {
  const Fixture f = fixture();
  const size_t n = n_sections(file);
  const size_t payload_start = 48 + 44 * n + 4;
  int64_t failures = 0;
  for (size_t bit : bits) {
    const size_t byte = bit / 8;
    file[byte] ^= static_cast<uint8_t>(1u << (bit % 8));
    const std::string e = error_of([&] { load_session_bytes(file, "flipped.dsv41s", f.config, *f.model); });
    std::string want = "session file 'flipped.dsv41s': ";
    if (byte >= payload_start) {
      size_t i = 0;
      while (i + 1 < n && section_offset(file, i + 1) <= byte) ++i;
      want = "section " + std::to_string(i + 1) + " of " + std::to_string(n) + " (";
    }
    if (!has(e, want) || (byte >= payload_start && !has(e, "checksum mismatch"))) {
      if (++failures <= 10) ADD_FAILURE() << "bit " << bit << " (byte " << byte << "): " << e;
    }
    file[byte] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(failures, 0);
}

std::vector<size_t> all_bits(size_t from_byte, size_t to_byte) {
  std::vector<size_t> out;
  for (size_t b = 8 * from_byte; b < 8 * to_byte; ++b) out.push_back(b);
  return out;
}

class SessionStoreCorruption : public ScratchTest {};

// The global-only file of a 12-token session (a few KB): every bit, the token tail's included.
TEST_F(SessionStoreCorruption, EveryBitFlipOfAGlobalFileIsRefused) {
  const std::vector<uint8_t> file = session_bytes(prefilled(12), fixture().config, false);
  ASSERT_EQ(section_bytes(file, find_section(file, SessionSection::kTokenTail)), 12u * 8);
  const std::vector<size_t> bits = all_bits(0, file.size());
  std::printf("[bit flips] global-only file of %zu bytes: all %zu bits flipped\n", file.size(), bits.size());
  expect_every_flip_refused(file, bits);
}

// The full file of a 13-token session (~95 KB, most of it SWA rings): every bit of the header,
// the section table and the global sections (a pending group and the token tail included), and a
// sample of the SWA sections' bits (every ring, from the data seed).
TEST_F(SessionStoreCorruption, BitFlipsOfAFullFileAreRefused) {
  const std::vector<uint8_t> file = session_bytes(prefilled(13), fixture().config, true);
  const size_t first_swa = section_offset(file, find_section(file, SessionSection::kSwaRing));
  std::vector<size_t> bits = all_bits(0, first_swa);
  const size_t exhaustive = bits.size();
  constexpr size_t kSampled = 20000;
  std::mt19937_64 rng(test::seed_for("session_store/swa_bit_flips"));
  std::uniform_int_distribution<size_t> pick(8 * first_swa, 8 * file.size() - 1);
  for (size_t k = 0; k < kSampled; ++k) bits.push_back(pick(rng));
  bits.push_back(8 * file.size() - 1);  // the very last bit
  std::printf("[bit flips] full file of %zu bytes: all %zu bits of header, table and global sections "
              "(%zu bytes), %zu sampled bits of the SWA sections\n",
              file.size(), exhaustive, first_swa, bits.size() - exhaustive);
  expect_every_flip_refused(file, bits);
}

// Through real files: a flip in the first and last byte of every section.
TEST_F(SessionStoreCorruption, FlippedFilesAreRefused) {
  const Fixture f = fixture();
  const std::vector<uint8_t> good = session_bytes(prefilled(13), f.config, true);
  const std::string path = scratch() + "/flipped.dsv41s";
  for (size_t i = 0; i < n_sections(good); ++i) {
    for (size_t at : {section_offset(good, i), section_offset(good, i) + section_bytes(good, i) - 1}) {
      if (section_bytes(good, i) == 0) continue;
      std::vector<uint8_t> bad = good;
      bad[at] ^= 0x10;
      write_file(path, bad);
      const std::string e = error_of([&] { load_session(path, f.config, *f.model); });
      EXPECT_TRUE(has(e, "session file '" + path + "': section " + std::to_string(i + 1) + " of ")) << e;
      EXPECT_TRUE(has(e, "checksum mismatch")) << e;
    }
  }
}

TEST_F(SessionStoreCorruption, TruncationIsRefused) {
  const Fixture f = fixture();
  const std::vector<uint8_t> file = session_bytes(prefilled(13), f.config, true);
  const size_t table_end = 48 + 44 * n_sections(file) + 4;
  std::vector<size_t> lengths;
  for (size_t len = 0; len <= table_end; ++len) lengths.push_back(len);  // every length of the header and table
  for (size_t len = table_end + 1; len < file.size(); len += 61) lengths.push_back(len);
  for (size_t i = 0; i < n_sections(file); ++i) {  // around every section boundary
    for (size_t d : {0, 1}) lengths.push_back(section_offset(file, i) + d);
  }
  lengths.push_back(file.size() - 1);
  for (size_t len : lengths) {
    if (len >= file.size()) continue;
    const std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(len));
    const std::string e = error_of([&] { load_session_bytes(cut, "cut.dsv41s", f.config, *f.model); });
    ASSERT_TRUE(has(e, "session file 'cut.dsv41s': truncated: " + std::to_string(len) + " bytes")) << len << ": " << e;
  }
  std::printf("[truncation] %zu lengths of a %zu-byte file refused\n", lengths.size(), file.size());
  // Through a file, and trailing bytes.
  const std::string path = scratch() + "/cut.dsv41s";
  write_file(path, std::vector<uint8_t>(file.begin(), file.begin() + 100));
  EXPECT_TRUE(has(error_of([&] { load_session(path, f.config, *f.model); }), "truncated: 100 bytes"));
  std::vector<uint8_t> longer = file;
  longer.push_back(0);
  EXPECT_TRUE(has(load_error(longer, f.config), "(trailing bytes)")) << load_error(longer, f.config);
}

// ---- refusals with clear messages ----

class SessionStoreErrors : public ScratchTest {};

TEST_F(SessionStoreErrors, AnotherConfigIsRefused) {
  const Fixture f = fixture();
  const std::string path = scratch() + "/tiny.dsv41s";
  save_session(path, prefilled(12), f.config, true);
  const ModelConfig full = load_config("full");
  const std::string e = error_of([&] { load_session(path, full, *f.model); });
  EXPECT_TRUE(has(e, "session file '" + path + "': config hash mismatch: the file was saved with config " +
                         config_hash(f.config) + ", the config given has hash " + config_hash(full)))
      << e;
  EXPECT_TRUE(has(error_of([&] { read_session_header(path, full); }), "config hash mismatch"));
}

// A format 1 file as the previous version wrote it: no token tail section, version 1.
std::vector<uint8_t> as_format_1(const std::vector<uint8_t>& v2) {
  const size_t n = n_sections(v2), drop = find_section(v2, SessionSection::kTokenTail);
  const size_t dropped = section_bytes(v2, drop), payloads = 48 + 44 * n + 4;
  std::vector<uint8_t> out(v2.begin(), v2.begin() + 48);
  for (size_t i = 0; i < n; ++i) {
    if (i == drop) continue;
    std::vector<uint8_t> e(v2.begin() + static_cast<std::ptrdiff_t>(table_entry(i)),
                           v2.begin() + static_cast<std::ptrdiff_t>(table_entry(i) + 44));
    set_u64(e, 32, section_offset(v2, i) - 44 - (i > drop ? dropped : 0));
    out.insert(out.end(), e.begin(), e.end());
  }
  out.resize(out.size() + 4);
  out.insert(out.end(), v2.begin() + static_cast<std::ptrdiff_t>(payloads),
             v2.begin() + static_cast<std::ptrdiff_t>(section_offset(v2, drop)));
  out.insert(out.end(), v2.begin() + static_cast<std::ptrdiff_t>(section_offset(v2, drop) + dropped), v2.end());
  set_u32(out, 8, 1);
  set_u64(out, 32, out.size());
  set_u32(out, 40, static_cast<uint32_t>(n - 1));
  fix_header_crc(out);
  fix_table_crc(out);
  return out;
}

TEST_F(SessionStoreErrors, WrongVersionIsRefused) {
  const ModelConfig& c = fixture().config;
  std::vector<uint8_t> b = session_bytes(prefilled(12), c, true);
  EXPECT_EQ(get_u32(b, 8), 2u);
  set_u32(b, 8, 3);
  EXPECT_TRUE(has(load_error(b, c), "unsupported format version 3 (this build reads version 2)")) << load_error(b, c);
  fix_header_crc(b);  // a well-formed header of another version
  EXPECT_TRUE(has(load_error(b, c), "unsupported format version 3"));

  // Format 1 (no token tail): refused with what to do, in both modes and by the header check.
  for (bool swa : {false, true}) {
    const std::vector<uint8_t> v1 = as_format_1(session_bytes(prefilled(12), c, swa));
    const std::string path = scratch() + "/v1.dsv41s";
    write_file(path, v1);
    const std::string want = "session file '" + path + "': session file format 1 is not read by this build (it reads "
                             "format 2, which adds the token tail that a global-only resume replays); re-save with "
                             "this version";
    EXPECT_TRUE(has(error_of([&] { load_session(path, c, *fixture().model); }), want))
        << error_of([&] { load_session(path, c, *fixture().model); });
    EXPECT_TRUE(has(error_of([&] { load_session(path, c, *fixture().model, ResumeMode::kGlobalOnly); }), want));
    EXPECT_TRUE(has(error_of([&] { read_session_header(path, c); }), want));
    // The same bytes as format 2 would be a valid file but for the missing section.
    std::vector<uint8_t> relabelled = v1;
    set_u32(relabelled, 8, 2);
    fix_header_crc(relabelled);
    EXPECT_TRUE(has(load_error(relabelled, c), "section table inconsistent")) << load_error(relabelled, c);
  }
}

TEST_F(SessionStoreErrors, WrongMagicIsRefused) {
  std::vector<uint8_t> b = session_bytes(prefilled(12), fixture().config, true);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "DSV41SES");
  b[0] = 'X';
  EXPECT_TRUE(has(load_error(b, fixture().config),
                  "session file 'patched.dsv41s': not a dsv41 session file (wrong magic \"XSV41SES\""))
      << load_error(b, fixture().config);
  const std::string path = scratch() + "/text.txt";
  std::ofstream(path) << "this is not a session file at all, but it is long enough for a header\n";
  EXPECT_TRUE(has(error_of([&] { load_session(path, fixture().config, *fixture().model); }), "wrong magic"));
  EXPECT_TRUE(has(error_of([&] { load_session(scratch() + "/absent", fixture().config, *fixture().model); }),
                  "cannot open session file"));
  EXPECT_TRUE(has(error_of([&] { load_session(scratch(), fixture().config, *fixture().model); }), "not a regular file"));
}

TEST_F(SessionStoreErrors, HeaderAndTableChecksumsAreNamed) {
  std::vector<uint8_t> b = session_bytes(prefilled(12), fixture().config, true);
  std::vector<uint8_t> h = b;
  h[24] ^= 1;  // pos
  EXPECT_TRUE(has(load_error(h, fixture().config), "header checksum mismatch (stored 0x")) << load_error(h, fixture().config);
  std::vector<uint8_t> t = b;
  t[table_entry(3) + 24] ^= 1;  // a count
  EXPECT_TRUE(has(load_error(t, fixture().config), "section table checksum mismatch")) << load_error(t, fixture().config);
}

// Tables with valid checksums that contradict the config or pos.
TEST_F(SessionStoreErrors, InconsistentSectionTableIsRefused) {
  const ModelConfig& c = fixture().config;
  const std::vector<uint8_t> good = session_bytes(prefilled(12), c, true);
  {  // pos 14 with the entries of pos 12: layer 2 must hold 14 / 2 = 7 entries
    std::vector<uint8_t> b = good;
    set_u64(b, 24, 14);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "section table inconsistent: section 1 of 20 (compressed KV of layer 2): holds 6 "
                                      "entries, but a state at position 14 holds exactly pos / ratio = 7"))
        << load_error(b, c);
  }
  {  // the table's own count disagrees
    std::vector<uint8_t> b = good;
    set_u64(b, table_entry(1) + 24, 5);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(index keys of layer 2): holds 5 entries")) << load_error(b, c);
  }
  {  // another owner
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 4, 3);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "the table names layer 3 with ratio 2, but the config's schedule has kv source "
                                      "layer 2 with ratio 2 there"))
        << load_error(b, c);
  }
  {  // another ratio
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 8, 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "the table names layer 2 with ratio 1")) << load_error(b, c);
  }
  {  // another entry size
    std::vector<uint8_t> b = good;
    set_u32(b, table_entry(0) + 12, 288);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "entries of 288 bytes, the config's are 72")) << load_error(b, c);
  }
  {  // a gap between sections
    std::vector<uint8_t> b = good;
    set_u64(b, table_entry(2) + 32, section_offset(good, 2) + 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "starts at byte")) << load_error(b, c);
  }
  {  // the SWA flag cleared: the table has 10 sections too many
    std::vector<uint8_t> b = good;
    set_u32(b, 12, 0);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "20 sections, but a state of this config without SWA rings has 10")) << load_error(b, c);
  }
  {  // the token tail: 12 ids at position 12, first position 0
    std::vector<uint8_t> b = good;
    const size_t i = find_section(b, SessionSection::kTokenTail);
    EXPECT_EQ(i, 9u);
    set_u64(b, table_entry(i) + 24, 11);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "section 10 of 20 (token tail): holds 11 entries, but a state at position 12 "
                                      "holds exactly min(pos, window_size + engram_max_ngram_size - 1) = 12"))
        << load_error(b, c);
    b = good;
    set_u64(b, table_entry(i) + 16, 1);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): first position 1, expected 0 at position 12")) << load_error(b, c);
    b = good;
    set_u32(b, table_entry(i) + 4, 0);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): the table names layer 0 with ratio 0, but the config's schedule "
                                      "has layer -1 with ratio 0 there"))
        << load_error(b, c);
    b = good;
    set_u32(b, table_entry(i), 4);
    fix_table_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "(token tail): the table has kind 4, the config's layout has kind 6 there"))
        << load_error(b, c);
  }
  {  // unknown flags
    std::vector<uint8_t> b = good;
    set_u32(b, 12, 3);
    fix_header_crc(b);
    EXPECT_TRUE(has(load_error(b, c), "unknown header flags 0x00000003")) << load_error(b, c);
  }
}

// Entries the formats cannot have written, with every checksum valid.
TEST_F(SessionStoreErrors, CorruptEntriesAreRefused) {
  const ModelConfig& c = fixture().config;
  const std::vector<uint8_t> good = session_bytes(prefilled(13), c, true);
  const auto patched = [&](SessionSection kind, int layer, size_t at, std::vector<uint8_t> value) {
    std::vector<uint8_t> b = good;
    const size_t i = find_section(b, kind, layer);
    std::copy(value.begin(), value.end(), b.begin() + static_cast<std::ptrdiff_t>(section_offset(b, i) + at));
    fix_section_crc(b, i);
    return load_error(b, c);
  };
  const size_t kv_scale = static_cast<size_t>(c.head_dim / 2), key_scale = static_cast<size_t>(c.index_head_dim / 2);
  std::string e = patched(SessionSection::kCompressedKv, 4, 72 + kv_scale + 1, {0xFF});
  EXPECT_TRUE(has(e, "(compressed KV of layer 4): compressed KV cache of layer 4: entry 1 block 1 has scale byte 0xff, "
                     "not an E4M3 scale the quantizer writes [0x01, 0x7e]"))
      << e;
  e = patched(SessionSection::kCompressedKv, 2, kv_scale, {0x00});
  EXPECT_TRUE(has(e, "entry 0 block 0 has scale byte 0x00")) << e;
  e = patched(SessionSection::kIndexKeys, 6, key_scale, {0xFF});
  EXPECT_TRUE(has(e, "(index keys of layer 6): index-key cache of layer 6: entry 0 block 0 has scale byte 0xff")) << e;
  e = patched(SessionSection::kSwaRing, 3, 0, {1});  // slot 0 claims position 1
  EXPECT_TRUE(has(e, "(SWA ring of layer 3): slot 0 holds position 1, but at position 13 slot 0 holds 0")) << e;
  e = patched(SessionSection::kSwaRing, 3, 8 + 5, {0x7F});
  EXPECT_TRUE(has(e, "slot 0 (position 0) byte 5 is 0x7f: an E4M3 NaN code")) << e;
  e = patched(SessionSection::kSwaRing, 3, 8 + static_cast<size_t>(c.head_dim), {0xFF});
  EXPECT_TRUE(has(e, "is 0xff: not an E8M0 scale the quantizer writes")) << e;
  const size_t empty_slot = 20 * (8 + static_cast<size_t>(c.head_dim + c.head_dim / 32));
  e = patched(SessionSection::kSwaRing, 3, empty_slot + 8, {0x01});
  EXPECT_TRUE(has(e, "slot 20 (position -1) byte 0 is 0x01: an empty slot holds zeros")) << e;
  e = patched(SessionSection::kEngramTail, -1, 8, {0x00, 0x10, 0, 0, 0, 0, 0, 0});
  EXPECT_TRUE(has(e, "(Engram tail): position 11 holds compressed id 4096, outside [0, engram_compressed_vocab_size 512)"))
      << e;
  e = patched(SessionSection::kTokenTail, -1, 8 * 12, {0x00, 0x04, 0, 0, 0, 0, 0, 0});
  EXPECT_TRUE(has(e, "section 10 of 20 (token tail): position 12 holds token id 1024, outside the vocab [0, 1024)")) << e;
  e = patched(SessionSection::kTokenTail, -1, 0, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  EXPECT_TRUE(has(e, "(token tail): position 0 holds token id -1, outside the vocab [0, 1024)")) << e;
  e = patched(SessionSection::kCompressorPending, 4, 4 * 7, {0x00, 0x00, 0xC0, 0x7F});
  EXPECT_TRUE(has(e, "(compressor pending group of layer 4): slot 0: kv channel 7 is not finite (bits 0x7fc00000)")) << e;
}

// ---- the restore methods ----

TEST(SessionStoreRestore, CacheRestoreChecksScales) {
  CompressedKvCache kv(2, 2, 32, 4);
  std::vector<uint8_t> bytes(static_cast<size_t>(2 * kv.entry_bytes()), 0x11);
  // Entries of 18 bytes: 16 nibble bytes, then 2 E4M3 scales.
  for (size_t i : {16, 17, 34, 35}) bytes[i] = 0x30;
  kv.restore(bytes.data(), 2);
  EXPECT_EQ(kv.size(), 2);
  EXPECT_EQ(kv.entry(1)[0], 0x11);
  EXPECT_EQ(kv.read(2, 2, 2).dim(0), 2);
  bytes[35] = 0x7F;  // E4M3 NaN
  EXPECT_TRUE(has(error_of([&] { kv.restore(bytes.data(), 2); }), "entry 1 block 1 has scale byte 0x7f"));
  EXPECT_TRUE(has(error_of([&] { kv.restore(bytes.data(), 5); }), "restore of 5 entries, capacity 4"));

  IndexKeyCache keys(4, 2, 32, 3);
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
  const ModelState s = prefilled(12);
  save_session(path, s, c, true);
  const std::vector<uint8_t> good = read_file(path);
  const ModelState other = prefilled(13);

  // The temp file cannot be created (something is in its place): nothing written, nothing removed.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_directories(tmp);
  std::string e = error_of([&] { save_session(path, other, c, true); });
  EXPECT_TRUE(has(e, "cannot write session file '" + path + "': cannot create '" + tmp + "'")) << e;
  EXPECT_EQ(read_file(path), good);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"s.dsv41s", "s.dsv41s.tmp." + std::to_string(::getpid())}));
  fs::remove(tmp);

  // An inconsistent state fails before any file is touched.
  ModelState broken = prefilled(13);
  broken.pos = 14;
  EXPECT_TRUE(has(error_of([&] { save_session(path, broken, c, true); }), "save_session:"));
  EXPECT_EQ(read_file(path), good);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"s.dsv41s"});

  // The rename fails (the target is a directory): the temp file is removed.
  const std::string target = dir + "/target";
  fs::create_directories(target + "/inside");
  e = error_of([&] { save_session(target, other, c, true); });
  EXPECT_TRUE(has(e, "cannot write session file '" + target + "': rename")) << e;
  EXPECT_TRUE(fs::is_directory(target + "/inside"));
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"s.dsv41s", "target"}));

  // A directory that does not exist.
  e = error_of([&] { save_session(dir + "/absent/s.dsv41s", other, c, true); });
  EXPECT_TRUE(has(e, "cannot create")) << e;
  EXPECT_FALSE(fs::exists(dir + "/absent"));
}

}  // namespace
}  // namespace dsv41::reference
