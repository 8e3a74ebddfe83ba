// `dsv41 forward` sessions end to end (docs/forward.md, docs/session-store.md): --save-state then
// --resume equals one plain longer run (/logits rows, /topk and the other per-position rows, the
// final caches), in full mode and, for a session no longer than the window, in global-only mode
// from a --drop-swa file; a global-only resume of a longer session writes the same layout with
// other logits (encoder replay is approximate by design); --chunk gives the same output file
// contents as no chunking; bad session files and inconsistent session options exit 2 with a
// message naming the problem, leaving no output.
//
// Inputs: the tiny oracle config, weights, token map and prompt tokens. Sizes: the first run
// saves at position 41 (odd: a ratio-2 group is pending; < window 64: a global-only resume
// replays it whole), the resumed run continues with 60 tokens and 3 decode steps (104 positions:
// 52 ratio-2 positions > index_topk 32, so the top-k selects, and the 64-slot rings wrap). The
// long global-only case saves at 80 > 64 and continues with 20 tokens and 3 decode steps.
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "golden/golden_io.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
using dsv41::golden::Array;
using dsv41::golden::H5File;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";
constexpr int64_t kVocab = 1024;
constexpr int64_t kSaved = 41, kMore = 60, kSteps = 3;

using Result = dsv41::test::CliResult;
using dsv41::test::has;
using dsv41::test::read_bytes;
using dsv41::test::scratch;
Result run(const std::string& args) { return dsv41::test::run_dsv41(args); }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != "stdout" && name != "stderr") out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void write_ids(const std::string& path, const std::vector<int64_t>& ids) {
  std::ofstream out(path);
  for (int64_t id : ids) out << id << "\n";
}

// The oracle prompt tokens and token map; @FILE lists of the parts a test runs.
struct Inputs {
  std::vector<int64_t> tokens;
  std::string map_file;
};

Inputs oracle_inputs() {
  Inputs in;
  const H5File prefill(kOracle + "prefill.h5");
  in.tokens = prefill.read<int64_t>("prefill/tokens/value", 2).data;
  in.map_file = scratch() + "/token_map.txt";
  write_ids(in.map_file, prefill.read<int64_t>("prefill/state/engram/token_map/value", 1).data);
  return in;
}

// `forward` over tokens [first, first + count) as --prompt, then the next `steps` tokens as
// --decode, writing `output`.
std::string forward(const Inputs& in, int64_t first, int64_t count, int64_t steps, const std::string& output,
                    const std::string& extra = "") {
  const std::string prompt = scratch() + "/prompt_" + std::to_string(first) + "_" + std::to_string(count) + ".txt";
  write_ids(prompt, std::vector<int64_t>(in.tokens.begin() + first, in.tokens.begin() + first + count));
  std::string decode;
  for (int64_t k = 0; k < steps; ++k) {
    if (k > 0) decode += ",";
    decode += std::to_string(in.tokens[static_cast<size_t>(first + count + k)]);
  }
  return "forward --config '" + kConfig + "' --weights '" + kWeights + "' --token-map '" + in.map_file +
         "' --prompt @'" + prompt + "'" + (steps > 0 ? " --decode " + decode : "") + " -o '" + output + "' " + extra;
}

// An int64 attribute of `/` via the HDF5 C API; -999 if absent.
int64_t int_attr(const std::string& file, const std::string& name) {
  int64_t value = -999;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return value;
  if (H5Aexists(f, name.c_str()) > 0) {
    const hid_t a = H5Aopen(f, name.c_str(), H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &value);
    H5Aclose(a);
  }
  H5Fclose(f);
  return value;
}

template <typename T>
bool same(const Array<T>& a, const Array<T>& b) {
  return a.shape == b.shape && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0;
}

// Rows [from, end) of a rank-2 array.
template <typename T>
Array<T> rows_from(const Array<T>& a, int64_t from) {
  Array<T> out;
  out.shape = {a.dim(0) - from, a.dim(1)};
  out.data.assign(a.data.begin() + from * a.dim(1), a.data.end());
  return out;
}

// Every dataset of the forward output, by its type (docs/forward-output.md).
template <typename F>
void for_each_dataset(const H5File& h, F&& f) {
  f.template operator()<float>("logits");
  f.template operator()<int64_t>("tokens");
  for (const std::string& l : h.children("topk")) f.template operator()<int32_t>("topk/" + l);
  for (const std::string& l : h.children("candidates")) f.template operator()<uint8_t>("candidates/" + l);
  for (const std::string& l : h.children("engram")) f.template operator()<int64_t>("engram/" + l);
  for (const std::string& l : h.children("experts")) f.template operator()<int32_t>("experts/" + l);
  for (const std::string& l : h.children("cache")) {
    for (const std::string& d : h.children("cache/" + l)) {
      const std::string p = "cache/" + l + "/" + d;
      if (d == "window_kv_packed" || d == "compressed_kv_packed" || d == "index_keys_packed") {
        f.template operator()<uint8_t>(p);
      } else if (d == "window_kv_positions") {
        f.template operator()<int64_t>(p);
      } else if (d == "compressed_kv_bf16" || d == "index_keys_bf16") {
        f.template operator()<uint16_t>(p);
      } else if (d == "compressor_kv_state" || d == "compressor_score_state") {
        f.template operator()<float>(p);
      } else {
        ADD_FAILURE() << "unknown cache dataset " << p;
      }
    }
  }
}

// `resumed` (a run resumed at position `saved`) holds `plain`'s rows from `saved` on, bit for bit,
// and the same final caches.
void expect_rows_of_plain(const std::string& plain, const std::string& resumed, int64_t saved) {
  const H5File p(plain), r(resumed);
  // /logits: one row for the (continued) prompt, one per decode step: the same bits.
  const Array<float> logits = r.read<float>("logits", 2);
  ASSERT_EQ(logits.shape, (std::vector<int64_t>{1 + kSteps, kVocab}));
  EXPECT_TRUE(std::any_of(logits.data.begin(), logits.data.end(), [](float v) { return v != 0.0f; }));
  EXPECT_TRUE(same(logits, p.read<float>("logits", 2))) << "logits";
  // Per-position datasets: the resumed rows are the plain run's rows from position `saved` on.
  const std::vector<int64_t> all = p.read<int64_t>("tokens", 1).data;
  EXPECT_EQ(r.read<int64_t>("tokens", 1).data, std::vector<int64_t>(all.begin() + saved, all.end()));
  EXPECT_EQ(r.children("topk"), p.children("topk"));
  for (const char* group : {"topk", "experts"}) {
    for (const std::string& l : p.children(group)) {
      const Array<int32_t> want = rows_from(p.read<int32_t>(std::string(group) + "/" + l, 2), saved);
      EXPECT_TRUE(same(r.read<int32_t>(std::string(group) + "/" + l, 2), want)) << group << "/" << l;
    }
  }
  for (const std::string& l : p.children("engram")) {
    EXPECT_TRUE(same(r.read<int64_t>("engram/" + l, 2), rows_from(p.read<int64_t>("engram/" + l, 2), saved))) << l;
  }
  for (const std::string& l : p.children("candidates")) {
    EXPECT_TRUE(same(r.read<uint8_t>("candidates/" + l, 2), rows_from(p.read<uint8_t>("candidates/" + l, 2), saved)))
        << l;
  }
  // The top-k selected for real: index_topk valid positions in the last rows.
  const Array<int32_t> topk = r.read<int32_t>("topk/layer02", 2);
  EXPECT_EQ(topk.dim(1), 32);
  EXPECT_GE(topk.at(topk.dim(0) - 1, 31), 0);
  // The final caches: identical.
  EXPECT_EQ(r.children("cache"), p.children("cache"));
  for (const std::string& l : p.children("cache")) {
    for (const std::string& d : p.children("cache/" + l)) {
      const std::string path = "cache/" + l + "/" + d;
      bool equal = false;
      if (d == "window_kv_positions") {
        equal = same(r.read<int64_t>(path), p.read<int64_t>(path));
      } else if (d == "compressed_kv_bf16" || d == "index_keys_bf16") {
        equal = same(r.read<uint16_t>(path), p.read<uint16_t>(path));
      } else if (d == "compressor_kv_state" || d == "compressor_score_state") {
        equal = same(r.read<float>(path), p.read<float>(path));  // the decode steps rewrote every slot
      } else {
        equal = same(r.read<uint8_t>(path), p.read<uint8_t>(path));
      }
      EXPECT_TRUE(equal) << path;
    }
  }
}

// `resumed` has `plain`'s layout (docs/forward-output.md): the same datasets, the per-position ones
// with the rows from position `saved` on, /logits and the caches with the same shapes.
void expect_layout_of_plain(const std::string& plain, const std::string& resumed, int64_t saved) {
  const H5File p(plain), r(resumed);
  EXPECT_EQ(r.children("/"), p.children("/"));
  for (const char* group : {"topk", "candidates", "engram", "experts", "cache"}) {
    EXPECT_EQ(r.children(group), p.children(group)) << group;
  }
  for (const std::string& l : p.children("cache")) EXPECT_EQ(r.children("cache/" + l), p.children("cache/" + l)) << l;
  int datasets = 0;
  for_each_dataset(p, [&]<typename T>(const std::string& path) {
    std::vector<int64_t> want = p.read<T>(path).shape;
    const bool per_position = path != "logits" && path.rfind("cache/", 0) != 0;
    if (per_position) want[0] -= saved;
    EXPECT_EQ(r.read<T>(path).shape, want) << path;
    ++datasets;
  });
  EXPECT_GT(datasets, 40);
}

class ScratchTest : public testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(scratch());
  }
};
class SessionCli : public ScratchTest {};
class SessionCliErrors : public ScratchTest {};

TEST_F(SessionCli, SaveThenResumeEqualsOnePlainRun) {
  const Inputs in = oracle_inputs();
  const std::string dir = scratch(), state = dir + "/s41.dsv41s";
  const Result plain = run(forward(in, 0, kSaved + kMore, kSteps, dir + "/plain.h5"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Result first = run(forward(in, 0, kSaved, 0, dir + "/first.h5", "--save-state '" + state + "'"));
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_TRUE(has(first.err, "saved the session at position 41 to " + state)) << first.err;
  const Result resumed = run(forward(in, kSaved, kMore, kSteps, dir + "/resumed.h5",
                                     "--resume '" + state + "' --resume-mode full --start-pos 41"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(has(resumed.err, "resumed at position 41 from " + state + ": 60 more tokens, then 3 decode steps"))
      << resumed.err;
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"first.h5", "plain.h5", "prompt_0_101.txt", "prompt_0_41.txt",
                                                      "prompt_41_60.txt", "resumed.h5", "s41.dsv41s", "token_map.txt"}))
      << "temp file left behind";

  expect_rows_of_plain(dir + "/plain.h5", dir + "/resumed.h5", kSaved);
  EXPECT_EQ(int_attr(dir + "/resumed.h5", "start_pos"), kSaved);
  EXPECT_EQ(int_attr(dir + "/resumed.h5", "prompt_len"), kMore);
  EXPECT_EQ(int_attr(dir + "/plain.h5", "start_pos"), 0);
}

// A session no longer than the window, saved without its rings, resumed global-only: encoder
// replay runs the whole session, so the output equals the plain run's rows exactly.
TEST_F(SessionCli, GlobalOnlyResumeOfAShortSessionEqualsOnePlainRun) {
  const Inputs in = oracle_inputs();
  const std::string dir = scratch(), state = dir + "/g41.dsv41s";
  const Result plain = run(forward(in, 0, kSaved + kMore, kSteps, dir + "/plain.h5"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Result first = run(forward(in, 0, kSaved, 0, dir + "/first.h5", "--save-state '" + state + "' --drop-swa"));
  ASSERT_EQ(first.code, 0) << first.err;
  const Result resumed = run(forward(in, kSaved, kMore, kSteps, dir + "/resumed.h5",
                                     "--resume '" + state + "' --resume-mode global-only --start-pos 41"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(has(resumed.err, "resumed at position 41 from " + state +
                                   " (global-only: SWA rings rebuilt by encoder replay of the last 41 tokens): 60 more "
                                   "tokens, then 3 decode steps"))
      << resumed.err;
  expect_layout_of_plain(dir + "/plain.h5", dir + "/resumed.h5", kSaved);
  expect_rows_of_plain(dir + "/plain.h5", dir + "/resumed.h5", kSaved);
}

// A longer session (80 > window 64), saved without its rings, resumed global-only: exit 0, the
// plain run's layout, and other /logits (the replayed windows are truncated: approximate by
// design). The Engram ids depend on the tokens alone: exact.
TEST_F(SessionCli, GlobalOnlyResumeOfALongSessionKeepsTheLayout) {
  constexpr int64_t kLong = 80, kNext = 20;
  const Inputs in = oracle_inputs();
  const std::string dir = scratch(), state = dir + "/g80.dsv41s";
  const Result plain = run(forward(in, 0, kLong + kNext, kSteps, dir + "/plain.h5"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Result first = run(forward(in, 0, kLong, 0, dir + "/first.h5", "--save-state '" + state + "' --drop-swa"));
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_TRUE(has(first.err, "saved the session at position 80 to " + state + " (without SWA rings)")) << first.err;
  const Result full = run(forward(in, kLong, kNext, kSteps, dir + "/full.h5", "--resume '" + state + "'"));
  EXPECT_EQ(full.code, 2) << "a --drop-swa file cannot resume in full mode";
  const Result resumed = run(forward(in, kLong, kNext, kSteps, dir + "/resumed.h5",
                                     "--resume '" + state + "' --resume-mode global-only --start-pos 80"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(has(resumed.err, "resumed at position 80 from " + state +
                                   " (global-only: SWA rings rebuilt by encoder replay of the last 64 tokens)"))
      << resumed.err;
  expect_layout_of_plain(dir + "/plain.h5", dir + "/resumed.h5", kLong);
  const H5File p(dir + "/plain.h5"), r(dir + "/resumed.h5");
  const Array<float> got = r.read<float>("logits", 2), want = p.read<float>("logits", 2);
  ASSERT_EQ(got.shape, want.shape);
  float worst = 0;
  for (size_t i = 0; i < got.data.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.data[i])) << "logit " << i;
    worst = std::max(worst, std::fabs(got.data[i] - want.data[i]));
  }
  std::printf("[global-only resume] at 80: max |logit diff| vs the plain run %.4g\n", static_cast<double>(worst));
  EXPECT_GT(worst, 0.0f) << "a truncated replay must show in the logits";
  for (const std::string& l : p.children("engram")) {
    EXPECT_TRUE(same(r.read<int64_t>("engram/" + l, 2), rows_from(p.read<int64_t>("engram/" + l, 2), kLong))) << l;
  }
  EXPECT_EQ(int_attr(dir + "/resumed.h5", "start_pos"), kLong);
}

TEST_F(SessionCli, ChunkedPromptGivesTheSameOutput) {
  const Inputs in = oracle_inputs();
  const std::string dir = scratch();
  const Result one = run(forward(in, 0, 50, 2, dir + "/one.h5"));
  ASSERT_EQ(one.code, 0) << one.err;
  const Result chunked = run(forward(in, 0, 50, 2, dir + "/chunked.h5", "--chunk 7"));
  ASSERT_EQ(chunked.code, 0) << chunked.err;
  EXPECT_TRUE(has(chunked.err, "prefill of 50 tokens in chunks of 7, then 2 decode steps")) << chunked.err;
  const H5File a(dir + "/one.h5"), b(dir + "/chunked.h5");
  EXPECT_EQ(a.children("/"), b.children("/"));
  int datasets = 0;
  for_each_dataset(a, [&]<typename T>(const std::string& path) {
    EXPECT_TRUE(same(a.read<T>(path), b.read<T>(path))) << path;
    ++datasets;
  });
  EXPECT_GT(datasets, 40);
  EXPECT_EQ(a.read<float>("logits", 2).dim(0), 3);
}

// ---- bad session files and options: exit 2, the message, no output ----

// A saved 12-token session, with and without the SWA rings.
struct Saved {
  Inputs in;
  std::string full, global;
};

Saved saved_sessions() {
  Saved s;
  s.in = oracle_inputs();
  s.full = scratch() + "/full.dsv41s";
  s.global = scratch() + "/global.dsv41s";
  const Result a = run(forward(s.in, 0, 12, 0, scratch() + "/a.h5", "--save-state '" + s.full + "'"));
  EXPECT_EQ(a.code, 0) << a.err;
  const Result b = run(forward(s.in, 0, 12, 0, scratch() + "/b.h5", "--save-state '" + s.global + "' --drop-swa"));
  EXPECT_EQ(b.code, 0) << b.err;
  EXPECT_TRUE(has(b.err, "(without SWA rings)")) << b.err;
  EXPECT_LT(fs::file_size(s.global), fs::file_size(s.full));
  fs::remove(scratch() + "/a.h5");
  fs::remove(scratch() + "/b.h5");
  return s;
}

// Runs a resume of `file` that must fail: exit 2, "dsv41: error: " + message, no output file.
void expect_refused(const Saved& s, const std::string& extra, const std::string& message) {
  const std::string out = scratch() + "/out.h5";
  const Result r = run(forward(s.in, 12, 3, 1, out, extra));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("dsv41: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(has(r.err, message)) << "want '" << message << "' in: " << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const std::string& f : files_in(scratch())) EXPECT_FALSE(has(f, ".tmp.")) << "temp file left: " << f;
}

TEST_F(SessionCliErrors, BadSessionFiles) {
  const Saved s = saved_sessions();
  const std::string bytes = read_bytes(s.full);
  const std::string dir = scratch();

  const std::string text = dir + "/text.dsv41s";
  std::ofstream(text) << "not a session file, but longer than the 48-byte header of one\n";
  expect_refused(s, "--resume '" + text + "'", "session file '" + text + "': not a dsv41 session file (wrong magic");

  const std::string cut = dir + "/cut.dsv41s";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  expect_refused(s, "--resume '" + cut + "'",
                 "session file '" + cut + "': truncated: " + std::to_string(bytes.size() - 100) + " bytes");

  const std::string flipped = dir + "/flipped.dsv41s";
  std::string f = bytes;
  f[f.size() - 1000] = static_cast<char>(f[f.size() - 1000] ^ 0x04);  // inside the DSpark ring (the last section)
  std::ofstream(flipped, std::ios::binary) << f;
  expect_refused(s, "--resume '" + flipped + "'",
                 "session file '" + flipped + "': section 21 of 21 (DSpark ring of layer 10): checksum mismatch");
  f = bytes;
  const size_t swa = f.size() - 64 * 140 - 1000;  // inside the last SWA ring, before the 64-slot DSpark ring
  f[swa] = static_cast<char>(f[swa] ^ 0x04);
  std::ofstream(flipped, std::ios::binary) << f;
  expect_refused(s, "--resume '" + flipped + "'",
                 "session file '" + flipped + "': section 20 of 21 (SWA ring of layer 9): checksum mismatch");

  expect_refused(s, "--resume '" + dir + "/absent.dsv41s'", "session file '" + dir + "/absent.dsv41s': cannot open");
}

TEST_F(SessionCliErrors, ResumeNeedsTheMatchingConfigPositionAndSwa) {
  const Saved s = saved_sessions();
  expect_refused(s, "--resume '" + s.global + "'",
                 "--resume '" + s.global + "': the file holds no SWA state (it was saved with --drop-swa); "
                 "--resume-mode full needs the SWA rings of every layer (--resume-mode global-only rebuilds them)");
  expect_refused(s, "--resume '" + s.global + "' --resume-mode global-only --start-pos 11",
                 "resuming at a wrong position: --start-pos 11, but the session in '" + s.global + "' is at position 12");
  expect_refused(s, "--resume '" + s.full + "' --start-pos 11",
                 "resuming at a wrong position: --start-pos 11, but the session in '" + s.full + "' is at position 12");
  expect_refused(s, "--start-pos 12", "resuming at a wrong position: --start-pos 12, but a run without --resume starts at position 0");
  // Another config: the tiny weights never load, the header already disagrees.
  const std::string args = forward(s.in, 12, 3, 1, scratch() + "/out.h5", "--resume '" + s.full + "'");
  std::string other = args;
  other.replace(other.find("'" + kConfig + "'"), kConfig.size() + 2, "full");
  const Result r = run(other);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "session file '" + s.full + "': config hash mismatch: the file was saved with config ")) << r.err;
}

TEST_F(SessionCliErrors, InconsistentOptions) {
  const Saved s = saved_sessions();
  expect_refused(s, "--drop-swa", "--drop-swa: only with --save-state");
  expect_refused(s, "--resume-mode full", "--resume-mode: only with --resume");
  expect_refused(s, "--resume '" + s.full + "' --resume-mode sideways", "--resume-mode");
  expect_refused(s, "--chunk 0", "--chunk");
  expect_refused(s, "--save-state '" + scratch() + "/absent/s.dsv41s'",
                 "--save-state '" + scratch() + "/absent/s.dsv41s': directory '" + scratch() + "/absent' does not exist");
}

}  // namespace
