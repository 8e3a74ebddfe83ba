// The port dump's second container and generating runs (docs/port-dump.md): on the tiny oracle
// model, `forward --dump OUT.h5` holds exactly the directory form's tensors and metadata, bit for
// bit; conform gives the same verdict and root cause on both containers; a corrupt HDF5 dump exits 2
// naming the dataset; the dumps of `--generate` and `--generate --speculative` runs (verify steps
// with rollback) pass conform bit-exactly.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::scenarios::conform::PortDump;
using dsv41::scenarios::conform::read_port_dump;
using dsv41::test::has;
using dsv41::test::scratch;

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";
const std::string kConfig = kOracle + "config.json";
const std::string kWeights = kOracle + "weights.safetensors";

std::string id_list(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) s += ',';
    s += std::to_string((i * 37 + 11) % 1024);
  }
  return s;
}

// `dsv41 forward ... --dump PATH` into the suite's temp dir (once per path).
std::string forward_dump(const std::string& name, const std::string& run) {
  const std::string path = testing::TempDir() + "/dsv41_h5dump_" + std::to_string(::getpid()) + "_" + name;
  if (!fs::exists(path)) {
    const dsv41::test::CliResult r = dsv41::test::run_dsv41("forward --config '" + kConfig + "' --weights '" +
                                                            kWeights + "' " + run + " --dump '" + path + "'");
    EXPECT_EQ(r.code, 0) << r.err;
  }
  return path;
}

// 70 prompt tokens in chunks of 48, then 2 decode steps (as conform_test's dump).
const std::string kRun = "--prompt " + id_list(70) + " --chunk 48 --decode 5,723";
std::string dir_dump() { return forward_dump("dir", kRun); }
std::string h5_dump() { return forward_dump("run.h5", kRun); }

std::string conform_cli(const std::string& dump) {
  return "conform '" + dump + "' --config '" + kConfig + "' --weights '" + kWeights + "' -q -o '" + scratch() +
         "/r.h5'";
}

dsv41::reports::RunReport judge(const std::string& dump) {
  static const dsv41::reference::ModelConfig c = dsv41::reference::load_config_file(kConfig);
  static const dsv41::reference::checkpoint::ModelWeights w = dsv41::reference::checkpoint::ModelWeights::load(kWeights, c);
  return dsv41::scenarios::conform::conform(read_port_dump(dump), w, dsv41::reference::model::default_token_map(c), {});
}

std::string copy_of(const std::string& dump, const std::string& name) {
  const std::string to = scratch() + "/" + name;
  fs::remove_all(to);
  fs::copy(dump, to, fs::copy_options::recursive);
  return to;
}

// The index of the element the perturbation flips: the first nonzero from the middle.
size_t middle_nonzero(const std::vector<uint16_t>& bits) {
  size_t i = bits.size() / 2;
  while (i < bits.size() && (bits[i] & 0x7FFF) == 0) ++i;
  return i;
}

// Flips the lowest mantissa bit of one BF16 element of /step_000001/layer03.attn_out in place.
void nudge_h5(const std::string& path) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t ds = H5Dopen2(f, "/step_000001/layer03.attn_out", H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  const hid_t space = H5Dget_space(ds);
  std::vector<uint16_t> bits(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  H5Sclose(space);
  ASSERT_GE(H5Dread(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()), 0);
  const size_t i = middle_nonzero(bits);
  ASSERT_LT(i, bits.size());
  bits[i] ^= 1;
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()), 0);
  H5Dclose(ds);
  H5Fclose(f);
}

// The same flip in the directory form.
void nudge_dir(const std::string& dir) {
  const std::string path = dir + "/" + dsv41::scenarios::conform::dump_step_file(1);
  const st::SafetensorsFile f = st::SafetensorsFile::read(path);
  std::vector<st::Entry> entries;
  for (const std::string& n : f.names()) entries.push_back(f.get(n));
  for (st::Entry& e : entries) {
    if (e.name != "layer03.attn_out") continue;
    std::vector<uint16_t> bits(e.bytes.size() / 2);
    std::memcpy(bits.data(), e.bytes.data(), e.bytes.size());
    const size_t i = middle_nonzero(bits);
    ASSERT_LT(i, bits.size());
    e.bytes[2 * i] ^= 1;
  }
  st::write(path, entries, f.metadata());
}

// Replaces /step_000001/layer03.attn_out with an int32 dataset of the same shape, dtype still BF16.
void retype_h5(const std::string& path) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const char* name = "/step_000001/layer03.attn_out";
  const hid_t old = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t space = H5Dget_space(old);
  H5Dclose(old);
  ASSERT_GE(H5Ldelete(f, name, H5P_DEFAULT), 0);
  const hid_t ds = H5Dcreate2(f, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  const hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, 4);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(ds, "dtype", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, str, "BF16");
  H5Aclose(a);
  H5Sclose(scalar);
  H5Tclose(str);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
}

void delete_h5(const std::string& path) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/step_000001/layer03.attn_out", H5P_DEFAULT), 0);
  H5Fclose(f);
}

bool meaningful(const st::Entry& e) {
  const std::vector<float> v = e.to_f32();
  return !v.empty() && std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; }) &&
         std::none_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

TEST(PortDumpH5, HoldsTheDirectoryFormBitForBit) {
  const PortDump a = read_port_dump(dir_dump()), b = read_port_dump(h5_dump());
  EXPECT_FALSE(a.h5);
  EXPECT_TRUE(b.h5);
  EXPECT_EQ(b.version, dsv41::scenarios::conform::kPortDumpVersion);
  ASSERT_EQ(a.steps.size(), 4u);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  EXPECT_EQ(a.components, b.components);
  EXPECT_EQ(a.config_hash, b.config_hash);
  for (size_t k = 0; k < a.steps.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    const auto &x = a.steps[k], &y = b.steps[k];
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.start_pos, y.start_pos);
    EXPECT_EQ(x.kept, y.kept);
    EXPECT_EQ(x.event, y.event);
    EXPECT_EQ(x.metadata, y.metadata);
    ASSERT_EQ(x.tensors.size(), y.tensors.size());
    for (const auto& [key, e] : x.tensors) {
      ASSERT_TRUE(y.tensors.count(key)) << key;
      const st::Entry& f = y.tensors.at(key);
      EXPECT_EQ(e.dtype, f.dtype) << key;
      EXPECT_EQ(e.shape, f.shape) << key;
      EXPECT_TRUE(e.bytes == f.bytes) << key;
    }
    for (const char* k : {"model.logits", "layer03.attn_out", "layer03.hc_ffn_comb"}) {
      EXPECT_TRUE(meaningful(y.tensors.at(k))) << k;
    }
  }
  EXPECT_TRUE(has(b.steps[1].file, "run.h5:/step_000001")) << b.steps[1].file;
}

TEST(PortDumpH5, ConformGivesTheSameVerdictOnBothContainers) {
  const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(h5_dump()));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "every covered component of every step agrees")) << r.out;
  // One element of layer03.attn_out at step 1 flipped in both: the same root cause.
  const std::string d = copy_of(dir_dump(), "dir"), h = copy_of(h5_dump(), "nudged.h5");
  nudge_dir(d);
  nudge_h5(h);
  const dsv41::reports::RunReport ra = judge(d), rb = judge(h);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(ra), 1);
  EXPECT_EQ(dsv41::scenarios::conform::conform_exit_code(rb), 1);
  const auto ca = dsv41::scenarios::conform::root_cause(ra), cb = dsv41::scenarios::conform::root_cause(rb);
  ASSERT_TRUE(ca && cb);
  EXPECT_EQ(ca->component, "attn_out");
  EXPECT_EQ(ca->layer, 3);
  EXPECT_EQ(ca->step, 1);
  EXPECT_EQ(std::tie(ca->mode, ca->step, ca->layer, ca->component, ca->metric, ca->value, ca->detail),
            std::tie(cb->mode, cb->step, cb->layer, cb->component, cb->metric, cb->value, cb->detail));
}

TEST(PortDumpH5, CorruptFilesExit2NamingTheDataset) {
  struct Case {
    std::string name, want;
    void (*corrupt)(const std::string&);
  };
  const std::vector<Case> cases = {
      {"truncated", "not a readable HDF5 dump",
       [](const std::string& p) { fs::resize_file(p, fs::file_size(p) / 2); }},
      {"not_hdf5", "not a readable HDF5 dump", [](const std::string& p) { std::ofstream(p) << "{\"format\": 1}"; }},
      {"retyped", "dataset 'layer03.attn_out': stored as int32, but dtype BF16 is stored as uint16", retype_h5},
      {"deleted", "group /step_000001: missing key 'layer03.attn_out'", delete_h5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = copy_of(h5_dump(), c.name + ".h5");
    c.corrupt(p);
    const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(p));
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(has(r.err, c.want) && has(r.err, c.name + ".h5")) << r.err;
  }
}

TEST(PortDumpGenerate, GreedyAndSampledDumpsPassConformBitExactly) {
  for (const std::string& sampling : {std::string(), std::string(" --sampling 1.0 --seed 7")}) {
    SCOPED_TRACE(sampling);
    const std::string name = sampling.empty() ? "greedy" : "sampled";
    const std::string d = forward_dump(name, "--prompt " + id_list(20) + " --generate 4" + sampling);
    const PortDump p = read_port_dump(d);
    ASSERT_EQ(p.steps.size(), 4u);  // the prompt, then 3 decode steps (token 0 is picked from the prompt)
    EXPECT_EQ(p.steps[0].event, "prefill");
    for (size_t k = 1; k < p.steps.size(); ++k) {
      EXPECT_EQ(p.steps[k].event, "decode");
      EXPECT_EQ(p.steps[k].tokens.size(), 1u);
      EXPECT_TRUE(meaningful(p.steps[k].tensors.at("model.logits")));
    }
    const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(d));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_TRUE(has(r.out, "every covered component of every step agrees")) << r.out;
  }
}

// Greedy rounds on the tiny model reject every draft (kept 1 of 4); sampled ones (seed 3) accept
// some: kept 2 of 4 (a partial rollback) and 4 of 4 (none).
TEST(PortDumpGenerate, SpeculativeDumpRollsBackAndPassesConformBitExactly) {
  for (const std::string& sampling : {std::string(), std::string(" --sampling 1.0 --seed 3")}) {
    SCOPED_TRACE(sampling);
    const std::string name = sampling.empty() ? "spec.h5" : "spec_sampled.h5";
    const std::string d = forward_dump(name, "--prompt " + id_list(20) + " --generate 12 --speculative 3" + sampling);
    const PortDump p = read_port_dump(d);
    ASSERT_GE(p.steps.size(), 2u);
    int rolled_back = 0, accepted = 0;
    for (size_t k = 1; k < p.steps.size(); ++k) {
      const auto& s = p.steps[k];
      EXPECT_EQ(s.event, "verify");
      EXPECT_EQ(s.start_pos, p.steps[k - 1].start_pos + p.steps[k - 1].kept);
      EXPECT_EQ(s.tensors.at("model.logits").shape.at(0), static_cast<int64_t>(s.tokens.size()));  // every row
      EXPECT_TRUE(meaningful(s.tensors.at("model.logits")));
      if (s.kept < static_cast<int64_t>(s.tokens.size())) ++rolled_back;
      if (s.kept > 1) ++accepted;
    }
    EXPECT_GT(rolled_back, 0) << "no round rejected a draft: the rollback is untested";
    if (!sampling.empty()) {
      EXPECT_GT(accepted, 0) << "no round accepted a draft";
    }
    EXPECT_FALSE(p.components.count("dspark_attn_out"));  // the draft is not recorded (not covered)
    const dsv41::test::CliResult r = dsv41::test::run_dsv41(conform_cli(d));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_TRUE(has(r.out, "every covered component of every step agrees")) << r.out;
  }
}

}  // namespace
