// The conformance vectors (scenarios/vectors/vectors.h, docs/port-dump.md "Conformance vectors"):
// `dsv41 vectors` writes the tiny set; the reference port (run_port_on_vectors on reference_ops,
// the documented example of a port) passes `dsv41 conform --vectors` with exit 0, report show and
// JUnit; one value off fails exactly that case, naming it; a missing output is not covered (exit 3);
// corrupt vector and port files exit 2 naming the file and key; every case's outputs are finite and
// not all zero; the adversarial properties the cases claim hold in the written inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "reference/seam/ops.h"
#include "reference/checkpoint/safetensors.h"
#include "scenarios/vectors/vectors.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::test::has;
using dsv41::test::run_dsv41;
using dsv41::test::scratch;

// One tiny set and its reference port outputs, shared by the tests (each test copies what it edits).
struct Fixture {
  std::string vec, port;
};
const Fixture& tiny() {
  static const Fixture f = [] {
    Fixture x;
    x.vec = testing::TempDir() + "/dsv41_vectors_" + std::to_string(::getpid()) + "/vec";
    x.port = testing::TempDir() + "/dsv41_vectors_" + std::to_string(::getpid()) + "/port";
    fs::remove_all(fs::path(x.vec).parent_path());
    dsv41::scenarios::vectors::write_vector_set(x.vec, {"tiny"}, 3, "vectors_test");
    dsv41::scenarios::vectors::run_port_on_vectors(dsv41::reference::seam::reference_ops(), x.vec, x.port);
    return x;
  }();
  return f;
}

std::string copy_port(const std::string& to) {
  fs::remove_all(to);
  fs::copy(tiny().port, to, fs::copy_options::recursive);
  return to;
}

st::SafetensorsFile read_case(const std::string& dir, const std::string& name) {
  return st::SafetensorsFile::read(dir + "/" + name + ".safetensors");
}

// Rewrites `path` with `edit` applied to its entries (metadata kept).
template <typename Edit>
void rewrite(const std::string& path, Edit edit) {
  const st::SafetensorsFile f = st::SafetensorsFile::read(path);
  std::vector<st::Entry> es;
  for (const std::string& n : f.names()) es.push_back(f.get(n));
  edit(es);
  st::write(path, es, f.metadata());
}

template <typename T>
std::vector<T> values(const st::Entry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return v;
}

std::string conform(const std::string& port, int* code, const std::string& extra = "") {
  const auto r = run_dsv41("conform --vectors '" + tiny().vec + "' --port-out '" + port + "' -o '" + scratch() +
                           "/r.h5' " + extra);
  *code = r.code;
  return r.out + r.err;
}

TEST(Vectors, TheTinySetHoldsEveryKernelOpWithItsToleranceOriginSeedAndVersion) {
  const dsv41::scenarios::vectors::VectorSet set = dsv41::scenarios::vectors::read_vector_set(tiny().vec);
  std::set<std::string> ops;
  for (const auto& c : set.cases) ops.insert(c.op);
  for (const char* op : {"embed", "linear", "linear_fp32", "grouped_linear", "rms_norm", "rope_rows", "qdq",
                         "write_entries", "read_entries", "compress", "index_weights", "index_scores",
                         "candidate_blocks", "mask_scores", "index_topk", "attention_index_rows", "sparse_attn",
                         "hc_mixes", "hc_pre", "hc_post", "moe_gate", "moe_experts", "engram_hash_ids",
                         "engram_lookup", "engram_gate_residual"}) {
    EXPECT_TRUE(ops.count(op)) << op;
  }
  EXPECT_EQ(set.seed, 3u);
  for (const auto& c : set.cases) {
    const st::SafetensorsFile f = read_case(tiny().vec, c.name);
    const auto& md = f.metadata();
    EXPECT_EQ(md.at("format"), dsv41::scenarios::vectors::kVectorsFormat) << c.name;
    EXPECT_EQ(md.at("version"), "1") << c.name;
    EXPECT_EQ(md.at("op"), c.op) << c.name;
    EXPECT_EQ(md.at("size"), "tiny") << c.name;
    EXPECT_EQ(md.at("tolerance"), "0") << c.name;
    EXPECT_TRUE(has(md.at("tolerance_origin"), "stated")) << c.name;
    EXPECT_FALSE(md.at("seed").empty()) << c.name;
    bool in = false, out = false;
    for (const std::string& n : f.names()) (n.rfind("in.", 0) == 0 ? in : out) |= true;
    EXPECT_TRUE(in && out) << c.name;
  }
}

TEST(Vectors, SameSeedSameBytesAnotherSeedOtherInputs) {
  const std::string a = scratch() + "/a", b = scratch() + "/b";
  fs::remove_all(a);
  fs::remove_all(b);
  dsv41::scenarios::vectors::write_vector_set(a, {"tiny"}, 3, "x");
  dsv41::scenarios::vectors::write_vector_set(b, {"tiny"}, 4, "x");
  const std::string f = "/tiny.sparse_attn.safetensors";
  EXPECT_EQ(dsv41::test::read_bytes(a + f), dsv41::test::read_bytes(tiny().vec + f));
  EXPECT_NE(dsv41::test::read_bytes(b + f), dsv41::test::read_bytes(tiny().vec + f));
}

TEST(Vectors, TheReferencePortPassesEveryCaseWithReportAndJunit) {
  const std::string dir = scratch();
  fs::remove_all(dir + "/v");
  const auto w = run_dsv41("vectors -o '" + dir + "/v' --sizes tiny --seed 3 --reference-port '" + dir + "/p'");
  ASSERT_EQ(w.code, 0) << w.out << w.err;
  EXPECT_TRUE(has(w.out, "seed 3")) << w.out;
  const auto r = run_dsv41("conform --vectors '" + dir + "/v' --port-out '" + dir + "/p' -o '" + dir + "/r.h5' --junit '" +
                           dir + "/j.xml'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "0 failed, 0 not covered")) << r.out;
  const auto show = run_dsv41("report show '" + dir + "/r.h5'");
  EXPECT_EQ(show.code, 0) << show.out << show.err;
  EXPECT_TRUE(has(show.out, "tiny.index_topk")) << show.out;
  EXPECT_TRUE(has(dsv41::test::read_bytes(dir + "/j.xml"), "tiny.sparse_attn"));
}

TEST(Vectors, OneValueOffFailsThatCaseNamingIt) {
  struct Edit {
    const char* name;
    const char* key;
  };
  for (const Edit e : {Edit{"tiny.sparse_attn", "out.o"}, Edit{"tiny.index_topk", "out.topk"},
                       Edit{"tiny.write_entries.fp8_e4m3_e8m0_b32", "out.storage"}}) {
    const std::string port = copy_port(scratch() + "/p_" + e.name);
    rewrite(port + "/" + e.name + ".safetensors", [&](std::vector<st::Entry>& es) {
      for (st::Entry& x : es) {
        if (x.name != e.key) continue;
        if (x.dtype == dsv41::reference::DType::kI32) {  // a selected position replaced by an unselected one
          std::vector<int32_t> v = values<int32_t>(x);
          const int64_t k = x.shape[1];
          const auto row = v.begin() + (x.shape[0] - 1) * k;
          int32_t out = 0;
          while (std::find(row, row + k, out) != row + k) ++out;
          row[0] = out;
          std::memcpy(x.bytes.data(), v.data(), x.bytes.size());
        } else {
          x.bytes[x.bytes.size() / 2] ^= 1;  // one low bit
        }
      }
    });
    int code = 0;
    const std::string out = conform(port, &code);
    EXPECT_EQ(code, 1) << out;
    EXPECT_TRUE(has(out, std::string("FAIL ") + e.name + ": " + e.key)) << out;
    EXPECT_TRUE(has(out, "1 failed, 0 not covered")) << out;
  }
}

TEST(Vectors, TopkRowsAreJudgedAsSets) {
  const std::string port = copy_port(scratch() + "/p");
  rewrite(port + "/tiny.index_topk.safetensors", [](std::vector<st::Entry>& es) {
    for (st::Entry& x : es) {
      std::vector<int32_t> v = values<int32_t>(x);
      std::reverse(v.end() - x.shape[1], v.end());  // the last row, descending
      std::memcpy(x.bytes.data(), v.data(), x.bytes.size());
    }
  });
  int code = 0;
  const std::string out = conform(port, &code);
  EXPECT_EQ(code, 0) << out;
}

TEST(Vectors, AMissingOutputIsNotCoveredNeverPassed) {
  const std::string port = copy_port(scratch() + "/p");
  fs::remove(port + "/tiny.embed.safetensors");
  rewrite(port + "/tiny.hc_mixes.safetensors", [](std::vector<st::Entry>& es) {
    es.erase(std::remove_if(es.begin(), es.end(), [](const st::Entry& x) { return x.name == "out.comb"; }), es.end());
  });
  int code = 0;
  std::string out = conform(port, &code);
  EXPECT_EQ(code, 3) << out;
  EXPECT_TRUE(has(out, "NOT COVERED tiny.embed")) << out;
  EXPECT_TRUE(has(out, "NOT COVERED tiny.hc_mixes")) << out;
  EXPECT_TRUE(has(out, "has no 'out.comb'")) << out;
  out = conform(port, &code, "--only rms_norm");  // a subset the port covers
  EXPECT_EQ(code, 0) << out;
}

// A partial port (docs/conform.md "Partial ports"): it wrote only the rms_norm and sparse_attn cases.
TEST(Vectors, APartialPortIsGreenOnWhatItRequiresAndSkipsTheRest) {
  const std::string port = scratch() + "/partial";
  fs::remove_all(port);
  fs::create_directories(port);
  int copied = 0;
  for (const auto& c : dsv41::scenarios::vectors::read_vector_set(tiny().vec).cases) {
    if (c.op != "rms_norm" && c.op != "sparse_attn") continue;
    fs::copy_file(tiny().port + "/" + c.file, port + "/" + c.file);
    ++copied;
  }
  ASSERT_GE(copied, 2);
  int code = 0;
  std::string out = conform(port, &code);  // without --require every case must be covered
  EXPECT_EQ(code, 3) << out;
  const std::string junit = scratch() + "/partial.xml";
  out = conform(port, &code, "--require rms_norm,sparse_attn --junit '" + junit + "'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "PASS tiny.rms_norm")) << out;
  EXPECT_TRUE(has(out, "SKIPPED (not covered, not required) tiny.embed")) << out;
  EXPECT_TRUE(has(out, "0 failed, 0 not covered")) << out;
  const std::string x = dsv41::test::read_bytes(junit);
  EXPECT_TRUE(has(x, "name=\"tiny.rms_norm\"")) << x;
  EXPECT_TRUE(has(x, "<skipped message=\"not covered: the port wrote no")) << x;
  EXPECT_FALSE(has(x, "<failure")) << x;
  // A required op the port did not write: not covered (3); a covered one off: 1; an unknown op: 2.
  out = conform(port, &code, "--require rms_norm,embed");
  EXPECT_EQ(code, 3) << out;
  EXPECT_TRUE(has(out, "NOT COVERED tiny.embed")) << out;
  rewrite(port + "/tiny.rms_norm.safetensors", [](std::vector<st::Entry>& es) {
    for (st::Entry& e : es) e.bytes[e.bytes.size() / 2] ^= 1;
  });
  out = conform(port, &code, "--require rms_norm,sparse_attn");
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(has(out, "FAIL tiny.rms_norm")) << out;
  out = conform(port, &code, "--require no_such_op");
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "--require: no case of op 'no_such_op'")) << out;
}

TEST(Vectors, CorruptFilesExitTwoNamingFileAndKey) {
  int code = 0;
  {  // a port output of another dtype
    const std::string port = copy_port(scratch() + "/dtype");
    rewrite(port + "/tiny.rms_norm.safetensors", [](std::vector<st::Entry>& es) {
      for (st::Entry& x : es) {
        if (x.name == "out.y") x.dtype = dsv41::reference::DType::kI32;
      }
    });
    const std::string out = conform(port, &code);
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(has(out, "tiny.rms_norm.safetensors") && has(out, "'out.y'")) << out;
  }
  {  // a key the case does not have
    const std::string port = copy_port(scratch() + "/extra");
    rewrite(port + "/tiny.rms_norm.safetensors", [](std::vector<st::Entry>& es) {
      const st::Entry y = *std::find_if(es.begin(), es.end(), [](const st::Entry& x) { return x.name == "out.y"; });
      es.push_back(y);
      es.back().name = "out.z";
    });
    const std::string out = conform(port, &code);
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(has(out, "'out.z'")) << out;
  }
  {  // a truncated port file
    const std::string port = copy_port(scratch() + "/trunc");
    const std::string p = port + "/tiny.rms_norm.safetensors";
    fs::resize_file(p, fs::file_size(p) - 7);
    const std::string out = conform(port, &code);
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(has(out, "tiny.rms_norm.safetensors")) << out;
  }
  {  // a vector set without its manifest
    const auto r = run_dsv41("conform --vectors '" + scratch() + "' --port-out '" + tiny().port + "'");
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(has(r.err, "vectors.json")) << r.err;
  }
  {  // a case file without a parameter: the port's reader names it
    const std::string dir = scratch() + "/case";
    fs::create_directories(dir);
    const st::SafetensorsFile f = read_case(tiny().vec, "tiny.index_topk");
    std::map<std::string, std::string> md = f.metadata();
    md.erase("param.k");
    std::vector<st::Entry> es;
    for (const std::string& n : f.names()) es.push_back(f.get(n));
    st::write(dir + "/c.safetensors", es, md);
    try {
      dsv41::scenarios::vectors::run_vector_case(dsv41::reference::seam::reference_ops(), st::SafetensorsFile::read(dir + "/c.safetensors"));
      ADD_FAILURE() << "no error";
    } catch (const dsv41::Error& e) {
      EXPECT_TRUE(has(e.what(), "c.safetensors") && has(e.what(), "param.k")) << e.what();
    }
  }
}

TEST(Vectors, EveryOutputIsFiniteAndNotAllZero) {
  for (const auto& c : dsv41::scenarios::vectors::read_vector_set(tiny().vec).cases) {
    const st::SafetensorsFile f = read_case(tiny().vec, c.name);
    bool nonzero = false;
    for (const std::string& n : f.names()) {
      if (n.rfind("out.", 0) != 0) continue;
      for (const float v : f.get(n).to_f32()) {
        EXPECT_FALSE(std::isnan(v)) << c.name << " " << n;
        // -inf: unreachable scores (index_scores, mask_scores) and the compressor's unwritten slot
        if (std::isinf(v)) {
          EXPECT_TRUE(v < 0 && (c.op == "index_scores" || c.op == "mask_scores" || n == "out.score_state"))
              << c.name << " " << n;
        }
        nonzero |= v != 0;
      }
    }
    EXPECT_TRUE(nonzero) << c.name;
  }
}

TEST(Vectors, TheAdversarialPropertiesHoldInTheInputs) {
  const std::string& v = tiny().vec;
  {  // top-k: the k-th score is tied across the cut and the lower positions win; empty, length-1, padded rows
    const st::SafetensorsFile f = read_case(v, "tiny.index_topk");
    const auto s = f.get("in.scores").to_f32();
    const auto t = values<int32_t>(f.get("out.topk"));
    const auto reach = values<int64_t>(f.get("in.reach"));
    const int64_t N = f.get("in.scores").shape[1], k = f.get("out.topk").shape[1];
    EXPECT_EQ(std::count(t.begin(), t.begin() + k, -1), k);               // reach 0: all -1
    EXPECT_EQ(std::count(t.begin() + k, t.begin() + 2 * k, -1), k - 1);   // reach 1: one
    EXPECT_EQ(std::count(t.begin() + 2 * k, t.begin() + 3 * k, -1), 5);   // reach k - 5: padding
    const int64_t r = 3;
    std::set<int32_t> chosen(t.begin() + r * k, t.begin() + (r + 1) * k);
    float kth = INFINITY;
    for (const int32_t p : chosen) kth = std::min(kth, s[static_cast<size_t>(r * N + p)]);
    int32_t last_tied_chosen = -1;
    for (const int32_t p : chosen) {
      if (s[static_cast<size_t>(r * N + p)] == kth) last_tied_chosen = std::max(last_tied_chosen, p);
    }
    int64_t tied_out = 0;
    for (int64_t p = 0; p < reach[r]; ++p) {
      if (s[static_cast<size_t>(r * N + p)] == kth && !chosen.count(static_cast<int32_t>(p))) {
        ++tied_out;
        EXPECT_GT(p, last_tied_chosen);  // lower position wins
      }
    }
    EXPECT_GT(tied_out, 0) << "no exact tie across the cut";
  }
  {  // sparse_attn: an all -1 row (output zero), a length-1 row, a wrapped window row
    const st::SafetensorsFile f = read_case(v, "tiny.sparse_attn");
    const auto idx = values<int32_t>(f.get("in.idxs"));
    const int64_t K = f.get("in.idxs").shape[1];
    const auto valid = [&](int64_t row) { return K - std::count(idx.begin() + row * K, idx.begin() + (row + 1) * K, -1); };
    EXPECT_EQ(valid(3), 0);
    EXPECT_EQ(valid(2), 1);
    bool wraps = false;
    for (int64_t j = 1; j < K; ++j) wraps |= idx[static_cast<size_t>(j)] >= 0 && idx[static_cast<size_t>(j)] < idx[static_cast<size_t>(j - 1)];
    EXPECT_TRUE(wraps) << "row 0 does not wrap around the ring";
    const auto o = f.get("out.o").to_f32();
    const size_t row = o.size() / 4;
    EXPECT_TRUE(std::all_of(o.begin() + 3 * row, o.end(), [](float x) { return x == 0; }));
  }
  {  // compress: part 1 leaves a split group, part 2 resumes from its serialized state
    const st::SafetensorsFile a = read_case(v, "tiny.compress.split_part1"), b = read_case(v, "tiny.compress.split_part2_resume");
    EXPECT_NE(a.get("in.kv").shape[0] % 2, 0);
    EXPECT_EQ(std::stoll(b.metadata().at("param.start_pos")), a.get("in.kv").shape[0]);
    EXPECT_EQ(b.get("in.kv_state").bytes, a.get("out.kv_state").bytes);
    EXPECT_EQ(b.get("in.score_state").bytes, a.get("out.score_state").bytes);
  }
  {  // moe_gate: the k-th expert ties with an unchosen expert of identical gate row and bias
    const st::SafetensorsFile f = read_case(v, "tiny.moe_gate");
    const st::Entry& w = f.get("in.gate.weight");
    const auto e = values<int32_t>(f.get("out.experts"));
    const int64_t k = f.get("out.experts").shape[1], row = w.shape[1] * 2;
    int64_t ties = 0;
    for (size_t t = 0; t < e.size() / static_cast<size_t>(k); ++t) {
      const int32_t last = e[t * static_cast<size_t>(k) + static_cast<size_t>(k) - 1];
      for (int64_t x = 0; x < w.shape[0]; ++x) {
        const bool chosen = std::find(e.begin() + static_cast<int64_t>(t) * k, e.begin() + static_cast<int64_t>(t + 1) * k, x) !=
                            e.begin() + static_cast<int64_t>(t + 1) * k;
        if (!chosen && std::memcmp(w.bytes.data() + x * row, w.bytes.data() + last * row, static_cast<size_t>(row)) == 0) {
          ++ties;
          EXPECT_GT(x, last);  // the lower expert won
        }
      }
    }
    EXPECT_GT(ties, 0);
  }
  {  // window wrap-around writes; a resumed Engram history
    const auto entries = values<int64_t>(read_case(v, "tiny.write_entries.fp8_e4m3_e8m0_b32").get("in.entries"));
    EXPECT_FALSE(std::is_sorted(entries.begin(), entries.end()));
    EXPECT_GT(std::stoll(read_case(v, "tiny.engram_hash_ids.resume").metadata().at("param.history_first")), 0);
  }
}

}  // namespace
