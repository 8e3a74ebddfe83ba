// tests/support/session_store_util.h
//
// Shared by the session-store tests (tests/reference/session/session_store_test.cc and
// session_store_corruption_test.cc): the oracle model fixture, runs recorded per position, scratch
// files, and the documented file layout (docs/session-store.md) for patching saved files. Test-only
// helpers in an unnamed namespace: each test executable includes it once.
#pragma once


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

#include "base/base.h"
#include "formats/cache_format.h"
#include "base/error.h"
#include "golden/golden_io.h"
#include "reference/session/byte_accounting.h"
#include "base/crc32c.h"
#include "reference/model/model.h"
#include "reference/checkpoint/weights.h"
#include "tests/support/oracle_model.h"
#include "tests/support/seed.h"

#include "reference/session/session_store.h"

namespace dsv41::reference {
namespace {

namespace fs = std::filesystem;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
constexpr int64_t kTokens = 120;  // oracle prompt tokens used (the longest run: 117 + 3 decode steps)

struct Fixture {
  const ModelConfig& config;
  const model::Model* model;
};

inline Fixture fixture() {
  const test::OracleModel& m = test::oracle_model();
  return {m.config, m.model.get()};
}

inline std::vector<int64_t> tokens(int64_t first, int64_t count) {
  EXPECT_LE(first + count, kTokens);
  return test::oracle_tokens(first, count);
}

// A state after prefilling the first n oracle tokens.
inline model::ModelState prefilled(int64_t n) {
  model::ModelState s = fixture().model->new_state();
  fixture().model->forward_chunk(s, tokens(0, n));
  return s;
}

// Copies of one run's state at each of the ascending positions (one forward per gap: chunking
// gives the same bits as one prefill, model_chunking_test).
inline std::vector<model::ModelState> states_at(const std::vector<int64_t>& positions) {
  std::vector<model::ModelState> out;
  model::ModelState s = fixture().model->new_state();
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
inline std::vector<uint8_t> carried_state(const model::ModelState& s, const ModelConfig& c, bool with_swa) {
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  put(&s.pos, sizeof s.pos);
  for (const model::LayerState& ls : s.layers) {
    if (with_swa) {
      put(ls.window_kv.bytes.data().data(), ls.window_kv.bytes.data().size());
      put(ls.window_kv.positions.data(), ls.window_kv.positions.size() * sizeof(int64_t));
    }
    if (ls.compressed_kv) {
      for (int64_t e = 0; e < ls.compressed_kv->size(); ++e) put(ls.compressed_kv->entry(e), static_cast<size_t>(ls.compressed_kv->entry_bytes()));
    }
    if (ls.index_keys) {
      for (int64_t e = 0; e < ls.index_keys->size(); ++e) put(ls.index_keys->entry(e), static_cast<size_t>(ls.index_keys->entry_bytes()));
    }
    if (ls.compressor) {
      const model::CompressorState& cs = *ls.compressor;
      put(&cs.next_pos, sizeof cs.next_pos);
      for (int slot = 0; slot < cs.pending(); ++slot) {
        put(cs.kv.row(slot), static_cast<size_t>(cs.dim) * sizeof(float));
        put(cs.score.row(slot), static_cast<size_t>(cs.dim) * sizeof(float));
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
inline void record(Trace& tr, const model::StepRecord& r, const ModelConfig& c, int64_t width) {
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
inline std::map<int, std::vector<Row>> from_position(const std::map<int, std::vector<Row>>& m, int64_t first, int64_t from) {
  std::map<int, std::vector<Row>> out;
  for (const auto& [l, rows] : m) out[l].assign(rows.begin() + (from - first), rows.end());
  return out;
}

// ---- scratch files ----

// A per-process directory for the running test, removed when it passes.
inline std::string scratch() {
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

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}
inline std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the dsv41::Error that f throws; "(no error)" if it returns, "(other exception)"
// for anything that is not a dsv41::Error.
template <typename F>
inline std::string error_of(F&& f) {
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

inline uint32_t get_u32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8 | uint32_t{b[at + 2]} << 16 | uint32_t{b[at + 3]} << 24;
}
inline uint64_t get_u64(const std::vector<uint8_t>& b, size_t at) {
  return uint64_t{get_u32(b, at)} | uint64_t{get_u32(b, at + 4)} << 32;
}
inline void set_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}
inline void set_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  set_u32(b, at, static_cast<uint32_t>(v));
  set_u32(b, at + 4, static_cast<uint32_t>(v >> 32));
}
size_t table_entry(size_t i) { return 48 + 44 * i; }
size_t n_sections(const std::vector<uint8_t>& b) { return get_u32(b, 40); }
size_t section_offset(const std::vector<uint8_t>& b, size_t i) { return get_u64(b, table_entry(i) + 32); }
inline size_t section_bytes(const std::vector<uint8_t>& b, size_t i) {
  return get_u32(b, table_entry(i) + 12) * get_u64(b, table_entry(i) + 24);
}
inline void fix_header_crc(std::vector<uint8_t>& b) { set_u32(b, 44, crc32c(b.data(), 44)); }
inline void fix_table_crc(std::vector<uint8_t>& b) {
  const size_t n = n_sections(b);
  set_u32(b, 48 + 44 * n, crc32c(b.data() + 48, 44 * n));
}
inline void fix_section_crc(std::vector<uint8_t>& b, size_t i) {
  set_u32(b, table_entry(i) + 40, crc32c(b.data() + section_offset(b, i), section_bytes(b, i)));
  fix_table_crc(b);
}
// Index of the first section of `kind` (and `layer`, unless -2).
inline size_t find_section(const std::vector<uint8_t>& b, session::SessionSection kind, int layer = -2) {
  for (size_t i = 0; i < n_sections(b); ++i) {
    if (get_u32(b, table_entry(i)) == static_cast<uint32_t>(kind) &&
        (layer == -2 || static_cast<int32_t>(get_u32(b, table_entry(i) + 4)) == layer)) {
      return i;
    }
  }
  ADD_FAILURE() << "no section of kind " << name(kind) << " layer " << layer;
  return 0;
}

inline std::string load_error(const std::vector<uint8_t>& bytes, const ModelConfig& c) {
  return error_of([&] { session::load_session_bytes(bytes, "patched.dsv41s", c, *fixture().model); });
}

}  // namespace
}  // namespace dsv41::reference
