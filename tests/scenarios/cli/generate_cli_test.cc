// `dsv41 forward --generate` end to end (docs/forward.md, docs/forward-output.md):
//   - greedy speculative generation (fixed:1, fixed:3, threshold:0.5) emits the plain greedy
//     tokens, and its /logits, /tokens, per-position datasets and final caches are the plain run's
//     bit for bit; /speculative is consistent (every round emits accepted + 1 tokens, N in all);
//   - a sampled speculative run (which accepts drafts) has the rows of a --decode run of the same
//     tokens;
//   - a speculative run split as [prompt + generate 5, save] then [resume --first-token T +
//     generate 7] equals [prompt + generate 12]: the tokens, the /logits rows, the final caches;
//   - sampling replays exactly with the same --seed and differs with another;
//   - bad flag combinations exit 2 with a message naming the flags, and write nothing.
//
// Inputs: the tiny oracle config (one DSpark block of 5, window 64), its weights, token map and
// the first 40 prompt tokens (the 12 generated positions end at 52: no ring wraps, the run stays
// short). The seeds are printed.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
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
constexpr int64_t kVocab = 1024, kBlock = 5, kPrompt = 40;

using Result = dsv41::test::CliResult;
using dsv41::test::has;
using dsv41::test::scratch;
Result run(const std::string& args) { return dsv41::test::run_dsv41(args); }

void write_ids(const std::string& path, const std::vector<int64_t>& ids) {
  std::ofstream out(path);
  for (int64_t id : ids) out << id << "\n";
}

// `forward` with the oracle token map; `prompt` true: the first kPrompt oracle tokens as --prompt.
std::string forward(const std::string& output, const std::string& extra, bool prompt = true) {
  const std::string map = scratch() + "/token_map.txt", ids = scratch() + "/prompt.txt";
  if (!fs::exists(map)) {
    const H5File prefill(kOracle + "prefill.h5");
    write_ids(map, prefill.read<int64_t>("prefill/state/engram/token_map/value", 1).data);
    const std::vector<int64_t> tokens = prefill.read<int64_t>("prefill/tokens/value", 2).data;
    write_ids(ids, std::vector<int64_t>(tokens.begin(), tokens.begin() + kPrompt));
  }
  return "forward --config '" + kConfig + "' --weights '" + kWeights + "' --token-map '" + map + "'" +
         (prompt ? " --prompt @'" + ids + "'" : std::string()) + " -o '" + output + "' " + extra;
}

// Runs `args`, expecting success.
Result ok(const std::string& args) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r;
}

// The pending token a generating run printed.
int64_t pending_of(const Result& r) {
  const std::string key = "pending token ";
  const size_t at = r.err.find(key);
  EXPECT_NE(at, std::string::npos) << r.err;
  return at == std::string::npos ? -1 : std::stoll(r.err.substr(at + key.size()));
}

std::vector<int64_t> generated(const std::string& file) { return H5File(file).read<int64_t>("generated", 1).data; }

template <typename T>
bool same(const Array<T>& a, const Array<T>& b) {
  return a.shape == b.shape && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0;
}

// A float64 dataset, through the HDF5 C API (golden_io reads the oracle's types only).
std::vector<double> read_doubles(const std::string& file, const std::string& name) {
  std::vector<double> out;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  if (d >= 0) {
    const hid_t space = H5Dget_space(d);
    out.resize(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    H5Sclose(space);
    H5Dclose(d);
  }
  H5Fclose(f);
  return out;
}

// Generated tokens are ids of the vocab, not all equal (a real generation).
void expect_real_tokens(const std::vector<int64_t>& g, size_t n) {
  ASSERT_EQ(g.size(), n);
  for (int64_t t : g) ASSERT_TRUE(t >= 0 && t < kVocab) << t;
  ASSERT_TRUE(std::any_of(g.begin(), g.end(), [&](int64_t t) { return t != g[0]; })) << "a constant generation";
}

// Every dataset but /speculative and /generated, bit for bit (logits checked finite and non-zero).
void expect_same_forward(const std::string& a, const std::string& b) {
  const H5File x(a), y(b);
  const Array<float> logits = x.read<float>("logits", 2);
  ASSERT_TRUE(std::all_of(logits.data.begin(), logits.data.end(), [](float v) { return std::isfinite(v); }));
  ASSERT_TRUE(std::any_of(logits.data.begin(), logits.data.end(), [](float v) { return v != 0.0f; }));
  EXPECT_TRUE(same(logits, y.read<float>("logits", 2))) << "logits";
  EXPECT_TRUE(same(x.read<int64_t>("tokens", 1), y.read<int64_t>("tokens", 1))) << "tokens";
  for (const char* g : {"topk", "experts"}) {
    ASSERT_EQ(x.children(g), y.children(g));
    for (const std::string& l : x.children(g)) {
      EXPECT_TRUE(same(x.read<int32_t>(std::string(g) + "/" + l), y.read<int32_t>(std::string(g) + "/" + l))) << g << l;
    }
  }
  for (const std::string& l : x.children("engram")) {
    EXPECT_TRUE(same(x.read<int64_t>("engram/" + l), y.read<int64_t>("engram/" + l))) << l;
  }
  for (const std::string& l : x.children("candidates")) {
    EXPECT_TRUE(same(x.read<uint8_t>("candidates/" + l), y.read<uint8_t>("candidates/" + l))) << l;
  }
  for (const std::string& l : x.children("cache")) {
    const std::string p = "cache/" + l + "/";
    EXPECT_TRUE(same(x.read<uint8_t>(p + "window_kv_packed"), y.read<uint8_t>(p + "window_kv_packed"))) << p;
    EXPECT_TRUE(same(x.read<int64_t>(p + "window_kv_positions"), y.read<int64_t>(p + "window_kv_positions"))) << p;
    if (x.has(p + "compressed_kv_packed")) {
      EXPECT_TRUE(same(x.read<uint8_t>(p + "compressed_kv_packed"), y.read<uint8_t>(p + "compressed_kv_packed"))) << p;
    }
  }
}

class GenerateCli : public testing::Test {};

// Greedy: speculative == plain, for three policies; /speculative adds up.
TEST_F(GenerateCli, GreedySpeculativeEqualsPlainGreedy) {
  constexpr int64_t N = 12;
  const std::string plain = scratch() + "/plain.h5";
  ok(forward(plain, "--generate " + std::to_string(N)));
  const std::vector<int64_t> want = generated(plain);
  expect_real_tokens(want, N);
  EXPECT_FALSE(H5File(plain).has("speculative"));
  EXPECT_EQ(H5File(plain).read<float>("logits", 2).dim(0), N) << "the prompt's row, then N - 1 decode steps";
  for (const std::string policy : {"1", "3", "threshold:0.5"}) {
    SCOPED_TRACE("--speculative " + policy);
    const std::string out = scratch() + "/spec.h5";
    const Result r = ok(forward(out, "--generate " + std::to_string(N) + " --speculative " + policy));
    EXPECT_EQ(generated(out), want);
    EXPECT_EQ(pending_of(r), want.back());
    expect_same_forward(out, plain);
    const H5File h(out);
    const std::vector<int64_t> accepted = h.read<int64_t>("speculative/accepted", 1).data;
    const std::vector<int64_t> verified = h.read<int64_t>("speculative/verified", 1).data;
    const std::vector<int64_t> proposed = h.read<int64_t>("speculative/proposed", 1).data;
    const std::vector<int64_t> start = h.read<int64_t>("speculative/start_pos", 1).data;
    const Array<int32_t> realised = h.read<int32_t>("speculative/realised", 2);
    const Array<int64_t> drafts = h.read<int64_t>("speculative/draft_tokens", 2);
    const size_t R = accepted.size();
    ASSERT_GT(R, 0u);
    ASSERT_EQ(realised.shape, (std::vector<int64_t>{static_cast<int64_t>(R), kBlock}));
    ASSERT_EQ(drafts.shape, realised.shape);
    int64_t emitted = 0;
    for (size_t i = 0; i < R; ++i) {
      EXPECT_EQ(start[i], kPrompt + emitted) << "round " << i;
      EXPECT_LE(accepted[i], verified[i]);
      EXPECT_LE(verified[i], proposed[i]);
      if (policy == "1") {
        EXPECT_LE(verified[i], 1);
      }
      for (int64_t j = 0; j < kBlock; ++j) {
        const int32_t v = realised.at(static_cast<int64_t>(i), j);
        EXPECT_EQ(v, j < accepted[i] ? 1 : (j == accepted[i] && j < verified[i] ? 0 : -1)) << i << "," << j;
        EXPECT_EQ(drafts.at(static_cast<int64_t>(i), j) >= 0, j < proposed[i]);
      }
      emitted += accepted[i] + 1;
    }
    EXPECT_EQ(emitted, N - 1) << "token 0 comes from the prompt's logits";
    const std::vector<double> conf = read_doubles(out, "speculative/confidence");
    ASSERT_EQ(conf.size(), R * kBlock);
    for (size_t j = 0; j < conf.size(); ++j) {
      EXPECT_EQ(std::isnan(conf[j]), drafts.data[j] < 0);
      if (!std::isnan(conf[j])) {
        EXPECT_TRUE(conf[j] > 0 && conf[j] < 1) << conf[j];
      }
    }
    EXPECT_TRUE(has(r.err, "rounds, mean accepted length")) << r.err;
    std::printf("[generate] --speculative %s: %zu rounds for %lld tokens\n", policy.c_str(), R,
                static_cast<long long>(N));
  }
}

// A sampled speculative run accepts drafts (the greedy DSpark drafts of the oracle's random
// weights never match the target): its /logits, per-position datasets and caches, the verify
// steps' kept rows included, equal a plain run fed the same tokens with --decode, bit for bit.
TEST_F(GenerateCli, SpeculativeRowsEqualTeacherForcedDecoding) {
  const std::string spec = scratch() + "/spec.h5", forced = scratch() + "/forced.h5";
  ok(forward(spec, "--generate 20 --speculative 4 --sampling 0.9 --seed 0"));
  const std::vector<int64_t> accepted = H5File(spec).read<int64_t>("speculative/accepted", 1).data;
  ASSERT_TRUE(std::any_of(accepted.begin(), accepted.end(), [](int64_t m) { return m >= 2; }))
      << "no round kept 3 rows: the test would not cover the verify steps' kept rows";
  const std::vector<int64_t> fed = H5File(spec).read<int64_t>("tokens", 1).data;
  ASSERT_EQ(fed.size(), static_cast<size_t>(kPrompt + 19));
  std::string decode;
  for (size_t i = kPrompt; i < fed.size(); ++i) {
    if (!decode.empty()) decode += ",";
    decode += std::to_string(fed[i]);
  }
  ok(forward(forced, "--decode " + decode));
  expect_same_forward(spec, forced);
}

// [prompt + 5, save] + [resume --first-token + 7] == [prompt + 12], speculative greedy, full resume.
TEST_F(GenerateCli, SplitSpeculativeGenerationEqualsOneRun) {
  const std::string whole = scratch() + "/whole.h5", first = scratch() + "/first.h5", next = scratch() + "/next.h5";
  const std::string state = scratch() + "/s.dsv41s";
  ok(forward(whole, "--generate 12 --speculative 3"));
  const Result a = ok(forward(first, "--generate 5 --speculative 3 --save-state '" + state + "'"));
  const int64_t pending = pending_of(a);
  EXPECT_EQ(pending, generated(first).back());
  EXPECT_TRUE(has(a.err, "--first-token " + std::to_string(pending))) << a.err;
  const Result b = ok(forward(next, "--resume '" + state + "' --first-token " + std::to_string(pending) +
                                        " --generate 7 --speculative 3",
                              /*prompt=*/false));
  std::vector<int64_t> joined = generated(first);
  const std::vector<int64_t> more = generated(next);
  joined.insert(joined.end(), more.begin(), more.end());
  expect_real_tokens(generated(whole), 12);
  EXPECT_EQ(joined, generated(whole));
  EXPECT_EQ(pending_of(b), generated(whole).back());
  // /logits: the first run's 5 rows, then the resumed run's 7, are the whole run's 12.
  const Array<float> w = H5File(whole).read<float>("logits", 2), f = H5File(first).read<float>("logits", 2),
                     n = H5File(next).read<float>("logits", 2);
  ASSERT_EQ(f.dim(0), 5);
  ASSERT_EQ(n.dim(0), 7);
  Array<float> cat = f;
  cat.shape[0] = 12;
  cat.data.insert(cat.data.end(), n.data.begin(), n.data.end());
  EXPECT_TRUE(same(cat, w)) << "logits";
  // The final state (the caches) is the whole run's.
  const H5File x(next), y(whole);
  for (const std::string& l : y.children("cache")) {
    const std::string p = "cache/" + l + "/window_kv_packed";
    EXPECT_TRUE(same(x.read<uint8_t>(p), y.read<uint8_t>(p))) << p;
  }
}

// Sampling: the same seed replays the run (tokens, drafts, accept draws); another seed differs.
TEST_F(GenerateCli, SamplingReplaysWithTheSameSeedAndDiffersWithAnother) {
  const uint64_t seed = 20261129;
  std::printf("[generate] sampling seeds %llu and %llu\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed + 1));
  for (const std::string mode : {"--speculative 3", ""}) {
    SCOPED_TRACE(mode.empty() ? "plain" : mode);
    const std::string args = "--generate 12 --sampling 0.9,0.95 " + mode + " --seed ";
    const std::string a = scratch() + "/a.h5", b = scratch() + "/b.h5", c = scratch() + "/c.h5";
    const Result ra = ok(forward(a, args + std::to_string(seed)));
    EXPECT_TRUE(has(ra.err, "seed " + std::to_string(seed))) << ra.err;
    ok(forward(b, args + std::to_string(seed)));
    ok(forward(c, args + std::to_string(seed + 1)));
    expect_real_tokens(generated(a), 12);
    EXPECT_EQ(generated(a), generated(b));
    expect_same_forward(a, b);
    bool differs = generated(a) != generated(c);
    if (!mode.empty()) {
      EXPECT_TRUE(same(H5File(a).read<int64_t>("speculative/draft_tokens", 2),
                       H5File(b).read<int64_t>("speculative/draft_tokens", 2)));
      differs = differs || !same(H5File(a).read<int64_t>("speculative/draft_tokens", 2),
                                 H5File(c).read<int64_t>("speculative/draft_tokens", 2));
    }
    EXPECT_TRUE(differs) << "seeds " << seed << " and " << seed + 1 << " gave the same run";
  }
}

// Bad combinations: exit 2, the message names the flags, no output.
TEST_F(GenerateCli, BadFlagCombinationsAreRefused) {
  const std::string out = scratch() + "/out.h5";
  const auto refused = [&](const std::string& extra, const std::string& message, bool prompt = true) {
    const Result r = run(forward(out, extra, prompt));
    EXPECT_EQ(r.code, 2) << extra << "\n" << r.err;
    EXPECT_TRUE(has(r.err, message)) << extra << "\n" << r.err;
    EXPECT_FALSE(fs::exists(out)) << extra;
  };
  refused("--generate 3 --decode 1,2", "--generate and --decode: choose one");
  refused("--speculative 3", "--speculative: only with --generate N");
  refused("--sampling 0.5", "--sampling: only with --generate N");
  refused("--seed 4", "--seed: only with --generate N");
  refused("--generate 3 --sampling -1", "--sampling '-1': temperature -1 (want a finite value >= 0; 0 is greedy)");
  refused("--generate 3 --sampling nan", "--sampling 'nan': temperature nan");
  refused("--generate 3 --sampling abc", "--sampling 'abc': 'abc' is not a number");
  refused("--generate 3 --sampling 0.5,0", "--sampling '0.5,0': top-p 0 (want a value in (0, 1])");
  refused("--generate 3 --speculative 0", "--speculative '0': verify policy 'fixed:0': K must be an integer in [1, 64]");
  refused("--generate 3 --speculative best", "--speculative 'best': verify policy 'best'");
  refused("--generate 3 --first-token 5", "--first-token: only with --resume");
  refused("--generate 3", "--prompt: at least one token is needed (or, resuming a generation, --first-token)",
          /*prompt=*/false);
  refused("--generate 480 --speculative 3",
          "40 prompt tokens + 485 generated and drafted tokens = 525 positions, more than max_seq_len 512");
}

}  // namespace
