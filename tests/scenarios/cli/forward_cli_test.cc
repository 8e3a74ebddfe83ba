// `dsv41 forward` and `dsv41 weights` end to end (docs/cli.md, docs/forward-output.md): the built
// executable on the oracle config, weights, prompt and token map; the HDF5 layout it writes; its
// determinism (same run twice, 1 vs 2 threads); and exit code 2 with a message naming the
// problem for bad input, leaving no output or temp file behind.
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "golden/golden_io.h"
#include "tests/support/h5_attr.h"
#include "tests/support/run_cli.h"

namespace {

using dsv41::test::string_attr;

namespace fs = std::filesystem;
using dsv41::golden::Array;
using dsv41::golden::H5File;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

// The tiny config (golden/oracle/config.json) and the oracle run.
constexpr int64_t kVocab = 1024;
constexpr int64_t kPromptLen = 333;
constexpr int64_t kDecodeSteps = 3;
constexpr int64_t kPositions = kPromptLen + kDecodeSteps;  // 336 rows in the per-position datasets
constexpr int kLayers = 10;
constexpr int64_t kIndexTopk = 32;
constexpr int64_t kWindow = 64;
constexpr int64_t kHeadDim = 128, kIndexHeadDim = 64;
// Packed entry sizes (docs/formats.md): SWA d + d/32, main KV d/2 + d/16, index key d/2 + d/32.
constexpr int64_t kSwaBytes = kHeadDim + kHeadDim / 32;             // 132
constexpr int64_t kCompressedKvBytes = kHeadDim / 2 + kHeadDim / 16;      // 72
constexpr int64_t kIndexKeysBytes = kIndexHeadDim / 2 + kIndexHeadDim / 32;  // 34
int ratio_of(int layer) {  // compress_ratios of the tiny config
  static const int r[] = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1};
  return r[layer];
}

using Result = dsv41::test::CliResult;
using dsv41::test::has;
using dsv41::test::read_bytes;
using dsv41::test::scratch;
Result run(const std::string& args) { return dsv41::test::run_dsv41(args); }

// Files in `dir` other than the test's own stdout / stderr and `keep`.
std::vector<std::string> other_files(const std::string& dir, const std::vector<std::string>& keep = {}) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "stdout" || name == "stderr" || std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    out.push_back(name);
  }
  return out;
}

void write_ids(const std::string& path, const std::vector<int64_t>& ids, const std::string& comment) {
  std::ofstream out(path);
  out << "# " << comment << "\n";
  for (int64_t id : ids) out << id << "\n";
}

// The oracle's prompt, token map and first decode inputs, written as @FILE lists.
struct Inputs {
  std::vector<int64_t> prompt, decode;
  std::string prompt_file, map_file, decode_list;
};

Inputs oracle_inputs() {
  Inputs in;
  const H5File prefill(kOracle + "prefill.h5");
  in.prompt = prefill.read<int64_t>("prefill/tokens/value", 2).data;
  const std::vector<int64_t> map = prefill.read<int64_t>("prefill/state/engram/token_map/value", 1).data;
  const H5File decode(kOracle + "decode.h5");
  for (int k = 0; k < kDecodeSteps; ++k) {
    const int64_t tok = decode.read<int64_t>("decode/step" + std::to_string(k) + "/input_token/value", 2).data.at(0);
    in.decode.push_back(tok);
    in.decode_list += (k ? "," : "") + std::to_string(tok);
  }
  in.prompt_file = scratch() + "/prompt.txt";
  in.map_file = scratch() + "/token_map.txt";
  write_ids(in.prompt_file, in.prompt, "oracle prompt (prefill/tokens/value)");
  write_ids(in.map_file, map, "oracle token map (prefill/state/engram/token_map/value)");
  EXPECT_EQ(static_cast<int64_t>(in.prompt.size()), kPromptLen);
  EXPECT_EQ(static_cast<int64_t>(map.size()), kVocab);
  EXPECT_EQ(in.decode_list, "5,723,380");
  return in;
}

std::string forward_args(const Inputs& in, const std::string& output, const std::string& extra = "") {
  return "forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt @'" + in.prompt_file +
         "' --decode " + in.decode_list + " --token-map '" + in.map_file + "' -o '" + output + "' " + extra;
}


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

std::string layer(int l) {
  char b[16];
  std::snprintf(b, sizeof b, "layer%02d", l);
  return b;
}

template <typename T>
bool same_bytes(const Array<T>& a, const Array<T>& b) {
  return a.shape == b.shape && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(T)) == 0;
}

void expect_logits_usable(const Array<float>& logits) {
  ASSERT_EQ(logits.shape, (std::vector<int64_t>{kDecodeSteps + 1, kVocab}));
  for (int64_t s = 0; s < logits.dim(0); ++s) {
    bool nonzero = false;
    for (int64_t v = 0; v < kVocab; ++v) {
      ASSERT_TRUE(std::isfinite(logits.at(s, v))) << "step " << s << " token " << v;
      nonzero |= logits.at(s, v) != 0.0f;
    }
    EXPECT_TRUE(nonzero) << "step " << s << ": all logits zero";
  }
}

// Each test works in its own directory, removed when the test passes (kept for a look if not).
class ScratchTest : public testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(scratch());
  }
};
class ForwardCli : public ScratchTest {};
class ForwardCliErrors : public ScratchTest {};
class WeightsCli : public ScratchTest {};

// ---- the output layout ----

TEST_F(ForwardCli, WritesTheDocumentedLayout) {
  const Inputs in = oracle_inputs();
  const std::string out = scratch() + "/out.h5";
  const Result r = run(forward_args(in, out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "prefill of 333 tokens, then 3 decode steps")) << r.err;
  EXPECT_EQ(other_files(scratch(), {"prompt.txt", "token_map.txt", "out.h5"}), std::vector<std::string>{})
      << "temp file left";
  const H5File h(out);
  EXPECT_EQ(h.children("/"),
            (std::vector<std::string>{"cache", "candidates", "engram", "experts", "logits", "tokens", "topk"}));

  expect_logits_usable(h.read<float>("logits", 2));

  std::vector<int64_t> tokens = in.prompt;
  tokens.insert(tokens.end(), in.decode.begin(), in.decode.end());
  EXPECT_EQ(h.read<int64_t>("tokens", 1).data, tokens);

  // /topk: the index sources 2, 4, 6, 8. Row p = position p. Each row: compressed positions,
  // strictly ascending, every one < reach = (p + 1) / ratio; then -1 only as trailing padding;
  // min(index_topk, reach) valid entries (the config keeps candidate blocks >= index_topk).
  EXPECT_EQ(h.children("topk"), (std::vector<std::string>{"layer02", "layer04", "layer06", "layer08"}));
  for (int l : {2, 4, 6, 8}) {
    SCOPED_TRACE(layer(l));
    const Array<int32_t> topk = h.read<int32_t>("topk/" + layer(l), 2);
    ASSERT_EQ(topk.shape, (std::vector<int64_t>{kPositions, kIndexTopk}));
    int64_t valid_total = 0;
    for (int64_t p = 0; p < kPositions; ++p) {
      const int64_t reach = (p + 1) / ratio_of(l);
      int64_t valid = 0;
      bool padding = false;
      for (int64_t j = 0; j < kIndexTopk; ++j) {
        const int32_t v = topk.at(p, j);
        if (v == -1) {
          padding = true;
          continue;
        }
        ASSERT_FALSE(padding) << "row " << p << ": a position after -1 padding";
        ASSERT_GE(v, 0) << "row " << p;
        ASSERT_LT(v, reach) << "row " << p << ": unreachable position";
        if (j > 0) {
          ASSERT_GT(v, topk.at(p, j - 1)) << "row " << p << ": not strictly ascending";
        }
        ++valid;
      }
      EXPECT_EQ(valid, std::min(kIndexTopk, reach)) << "row " << p;
      valid_total += valid;
    }
    EXPECT_GT(valid_total, 0);
  }

  // /candidates/layer06 (the candidate source, ratio 1): a 0/1 mask over compressed positions;
  // ones only where reachable, at most candidate_topk_blocks x block_size = 48 of them, and the
  // newest reachable position always kept (its block is pinned).
  EXPECT_EQ(h.children("candidates"), std::vector<std::string>{"layer06"});
  const Array<uint8_t> cand = h.read<uint8_t>("candidates/layer06", 2);
  ASSERT_EQ(cand.shape, (std::vector<int64_t>{kPositions, kPositions}));
  for (int64_t p = 0; p < kPositions; ++p) {
    int64_t ones = 0;
    for (int64_t n = 0; n < kPositions; ++n) {
      const uint8_t v = cand.at(p, n);
      ASSERT_LE(v, 1) << "row " << p;
      if (v) {
        ASSERT_LE(n, p) << "row " << p << ": candidate beyond reach";
        ++ones;
      }
    }
    EXPECT_LE(ones, 48) << "row " << p;
    EXPECT_EQ(cand.at(p, p), 1) << "row " << p << ": newest position not kept";
  }

  // /engram: the hash ids of the Engram layers 1 and 4, [positions, (max_ngram - 1) x heads];
  // an integer computation, so the prefill rows equal the oracle's.
  EXPECT_EQ(h.children("engram"), (std::vector<std::string>{"layer01", "layer04"}));
  const H5File prefill(kOracle + "prefill.h5");
  for (int l : {1, 4}) {
    const Array<int64_t> ids = h.read<int64_t>("engram/" + layer(l), 2);
    ASSERT_EQ(ids.shape, (std::vector<int64_t>{kPositions, 12}));
    const Array<int64_t> oracle = prefill.read<int64_t>("prefill/" + layer(l) + "/engram_hash_ids/value", 3);
    ASSERT_EQ(oracle.size(), static_cast<size_t>(kPromptLen * 12));
    EXPECT_TRUE(std::equal(oracle.data.begin(), oracle.data.end(), ids.data.begin())) << layer(l);
    EXPECT_TRUE(std::all_of(ids.data.begin(), ids.data.end(), [](int64_t v) { return v >= 0; })) << layer(l);
  }

  // /experts: every layer, [positions, n_activated_experts] distinct routed experts in [0, 6).
  std::vector<std::string> all_layers;
  for (int l = 0; l < kLayers; ++l) all_layers.push_back(layer(l));
  EXPECT_EQ(h.children("experts"), all_layers);
  for (int l = 0; l < kLayers; ++l) {
    const Array<int32_t> e = h.read<int32_t>("experts/" + layer(l), 2);
    ASSERT_EQ(e.shape, (std::vector<int64_t>{kPositions, 3})) << layer(l);
    for (int64_t p = 0; p < kPositions; ++p) {
      std::vector<int32_t> row = {e.at(p, 0), e.at(p, 1), e.at(p, 2)};
      std::sort(row.begin(), row.end());
      ASSERT_GE(row[0], 0) << layer(l) << " row " << p;
      ASSERT_LT(row[2], 6) << layer(l) << " row " << p;
      ASSERT_TRUE(row[0] < row[1] && row[1] < row[2]) << layer(l) << " row " << p << ": repeated expert";
    }
  }

  // /cache: the state after the last step. Every layer has its SWA ring (slot = position % 64,
  // holding the last 64 positions); kv sources 2, 4 (ratio 2) and 6 (ratio 1) their compressed
  // and index-key caches (336 / ratio entries), ratio-2 sources their compressor partial group.
  EXPECT_EQ(h.children("cache"), all_layers);
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE(layer(l));
    const std::string g = "cache/" + layer(l) + "/";
    EXPECT_EQ(h.read<uint8_t>(g + "window_kv_packed", 2).shape, (std::vector<int64_t>{kWindow, kSwaBytes}));
    const Array<int64_t> pos = h.read<int64_t>(g + "window_kv_positions", 1);
    ASSERT_EQ(pos.shape, std::vector<int64_t>{kWindow});
    for (int64_t s = 0; s < kWindow; ++s) {
      const int64_t want = kPositions - kWindow + ((s - (kPositions - kWindow)) % kWindow + kWindow) % kWindow;
      EXPECT_EQ(pos.data[static_cast<size_t>(s)], want) << "slot " << s;
    }
    const bool kv_source = l == 2 || l == 4 || l == 6;
    std::vector<std::string> want_children = {"window_kv_packed", "window_kv_positions"};
    if (kv_source) {
      const int64_t n = kPositions / ratio_of(l);
      EXPECT_EQ(h.read<uint8_t>(g + "compressed_kv_packed", 2).shape, (std::vector<int64_t>{n, kCompressedKvBytes}));
      EXPECT_EQ(h.read<uint16_t>(g + "compressed_kv_bf16", 2).shape, (std::vector<int64_t>{n, kHeadDim}));
      EXPECT_EQ(h.read<uint8_t>(g + "index_keys_packed", 2).shape, (std::vector<int64_t>{n, kIndexKeysBytes}));
      EXPECT_EQ(h.read<uint16_t>(g + "index_keys_bf16", 2).shape, (std::vector<int64_t>{n, kIndexHeadDim}));
      want_children.insert(want_children.end(), {"compressed_kv_bf16", "compressed_kv_packed", "index_keys_bf16",
                                                 "index_keys_packed"});
      const Array<uint16_t> kv = h.read<uint16_t>(g + "compressed_kv_bf16", 2);
      EXPECT_TRUE(std::any_of(kv.data.begin(), kv.data.end(), [](uint16_t b) { return (b & 0x7fff) != 0; }));
      if (ratio_of(l) == 2) {
        EXPECT_EQ(h.read<float>(g + "compressor_kv_state", 2).shape, (std::vector<int64_t>{2, kHeadDim}));
        EXPECT_EQ(h.read<float>(g + "compressor_score_state", 2).shape, (std::vector<int64_t>{2, kHeadDim}));
        want_children.insert(want_children.end(), {"compressor_kv_state", "compressor_score_state"});
      }
    }
    std::sort(want_children.begin(), want_children.end());
    EXPECT_EQ(h.children("cache/" + layer(l)), want_children);
  }

  // Root attributes.
  EXPECT_EQ(string_attr(out, "tool").rfind("dsv41 ", 0), 0u) << string_attr(out, "tool");
  EXPECT_FALSE(string_attr(out, "git_commit").empty());
  EXPECT_NE(string_attr(out, "git_commit"), "(missing)");
  const std::string hash = string_attr(out, "config_hash");
  EXPECT_EQ(hash.size(), 16u) << hash;
  const Result bytes = run("bytes --config '" + kConfig + "' --json");
  ASSERT_EQ(bytes.code, 0) << bytes.err;
  EXPECT_TRUE(has(bytes.out, "\"config_hash\": \"" + hash + "\"") || has(bytes.out, "\"config_hash\":\"" + hash + "\""))
      << "config_hash " << hash << " differs from `dsv41 bytes`: " << bytes.out;
  const std::string cmd = string_attr(out, "command_line");
  EXPECT_EQ(cmd.rfind("dsv41 forward ", 0), 0u) << cmd;
  EXPECT_TRUE(has(cmd, "--decode 5,723,380")) << cmd;
  EXPECT_TRUE(has(cmd, "--weights " + kWeights)) << cmd;
  EXPECT_TRUE(has(string_attr(out, "config_json"), "\"vocab_size\":1024")) << string_attr(out, "config_json");
  EXPECT_EQ(string_attr(out, "weights"), kWeights);
  EXPECT_EQ(int_attr(out, "prompt_len"), kPromptLen);
  EXPECT_EQ(int_attr(out, "n_decode"), kDecodeSteps);
}

// ---- determinism ----

TEST_F(ForwardCli, SameRunTwiceGivesIdenticalLogits) {
  const Inputs in = oracle_inputs();
  const std::string a = scratch() + "/a.h5", b = scratch() + "/b.h5";
  const Result ra = run(forward_args(in, a, "--threads 2"));
  ASSERT_EQ(ra.code, 0) << ra.err;
  const Result rb = run(forward_args(in, b, "--threads 2"));
  ASSERT_EQ(rb.code, 0) << rb.err;
  const Array<float> la = H5File(a).read<float>("logits", 2), lb = H5File(b).read<float>("logits", 2);
  expect_logits_usable(la);
  EXPECT_TRUE(same_bytes(la, lb)) << "two identical runs gave different logits";
}

TEST_F(ForwardCli, ThreadCountDoesNotChangeResults) {
  const Inputs in = oracle_inputs();
  const std::string one = scratch() + "/t1.h5", two = scratch() + "/t2.h5";
  const Result r1 = run(forward_args(in, one, "--threads 1"));
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_TRUE(has(r1.err, "(1 threads)")) << r1.err;
  const Result r2 = run(forward_args(in, two, "--threads 2"));
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_TRUE(has(r2.err, "(2 threads)")) << r2.err;
  const H5File h1(one), h2(two);
  const Array<float> l1 = h1.read<float>("logits", 2);
  expect_logits_usable(l1);
  EXPECT_TRUE(same_bytes(l1, h2.read<float>("logits", 2))) << "logits";
  for (const std::string& l : h1.children("topk")) {
    EXPECT_TRUE(same_bytes(h1.read<int32_t>("topk/" + l), h2.read<int32_t>("topk/" + l))) << "topk " << l;
  }
  for (const std::string& l : h1.children("experts")) {
    EXPECT_TRUE(same_bytes(h1.read<int32_t>("experts/" + l), h2.read<int32_t>("experts/" + l))) << "experts " << l;
  }
  EXPECT_TRUE(same_bytes(h1.read<uint8_t>("candidates/layer06"), h2.read<uint8_t>("candidates/layer06")));
  for (const std::string& l : h1.children("cache")) {
    EXPECT_TRUE(same_bytes(h1.read<uint8_t>("cache/" + l + "/window_kv_packed"), h2.read<uint8_t>("cache/" + l + "/window_kv_packed")))
        << "swa " << l;
  }
}

// ---- bad input: exit 2, a message naming the problem, no output ----

// Runs a forward that must fail; checks exit 2, that stderr holds `message`, and that neither the
// output nor a temp file was left in the scratch directory.
void expect_failure(const std::string& args, const std::string& message) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("dsv41: error: ", 0), 0u) << r.err;
  EXPECT_TRUE(has(r.err, message)) << "want '" << message << "' in: " << r.err;
  EXPECT_EQ(other_files(scratch(), {"prompt.txt", "token_map.txt", "ids.txt", "config.json"}),
            std::vector<std::string>{})
      << "output or temp file left behind";
}

TEST_F(ForwardCliErrors, BadIdList) {
  const Inputs in = oracle_inputs();
  Inputs bad = in;
  bad.decode_list = "5,x";
  expect_failure(forward_args(bad, scratch() + "/out.h5"), "--decode item 2: 'x' is not a non-negative integer id");
  bad.decode_list = "5,723,";
  expect_failure(forward_args(bad, scratch() + "/out.h5"), "--decode item 3: empty id");
  bad.decode_list = "5,-3";
  expect_failure(forward_args(bad, scratch() + "/out.h5"), "--decode item 2: '-3' is not a non-negative integer id");
}

TEST_F(ForwardCliErrors, BadIdInAFileNamesTheLine) {
  const std::string ids = scratch() + "/ids.txt";
  std::ofstream(ids) << "# a prompt\n1\n2\n\nthree\n";
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt @'" + ids + "' -o '" +
                     scratch() + "/out.h5'",
                 "--prompt " + ids + ":5: 'three' is not a non-negative integer id");
}

TEST_F(ForwardCliErrors, TokenOutsideTheVocab) {
  const Inputs in = oracle_inputs();
  Inputs bad = in;
  bad.decode_list = "5,1024";
  expect_failure(forward_args(bad, scratch() + "/out.h5"),
                 "--decode: id 2 of 2 is 1024, outside the vocab [0, 1024) of config '" + kConfig + "'");
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2,5000 -o '" +
                     scratch() + "/out.h5'",
                 "--prompt: id 3 of 3 is 5000, outside the vocab [0, 1024)");
}

TEST_F(ForwardCliErrors, MissingWeightsFile) {
  const Inputs in = oracle_inputs();
  const std::string missing = scratch() + "/absent.safetensors";
  std::string args = forward_args(in, scratch() + "/out.h5");
  args.replace(args.find(kWeights), kWeights.size(), missing);
  expect_failure(args, "weights file '" + missing + "': cannot open (No such file or directory)");
}

TEST_F(ForwardCliErrors, WeightsNotMatchingTheConfig) {
  // The released config with the tiny weights: the first tensor already has another shape.
  expect_failure("forward --config full --weights '" + kWeights + "' --prompt 1,2,3 -o '" + scratch() + "/out.h5'",
                 "weights file '" + kWeights + "': tensor 'embed.weight' has shape [1024, 256], expected [129280, ");
}

TEST_F(ForwardCliErrors, UnwritableOutput) {
  const std::string dir = scratch() + "/no_such_dir";
  const std::string out = dir + "/out.h5";
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2,3 -o '" + out + "'",
                 "cannot write forward output (-o) '" + out + "': directory '" + dir + "' does not exist");
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(ForwardCliErrors, OutputIsADirectory) {
  // Refused before any work (base/output_file.h checks every output up front): the directory
  // and what it holds stay, and no temp file is left beside it.
  const std::string out = scratch() + "/out_dir";
  fs::create_directories(out + "/inside");
  const Result r = run("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2,3 -o '" + out + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'" + out + "'")) << r.err;
  EXPECT_TRUE(fs::is_directory(out + "/inside"));
  EXPECT_EQ(other_files(scratch(), {"out_dir"}), std::vector<std::string>{}) << "temp file left behind";
}

TEST_F(ForwardCliErrors, PromptLongerThanMaxSeqLen) {
  const std::string ids = scratch() + "/ids.txt";
  write_ids(ids, std::vector<int64_t>(513, 7), "513 tokens: one more than max_seq_len 512");
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt @'" + ids + "' -o '" +
                     scratch() + "/out.h5'",
                 "513 prompt tokens + 0 decode steps = 513 positions, more than max_seq_len 512");
  // Prompt and decode steps together.
  write_ids(ids, std::vector<int64_t>(510, 7), "510 tokens");
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt @'" + ids +
                     "' --decode 1,2,3 -o '" + scratch() + "/out.h5'",
                 "510 prompt tokens + 3 decode steps = 513 positions, more than max_seq_len 512");
}

TEST_F(ForwardCliErrors, EmptyPrompt) {
  const std::string ids = scratch() + "/ids.txt";
  std::ofstream(ids) << "# nothing\n\n";
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt @'" + ids + "' -o '" +
                     scratch() + "/out.h5'",
                 "--prompt: at least one token is needed");
}

TEST_F(ForwardCliErrors, TokenMapOfAnotherLength) {
  const std::string ids = scratch() + "/ids.txt";
  write_ids(ids, {0, 0, 1, 1}, "4 entries for a vocab of 1024");
  expect_failure("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2 --token-map '" + ids +
                     "' -o '" + scratch() + "/out.h5'",
                 "--token-map '" + ids + "': 4 ids, but config '" + kConfig + "' has a vocab of 1024");
}

TEST_F(ForwardCliErrors, MissingRequiredOption) {
  const Result r = run("forward --config '" + kConfig + "' --prompt 1,2 -o '" + scratch() + "/out.h5'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--weights")) << r.err;
}

// ---- dsv41 weights ----

TEST_F(WeightsCli, GenerateThenCheck) {
  const std::string w = scratch() + "/w7.safetensors", again = scratch() + "/w7b.safetensors";
  const Result gen = run("weights --config tiny --seed 7 -o '" + w + "'");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_TRUE(has(gen.out, "wrote '" + w + "' (740 tensors, seed 7)")) << gen.out;
  const Result check = run("weights --config tiny --check '" + w + "'");
  EXPECT_EQ(check.code, 0) << check.err;
  EXPECT_TRUE(has(check.out, "holds every tensor of the config (740 tensors)")) << check.out;
  // The generator is deterministic: the same seed writes the same bytes.
  ASSERT_EQ(run("weights --config tiny --seed 7 -o '" + again + "'").code, 0);
  const std::string a = read_bytes(w), b = read_bytes(again);
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b) << "same seed, different files";
  EXPECT_TRUE(has(a.substr(0, 4096), "\"seed\":\"7\"")) << "seed not in the metadata";
  EXPECT_EQ(other_files(scratch(), {"w7.safetensors", "w7b.safetensors"}), std::vector<std::string>{});
}

TEST_F(WeightsCli, CheckTruncatedCopyFails) {
  const std::string w = scratch() + "/w.safetensors", cut = scratch() + "/cut.safetensors";
  ASSERT_EQ(run("weights --config tiny --seed 3 -o '" + w + "'").code, 0);
  const std::string bytes = read_bytes(w);
  ASSERT_GT(bytes.size(), 1000u);
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 1000);
  const Result r = run("weights --config tiny --check '" + cut + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.err, "dsv41: error: weights file '" + cut + "'")) << r.err;
  EXPECT_TRUE(has(r.err, "truncated file?")) << r.err;
}

TEST_F(WeightsCli, CheckAgainstAnotherConfigFails) {
  const Result r = run("weights --config full --check '" + kWeights + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.err, "tensor 'embed.weight' has shape [1024, 256]")) << r.err;
}

TEST_F(WeightsCli, NeedsOutputOrCheck) {
  const Result r = run("weights --config tiny");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "give -o FILE")) << r.err;
}

}  // namespace
