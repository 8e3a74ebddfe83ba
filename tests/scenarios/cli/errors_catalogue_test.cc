// The catalogue of bad inputs (docs/errors.md), table-driven: `dsv41` on each bad input gives
// the catalogued exit code and message, and no message names a source file (".cc:",
// "/reference/", "check `"): the check's location is printed only with --debug.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/run_cli.h"

namespace dsv41::test {
namespace {

const std::string kOracle = DSV41_ORACLE_DIR;
const std::string kConfig = kOracle + "/config.json";
const std::string kWeights = kOracle + "/weights.safetensors";

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

// The tiny config with one field replaced.
std::string config_with(const std::string& field, const nlohmann::json& value) {
  nlohmann::json c = nlohmann::json::parse(read_bytes(kConfig));
  c[field] = value;
  return write_file("config_" + field + ".json", c.dump());
}

// A safetensors file with this header and no data.
std::string safetensors_with(const std::string& name, const std::string& header) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return write_file(name, bytes + header);
}

// The oracle weights with every value of norm.weight (BF16) set to NaN.
std::string nan_weights() {
  std::string b = read_bytes(kWeights);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  const nlohmann::json h = nlohmann::json::parse(b.substr(8, n));
  const uint64_t begin = h["norm.weight"]["data_offsets"][0], end = h["norm.weight"]["data_offsets"][1];
  for (uint64_t at = 8 + n + begin; at < 8 + n + end; at += 2) {
    b[at] = static_cast<char>(0xc0);
    b[at + 1] = static_cast<char>(0x7f);
  }
  return write_file("nan.safetensors", b);
}

std::string scenario(const std::string& name, const std::string& events_json, const std::string& extra = "") {
  return write_file(name + ".json", R"({"name": ")" + name + R"(", "events": )" + events_json + extra + "}");
}

struct Entry {
  std::string what;  // the input class and the bad input (docs/errors.md)
  std::string args;  // dsv41's arguments
  int code;
  std::string message;  // a part of stdout + stderr
};

void expect_entry(const Entry& e) {
  SCOPED_TRACE(e.what + ": dsv41 " + e.args);
  const CliResult r = run_dsv41(e.args);
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.code, e.code) << all;
  EXPECT_TRUE(has(all, e.message)) << "want '" << e.message << "' in:\n" << all;
  for (const char* leak : {".cc:", "/reference/", "/scenarios/", "check `"}) {
    EXPECT_FALSE(has(r.err, leak)) << "a source location leaks: " << r.err;
  }
}

TEST(ErrorsCatalogue, Config) {
  const std::string out = " -o '" + scratch() + "/x.h5'";
  for (const Entry& e : std::vector<Entry>{
           {"config: 100k-deep JSON at a known key", "bytes --config '" +
                write_file("deep.json", R"({"dim": )" + nested(100000) + "}") + "'",
            2, "JSON nested deeper than 64 levels"},
           {"config: head_dim 2^30 (bytes overflowed)", "bytes --config '" + config_with("head_dim", 1 << 30) + "'", 2,
            "field 'head_dim': must be at most 1048576, got 1073741824"},
           {"config: vocab_size 2^31-1, refused before any allocation",
            "forward --config '" + config_with("vocab_size", 2147483647) + "' --weights '" + kWeights + "' --prompt 1" + out,
            2, "field 'vocab_size': must be at most 1048576"},
       }) {
    expect_entry(e);
  }
}

TEST(ErrorsCatalogue, Weights) {
  for (const Entry& e : std::vector<Entry>{
           {"weights: 100k-deep JSON at 'shape' (crashed weights --check)",
            "weights --config '" + kConfig + "' --check '" +
                safetensors_with("deep.safetensors", R"({"a": {"dtype": "F32", "data_offsets": [0, 0], "shape": )" +
                                                         nested(100000) + "}}") + "'",
            2, "JSON nested deeper than 64 levels"},
           {"weights: a shape whose product overflows behind a zero extent",
            "weights --config '" + kConfig + "' --check '" +
                safetensors_with("big.safetensors",
                                 R"({"a": {"dtype": "F32", "data_offsets": [0, 0], "shape": [0, 4294967296, 4294967296]}})") +
                "'",
            2, "holds more than 2^62 elements"},
           {"weights: NaN values give all-NaN logits (was exit 0)",
            "forward --config '" + kConfig + "' --weights '" + nan_weights() + "' --prompt 1,2,3 -o '" + scratch() + "/n.h5'",
            2, "non-finite logits"},
       }) {
    expect_entry(e);
  }
}

TEST(ErrorsCatalogue, Scenario) {
  const std::string out = " -q -o '" + scratch() + "/r.h5'";
  for (const Entry& e : std::vector<Entry>{
           {"scenario: 100k-deep JSON at 'notes'",
            "run '" + scenario("deep", R"([{"prompt": [1, 2]}])", R"(, "notes": )" + nested(100000)) + "'" + out, 2,
            "JSON nested deeper than 64 levels"},
           {"scenario: decode 10^9 steps", "run '" + scenario("decode", R"([{"prompt": [1, 2]}, {"decode": 1000000000}])") + "'" + out, 2,
            ".decode: must be at most 1048576, got 1000000000"},
           {"scenario: random 10^12 tokens", "run '" + scenario("random", R"([{"prompt": [{"random": 1000000000000}]}])") + "'" + out, 2,
            ".random: must be at most 1048576"},
           {"scenario: a session past max_seq_len, refused before any step",
            "run '" + scenario("long", R"([{"prompt": [1, 2]}, {"decode": 600}])") + "' --sides ref,ref" + out, 2,
            "past max_seq_len = 512"},
           {"scenario: an unknown reordered variant, refused before any step",
            "run '" + scenario("variant", R"([{"prompt": [1, 2]}])") + "' --sides ref,ref-order:random" + out, 2,
            "unknown reordered variant 'random' (known: reversed, pairwise, blocked, fma, splitk, tiles"},
           {"scenario: a variant's planted defect at a layer the model lacks, refused before any step",
            "run '" + scenario("variant_layer", R"([{"prompt": [1, 2]}])") + "' --sides ref,ref-order:splitk:attn_out:L99:S1" +
                out, 2, "side 'ref-order:splitk:attn_out:L99:S1@cold': layer 99 is not a layer of this model"},
       }) {
    expect_entry(e);
  }
}

TEST(ErrorsCatalogue, CliArguments) {
  const std::string s = scenario("ok", R"([{"prompt": [1, 2, 3]}])");
  const std::string out = " -q -o '" + scratch() + "/r.h5'";
  // A report to filter: the scenario above on one pair.
  const std::string report = scratch() + "/ok.h5";
  ASSERT_EQ(run_dsv41("run '" + s + "' --sides ref@cold,ref@full --mode free-running -q -o '" + report + "'").code, 0);
  for (const Entry& e : std::vector<Entry>{
           {"CLI: a mistyped verb", "frobnicate", 2, "unknown verb 'frobnicate'; verbs: bytes, selfcheck, forward"},
           {"CLI: a mistyped sub-verb", "report chek x.h5", 2,
            "unknown verb 'chek' of 'report'; verbs: show, check, junit, html, diff"},
           {"CLI: report show --scenario the report lacks", "report show '" + report + "' --scenario nope", 2,
            "report show: no scenario 'nope' in the report (it has: ok)"},
           {"CLI: report show --pair the report lacks", "report show '" + report + "' --pair cuda,ref", 2,
            "report show: no comparison of the sides 'cuda,ref' in the report (its sides: ref@cold, ref@full)"},
           {"CLI: report show --verdict not a verdict", "report show '" + report + "' --verdict passed", 2,
            "report show --verdict: 'passed' is not a verdict (error, fail, inconclusive, measured, pass)"},
           {"CLI: a negative seed", "run '" + s + "' --seed -1" + out, 2, "a seed is a decimal integer from 0 to 2^64-1, got '-1'"},
           {"CLI: a negative weight seed", "weights --config tiny --seed -1 -o '" + scratch() + "/w.safetensors'", 2,
            "a seed is a decimal integer"},
           {"CLI: an unknown --save-tensors component", "run '" + s + "' --save-tensors component=bogus" + out, 2,
            "--save-tensors 'component=bogus': unknown component 'bogus' (one of: "},
           {"CLI: --decoder-replay below window_size", "forward --config '" + kConfig + "' --weights '" + kWeights +
                "' --prompt 1,2 --decoder-replay 1 -o '" + scratch() + "/f.h5'",
            2, "--decoder-replay 1: decoder replay needs at least window_size = 64 rows"},
           {"CLI: an unknown forward --backend", "forward --config '" + kConfig + "' --weights '" + kWeights +
                "' --prompt 1,2 --backend nope -o '" + scratch() + "/f.h5'",
            2, "--backend 'nope': unknown backend; valid: ref, mutant:<component>:L<layer>:S<step>, ref-order:<variant>"},
           {"CLI: forward --backend ref-bf16kv", "forward --config '" + kConfig + "' --weights '" + kWeights +
                "' --prompt 1,2 --backend ref-bf16kv -o '" + scratch() + "/f.h5'",
            2, "--backend 'ref-bf16kv': the bf16-cache ablation is no single packed model"},
           {"CLI: a negative --replay", "run '" + s + "' --replay -1" + out, 2,
            "--replay: Value -1 not in range 0 to 1048576"},
           {"CLI: --replay in free-running mode",
            "run '" + s + "' --sides ref,ref@full --replay 2 --mode free-running" + out, 2,
            "sampled replay starts side B from side A's state at each sampled step and forces A's values: it "
            "compares teacher-forced steps only (--mode teacher-forced)"},
           {"CLI: layer-config without --kind", "layer-config", 2, "layer-config: give --kind KIND (--list shows the kinds)"},
           {"CLI: layer-config, an unknown kind", "layer-config --kind bogus", 2,
            "layer kind 'bogus': unknown (the kinds: swa, full2, full1, reuse2, reuse1, reindex, engram, dspark)"},
       }) {
    expect_entry(e);
  }
}

TEST(ErrorsCatalogue, TokenListsAndFiles) {
  const std::string f = " -o '" + scratch() + "/f.h5'";
  const std::string fwd = "forward --config '" + kConfig + "' --weights '" + kWeights + "'";
  for (const Entry& e : std::vector<Entry>{
           {"token list: a non-integer id", fwd + " --prompt 1,x" + f, 2, "'x' is not a non-negative integer id"},
           {"token list: an unreadable @FILE", fwd + " --prompt @/no/such/ids.txt" + f, 2, "--prompt file '/no/such/ids.txt': cannot open"},
           {"session file: missing", fwd + " --prompt 1 --resume /no/such.dsv41s" + f, 2,
            "session file '/no/such.dsv41s': cannot open"},
           {"port dump: neither a directory nor HDF5", "conform '" + write_file("dump.txt", "x") + "' --config '" +
                kConfig + "' --weights '" + kWeights + "' -o '" + scratch() + "/c.h5'",
            2, "not a directory, and not a readable HDF5 dump"},
       }) {
    expect_entry(e);
  }
}

// The first `n` bytes of `path`, or the file with the byte at its middle flipped, as a new file.
std::string truncated(const std::string& path, size_t n, const std::string& name) {
  return write_file(name, read_bytes(path).substr(0, n));
}
std::string flipped(const std::string& path, const std::string& name) {
  std::string b = read_bytes(path);
  b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0xff);
  return write_file(name, b);
}

// A weights file with the header rewritten by `edit` (the data kept).
template <typename Edit>
std::string weights_with(const std::string& name, Edit edit) {
  const std::string b = read_bytes(kWeights);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  nlohmann::json h = nlohmann::json::parse(b.substr(8, n));
  edit(h);
  const std::string header = h.dump();
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return write_file(name, len + header + b.substr(8 + n));
}

TEST(ErrorsCatalogue, WeightsFiles) {
  const std::string check = "weights --config '" + kConfig + "' --check '";
  for (const Entry& e : std::vector<Entry>{
           {"weights: not a safetensors file", check + write_file("notes.txt", "hello\n") + "'", 2,
            "is 6 bytes: too short for a safetensors header"},
           {"weights: truncated", check + truncated(kWeights, 5000, "trunc.safetensors") + "'", 2,
            "does not fit the file (5000 bytes); not a safetensors file or truncated"},
           {"weights: a tensor missing",
            check + weights_with("missing.safetensors", [](nlohmann::json& h) { h.erase("embed.weight"); }) + "'", 2,
            "missing tensor 'embed.weight'"},
           {"weights: a dtype dsv41 does not read",
            check + weights_with("dtype.safetensors", [](nlohmann::json& h) { h["embed.weight"]["dtype"] = "I8"; }) + "'",
            2, "tensor 'embed.weight': unsupported safetensors dtype 'I8'"},
       }) {
    expect_entry(e);
  }
}

TEST(ErrorsCatalogue, SessionFiles) {
  const std::string fwd = "forward --config '" + kConfig + "' --weights '" + kWeights + "'";
  const std::string saved = scratch() + "/s.dsv41s";
  ASSERT_EQ(run_dsv41(fwd + " --prompt 1,2,3,4 --save-state '" + saved + "' -o '" + scratch() + "/s.h5'").code, 0);
  const std::string resume = fwd + " --prompt 5 -o '" + scratch() + "/r.h5' --resume '";
  for (const Entry& e : std::vector<Entry>{
           {"session file: truncated", resume + truncated(saved, 100, "t.dsv41s") + "'", 2,
            "truncated: 100 bytes, the header says the file has"},
           {"session file: one byte flipped", resume + flipped(saved, "f.dsv41s") + "'", 2, "checksum mismatch (stored 0x"},
           {"session file: not a session file", resume + write_file("notes.dsv41s", "hello\n") + "'", 2,
            "truncated: 6 bytes, the header alone has 48"},
       }) {
    expect_entry(e);
  }
}

// HDF5 files: reports (report show / check) and port dumps (conform). A crafted file on which
// libhdf5 itself crashes or hangs is read first in another process (h5/h5_probe.h) and
// refused: before, `report check` died with SIGSEGV or never ended.
TEST(ErrorsCatalogue, ReportsAndHdf5Dumps) {
  const std::string run = scenario("one", R"([{"prompt": [1, 2, 3]}])");
  const std::string report = scratch() + "/r.h5", forward = scratch() + "/f.h5";
  ASSERT_EQ(run_dsv41("run '" + run + "' --sides ref,ref -q -o '" + report + "'").code, 0);
  ASSERT_EQ(run_dsv41("forward --config '" + kConfig + "' --weights '" + kWeights + "' --prompt 1,2 -o '" + forward + "'").code, 0);
  const std::string findings = std::string(DSV41_SOURCE_DIR) + "/fuzz/findings/";
  const std::string conform = "' --config '" + kConfig + "' --weights '" + kWeights + "' -o '" + scratch() + "/c.h5'";
  for (const Entry& e : std::vector<Entry>{
           {"report: not HDF5", "report show '" + write_file("notes.txt", "hello\n") + "'", 2, "': not an HDF5 file"},
           {"report: truncated", "report show '" + truncated(report, 4096, "trunc.h5") + "'", 2,
            "cannot open the HDF5 file (truncated or corrupt)"},
           {"report: an HDF5 file that is not a report", "report show '" + forward + "'", 2,
            "not a dsv41 divergence report (the root attribute 'schema' is not 'dsv41-divergence-report')"},
           {"report: libhdf5 segfaulted in the global heap", "report check '" + findings + "report_check_h5hg_read_segv.h5'", 2,
            "': refused: "},
           {"report: libhdf5 looped in the global heap", "report check '" + findings + "report_check_h5hg_hang.h5'", 2,
            "': refused: "},
           {"report: libhdf5 allocated 4 GB", "report show '" + findings + "report_check_h5hg_4gb_malloc.h5'", 2,
            "': refused: dataset '/summary': a corrupt variable-length string, element 160: its heap collection lies "
            "outside the file"},
           {"report: a bad global-heap index in a stored string (SIGSEGV before the check)",
            "report check '" + findings + "report_check_heap_index_segv.h5'", 2,
            "': refused: dataset '/summary': a corrupt variable-length string, element 75: its heap object index is "
            "not in its collection"},
           {"report: a heap collection grown past its free space (SIGSEGV in the caller after a clean probe)",
            "report check '" + findings + "report_read_gcol_size_segv.h5'", 2,
            "': refused: dataset '/summary': a corrupt variable-length string, element 0: an object of its heap "
            "collection overruns it"},
           {"port dump: a directory without dump.json", "conform '" + scratch() + conform, 2,
            "dump.json: missing manifest"},
           {"port dump: a crafted HDF5 dump", "conform '" + findings + "report_check_h5hg_hang.h5" + conform, 2,
            "not a readable HDF5 dump: "},
       }) {
    expect_entry(e);
  }
}

// A NaN compared with a NaN is no evidence: inconclusive (exit 3), never a pass.
TEST(ErrorsCatalogue, NanOutputsAreNeverAPass) {
  const CliResult r = run_dsv41("run '" + scenario("nan", R"([{"prompt": [1, 2, 3]}])") + "' --weights '" + nan_weights() +
                                "' --sides ref,ref -q -o '" + scratch() + "/nan.h5'");
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(has(r.out + r.err, "inconclusive")) << r.out << r.err;
}

// --debug adds where the error was detected; without it no source location is printed.
TEST(ErrorsCatalogue, DebugShowsTheOrigin) {
  const std::string args = "bytes --config '" + config_with("head_dim", 1 << 30) + "'";
  const CliResult plain = run_dsv41(args), debug = run_dsv41("--debug " + args);
  EXPECT_EQ(plain.code, 2);
  EXPECT_EQ(debug.code, 2);
  EXPECT_FALSE(has(plain.err, "dsv41: debug: ")) << plain.err;
  EXPECT_TRUE(has(debug.err, "dsv41: debug: ")) << debug.err;
}

}  // namespace
}  // namespace dsv41::test
