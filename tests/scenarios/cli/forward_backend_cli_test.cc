// `dsv41 forward --backend NAME` end to end (docs/forward.md "--backend"): the built executable on
// the oracle config and weights. The default is the reference; an order-variant backend's dump
// records its backend and claim and passes `dsv41 conform` under that claim, while the same
// variant with a planted defect fails it, located; sessions and generation run on the chosen
// ops; bad names, refused backends and a defect that never applies exit 2 writing nothing; the
// CUDA names without a CUDA build (or a device) give a clear error, with one they run (cuda-exact:
// the reference's bits). All on the CPU: CI runs them.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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
using dsv41::test::has;
using Result = dsv41::test::CliResult;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";
constexpr int64_t kVocab = 1024;
const std::string kVariant = "ref-order:splitk";
// The variant with one planted defect: layer 2's attn_out, step 0 (scenarios/defects/mutants.h).
const std::string kDefect = "ref-order:splitk:attn_out:L2:S0";

Result run(const std::string& args) { return dsv41::test::run_dsv41(args); }
std::string at(const std::string& name) { return dsv41::test::scratch() + "/" + name; }

// 40 prompt ids (the tiny vocab), comma-separated.
std::string prompt(int n = 40, int shift = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string((13 * (i + shift) + 7) % kVocab);
  return s;
}

std::string forward(const std::string& backend, const std::string& extra) {
  return "forward -q --config '" + kConfig + "' --weights '" + kWeights + "'" +
         (backend.empty() ? "" : " --backend '" + backend + "'") + " " + extra;
}
std::string conform(const std::string& dump) {
  return "conform '" + dump + "' --config '" + kConfig + "' --weights '" + kWeights + "' -o '" + dump + ".report.h5'";
}

nlohmann::json manifest(const std::string& dump) {
  std::ifstream in(dump + "/dump.json");
  return nlohmann::json::parse(in);
}


// /logits, checked usable: finite, not all zero.
Array<float> logits(const std::string& file) {
  Array<float> l = H5File(file).read<float>("logits", 2);
  EXPECT_EQ(l.shape.at(1), kVocab);
  bool nonzero = false;
  for (float v : l.data) {
    EXPECT_TRUE(std::isfinite(v)) << file;
    nonzero |= v != 0.0f;
  }
  EXPECT_TRUE(nonzero) << file << ": all logits zero";
  return l;
}
bool same_bits(const Array<float>& a, const Array<float>& b) {
  return a.shape == b.shape && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

class ForwardBackend : public testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dsv41::test::scratch());
  }
};

TEST_F(ForwardBackend, RefIsTheDefaultAndAnOrderVariantRunsItsOwnOps) {
  const std::string args = "--prompt " + prompt() + " --decode 5,723 -o ";
  const Result plain = run(forward("", args + at("plain.h5")));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Result ref = run(forward("ref", args + at("ref.h5")));
  ASSERT_EQ(ref.code, 0) << ref.err;
  const Result variant = run(forward(kVariant, args + at("variant.h5")));
  ASSERT_EQ(variant.code, 0) << variant.err;
  EXPECT_TRUE(has(variant.err, "backend " + kVariant + " (claims order-variant)")) << variant.err;
  EXPECT_FALSE(has(ref.err, "claims")) << ref.err;  // the default run prints what it always did
  const Array<float> a = logits(at("plain.h5")), b = logits(at("ref.h5")), c = logits(at("variant.h5"));
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_FALSE(same_bits(a, c)) << "the variant's sums are in another order: some logit bits differ";
  EXPECT_EQ(string_attr(at("plain.h5"), "backend"), "ref");
  EXPECT_EQ(string_attr(at("variant.h5"), "backend"), kVariant);
}

TEST_F(ForwardBackend, OrderVariantDumpConformsAndItsPlantedDefectIsLocated) {
  const std::string args = "--prompt " + prompt() + " --decode 5,723 --dump ";
  const std::string ref = at("ref_dump"), good = at("variant_dump"), bad = at("defect_dump");
  ASSERT_EQ(run(forward("ref", args + "'" + ref + "'")).code, 0);
  const Result g = run(forward(kVariant, args + "'" + good + "'"));
  ASSERT_EQ(g.code, 0) << g.err;
  const Result d = run(forward(kDefect, args + "'" + bad + "'"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(manifest(ref)["claim"], "bit-exact");
  EXPECT_EQ(manifest(ref)["backend"], "ref");
  EXPECT_EQ(manifest(good)["claim"], "order-variant");
  EXPECT_EQ(manifest(good)["backend"], kVariant);
  EXPECT_EQ(manifest(bad)["claim"], "order-variant");
  EXPECT_EQ(manifest(bad)["backend"], kDefect);

  // The correct variant passes under the claim its manifest states (no --order-variant given).
  const Result cg = run(conform(good));
  EXPECT_EQ(cg.code, 0) << cg.out << cg.err;
  EXPECT_TRUE(has(cg.out, "claim: order-variant (the dump's manifest)")) << cg.out;
  // The planted defect fails it, located at its step, layer and component.
  const Result cb = run(conform(bad));
  EXPECT_EQ(cb.code, 1) << cb.out << cb.err;
  EXPECT_TRUE(has(cb.out, "root cause (teacher-forced): step 0, layer 2, attn_out")) << cb.out;
}

TEST_F(ForwardBackend, SessionsAndGenerationRunOnTheChosenOps) {
  // The prompt split by --save-state / --resume gives the one run's bits, on the variant's ops.
  const std::string first = prompt(30), next = prompt(20, 30), both = prompt(50);
  ASSERT_EQ(run(forward(kVariant, "--prompt " + both + " --decode 5 -o '" + at("whole.h5") + "'")).code, 0);
  const Result s = run(forward(kVariant, "--prompt " + first + " --save-state '" + at("s.dsv41s") + "' -o '" +
                                             at("first.h5") + "'"));
  ASSERT_EQ(s.code, 0) << s.err;
  const Result r = run(forward(kVariant, "--prompt " + next + " --decode 5 --resume '" + at("s.dsv41s") + "' -o '" +
                                             at("next.h5") + "'"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(same_bits(logits(at("whole.h5")), logits(at("next.h5"))));
  // Generation, chunked, with a dump: the generated tokens and the dump's claim follow the backend.
  const Result gen = run(forward(kVariant, "--prompt " + prompt() + " --chunk 16 --generate 3 --dump '" +
                                               at("gen_dump") + "' -o '" + at("gen.h5") + "'"));
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(H5File(at("gen.h5")).read<int64_t>("generated", 1).data.size(), 3u);
  EXPECT_EQ(manifest(at("gen_dump"))["claim"], "order-variant");
  EXPECT_EQ(manifest(at("gen_dump"))["n_steps"], 5);  // 3 prompt chunks, 2 generated decode steps
}

// A speculative generation's dump on the variant (verify steps that roll back): conform passes it,
// the teacher-forced caches and their readers measured from the first rollback on (the replay
// reruns the kept tokens without the port's values), with a note saying so; the tensor-core
// emulation's dump records its accumulation and passes under it (that fp32 does not admit it:
// tests/scenarios/judge/accumulation_test.cc).
TEST_F(ForwardBackend, SpeculativeDumpsConformAfterARollback) {
  const std::string dump = at("spec_dump");
  const Result f = run(forward("ref-order:tiles", "--prompt " + prompt() + " --generate 5 --speculative 2 --dump '" +
                                                      dump + "'"));
  ASSERT_EQ(f.code, 0) << f.err;
  const Result c = run(conform(dump) + " --no-end-to-end");
  EXPECT_EQ(c.code, 0) << c.out << c.err;
  const Result show = run("report show '" + dump + ".report.h5'");
  EXPECT_TRUE(has(show.out + c.out, "a speculative round rolled back")) << show.out;
  const std::string tc = at("trunc13_dump");
  const Result t = run(forward("ref-order:trunc13", "--prompt " + prompt() + " --decode 5 --dump '" + tc + "'"));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(manifest(tc)["accumulation"], "fp8-tensor-core");
  const Result ct = run(conform(tc) + " --no-end-to-end");
  EXPECT_EQ(ct.code, 0) << ct.out << ct.err;
  EXPECT_TRUE(has(ct.out, "accumulation fp8-tensor-core (the dump's manifest)")) << ct.out;
}

// Exit 2 and nothing written, before the weights are read where the name alone tells.
void expect_refused(const std::string& backend, const std::vector<std::string>& parts) {
  const std::string out = at("refused.h5"), dump = at("refused_dump");
  const Result r = run(forward(backend, "--prompt " + prompt() + " -o '" + out + "' --dump '" + dump + "'"));
  EXPECT_EQ(r.code, 2) << backend << ": " << r.err;
  for (const std::string& p : parts) EXPECT_TRUE(has(r.err, p)) << backend << ": " << r.err;
  EXPECT_FALSE(fs::exists(out)) << backend;
  EXPECT_FALSE(fs::exists(dump)) << backend;
}

TEST_F(ForwardBackend, BadAndRefusedNamesExit2NamingTheValidOnes) {
  const std::string valid = "valid: ref, ";
  expect_refused("nope", {"--backend 'nope': unknown backend", valid, "cuda-exact", "ref-order:<variant>"});
  expect_refused("ref-order:sideways", {"unknown reordered variant 'sideways'", "splitk", valid});
  expect_refused("ref-bf16kv", {"--backend 'ref-bf16kv'", "not the official formats", valid});
  expect_refused("mutant:accept_one_more:S1", {"speculative-round defect", "dsv41 run", valid});
  expect_refused("ref-order:splitk:attn_out:L99:S0", {"layer 99 is not a layer of this model"});
  // A defect whose step never comes: the run would be the unplanted variant's.
  expect_refused("ref-order:splitk:attn_out:L2:S7", {"never applied"});
}

TEST_F(ForwardBackend, CudaNamesNeedACudaBuildAndADevice) {
  const std::string args = "--prompt " + prompt() + " --decode 5 -o ";
  ASSERT_EQ(run(forward("ref", args + at("ref.h5"))).code, 0);
  for (const std::string backend : {"cuda-exact", "cuda"}) {
    const std::string out = at(backend + ".h5");
    const Result r = run(forward(backend, args + "'" + out + "' --dump '" + at(backend + "_dump") + "'"));
#if !DSV41_BUILD_HAS_CUDA
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "backend " + backend + ": this build has no CUDA path")) << r.err;
    EXPECT_FALSE(fs::exists(out));
#else
    if (r.code != 0) {  // no device here: refused before the weights are read
      EXPECT_EQ(r.code, 2) << r.err;
      EXPECT_TRUE(has(r.err, "backend " + backend + ": no CUDA device")) << r.err;
      EXPECT_FALSE(fs::exists(out));
      continue;
    }
    EXPECT_EQ(manifest(at(backend + "_dump"))["backend"], backend);
    EXPECT_EQ(manifest(at(backend + "_dump"))["claim"], backend == "cuda" ? "order-variant" : "bit-exact");
    if (backend == "cuda-exact") {
      EXPECT_TRUE(same_bits(logits(at("ref.h5")), logits(out)));
    }
#endif
  }
}

}  // namespace
