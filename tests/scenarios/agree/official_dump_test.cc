// The importer of official runs (scenarios/agree/official_dump.h, `dsv41 import-official`):
//   - golden/runs/w16_r2early_p520 imported reads back as a valid port dump (claim order-variant,
//     every step, the mapped components at their layers) whose values are the official ones;
//   - the waiver file is exactly the (component, layer, step)s of the stale-index-keys rule,
//     checked against the rule worked out by hand for two runs (and, for golden/oracle, the steps
//     where docs/indexer.md reports the official decode scoring layer 6's keys);
//   - conform under order-variant with the waivers passes the imported prefix, and a small real bug
//     planted in the imported dump (one row of out_stream x 1.01; one row of attn_out x 1.05 at a
//     stale-keys (layer, step)) is flagged and located at that component: the waivers hide neither.
//   - the verb (`dsv41 import-official`, an HDF5 dump) prints what it left out, the known
//     differences by name and a conform command that passes; an existing dump is refused (exit 2).
// Kept to seconds: conform judges steps 0 .. 1 (the prefill and one stale decode step).
#include "scenarios/agree/official_dump.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <tuple>
#include <unistd.h>

#include "formats/minifloat.h"
#include "reference/checkpoint/weights.h"
#include "reports/report.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"
#include "tests/support/run_cli.h"

namespace dsv41::scenarios::agree {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = DSV41_SOURCE_DIR "/golden/";
const std::string kRun = kGolden + "runs/w16_r2early_p520";

std::string temp_dir() {
  return (fs::temp_directory_path() / ("dsv41_official_dump_test." + std::to_string(::getpid()))).string();
}

// Removes the temp directory when the tests end.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(temp_dir()); }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempDir = ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

// One import of the run per test binary, in a fresh temp directory.
struct Imported {
  std::string dir, dump;
  ImportSummary summary;
};
const Imported& imported() {
  static const Imported im = [] {
    Imported i;
    i.dir = temp_dir();
    fs::remove_all(i.dir);
    fs::create_directories(i.dir);
    i.dump = i.dir + "/w16.dump";
    i.summary = import_official(OracleRun::open(kRun), i.dump, "official_dump_test");
    return i;
  }();
  return im;
}

std::set<std::tuple<std::string, int, int64_t>> waived(const std::vector<conform::ConformWaiver>& ws) {
  std::set<std::tuple<std::string, int, int64_t>> out;
  for (const conform::ConformWaiver& w : ws) {
    EXPECT_EQ(w.layer_lo, w.layer_hi);
    EXPECT_EQ(w.step_lo, w.step_hi);
    EXPECT_NE(w.reason.find(kStaleIndexKeys), std::string::npos) << w.reason;
    out.insert({w.component, w.layer_lo, w.step_lo});
  }
  return out;
}

TEST(OfficialDump, ReadsBackWithTheMappedComponents) {
  const Imported& im = imported();
  const conform::PortDump d = conform::read_port_dump(im.dump);
  const OracleRun run = OracleRun::open(kRun);
  EXPECT_EQ(d.claim, conform::kClaimOrderVariant);
  EXPECT_NE(d.tool.find("official"), std::string::npos) << d.tool;
  ASSERT_EQ(d.steps.size(), run.steps().size());
  EXPECT_EQ(d.steps[0].event, "prefill");
  EXPECT_EQ(d.steps[1].event, "decode");
  // Every backbone layer's stream, mixes and outputs; the selections at their layers (layer 1 the
  // ratio-2 indexer, 4 the candidate source, 6 the Reindex layer of the run's config).
  for (const char* comp : {"in_stream", "in_pre", "hc_attn_pre", "hc_attn_comb", "hc_ffn_post", "attn_out", "experts",
                           "ffn_out", "out_stream"}) {
    ASSERT_TRUE(d.components.count(comp)) << comp;
    EXPECT_EQ(d.components.at(comp), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << comp;
  }
  EXPECT_EQ(d.components.at("topk"), (std::vector<int>{1, 4, 6}));
  EXPECT_EQ(d.components.at("index_scores"), (std::vector<int>{1, 4, 6}));
  EXPECT_EQ(d.components.at("candidates"), (std::vector<int>{4}));
  EXPECT_EQ(d.components.at("engram_ids"), (std::vector<int>{1, 4}));
  EXPECT_EQ(d.components.at("cache.compressor"), (std::vector<int>{1}));
  EXPECT_TRUE(d.components.count("logits") && d.components.count("embed"));
  // engram_out is in decode.h5 only for this run: left out, and said so.
  EXPECT_FALSE(d.components.count("engram_out"));
  bool said = false;
  for (const LeftOut& l : im.summary.left_out) said = said || l.what == "engram_out@1";
  EXPECT_TRUE(said);
  // The values are the official ones: out_stream of layer 3 at decode step 2, bit for bit.
  const conform::PortDumpStep& s = d.steps[3];
  const reference::checkpoint::safetensors::Entry* e = s.find(3, "out_stream");
  ASSERT_NE(e, nullptr);
  const reference::Tensor<float> want = OracleRun::bf16(run.decode(), "decode/step2/layer03/out_stream");
  ASSERT_EQ(e->bytes.size(), static_cast<size_t>(want.numel()) * 2);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const uint16_t bits = static_cast<uint16_t>(e->bytes[2 * i] | (e->bytes[2 * i + 1] << 8));
    ASSERT_EQ(formats::bf16_decode(bits), want.data()[static_cast<size_t>(i)]) << i;
    nonzero += bits != 0;
  }
  EXPECT_GT(nonzero, want.numel() / 2);
  // The top-k: compressed positions ascending, -1 last, width min(index_topk, N).
  const reference::checkpoint::safetensors::Entry* tk = d.steps[0].find(1, "topk");
  ASSERT_NE(tk, nullptr);
  EXPECT_EQ(tk->shape, (std::vector<int64_t>{520, std::min<int64_t>(run.config().index_topk, 520 / 2)}));
}

// The stale-keys rule (docs/agreement.md), worked out by hand: a ratio-2 indexer's compressor
// completes a group at a one-token step at position p iff p is odd; else it scores the keys the
// ratio-1 source published.
TEST(OfficialDump, WaiversAreExactlyTheDerivedStaleKeySteps) {
  const Imported& im = imported();
  std::set<std::tuple<std::string, int, int64_t>> want;
  const OracleRun run = OracleRun::open(kRun);
  for (const OracleStep& st : run.steps()) {
    if (st.index > 0 && st.start_pos % 2 == 0) {  // layer 1: the run's only ratio-2 indexer
      for (const char* c : {"index_scores", "topk"}) want.insert({c, 1, st.index});
    }
  }
  ASSERT_EQ(want.size(), 16u);  // 8 of the 16 decode steps, two components each
  EXPECT_EQ(waived(conform::load_conform_waivers(im.summary.waivers_file)), want);

  // golden/oracle: docs/indexer.md saw layer 2 score layer 6's keys at decode steps 1, 3, 5, 7
  // (dump steps 2, 4, 6, 8); layer 4 runs the same code.
  std::set<std::tuple<std::string, int, int64_t>> oracle_want;
  for (int layer : {2, 4}) {
    for (int64_t step : {2, 4, 6, 8}) {
      for (const char* c : {"index_scores", "topk"}) oracle_want.insert({c, layer, step});
    }
  }
  const std::vector<KnownDifference> k = known_differences(OracleRun::open(kGolden + "oracle"));
  EXPECT_EQ(waived(conform::parse_conform_waivers(known_differences_json(k), "oracle")), oracle_want);
}

conform::ConformOptions options() {
  conform::ConformOptions o;
  o.order_variant = true;
  o.end_to_end = false;
  o.stop_after_step = 1;  // the prefill and decode step 0 (a stale-keys step of layer 1)
  o.tolerances_file = imported().summary.waivers_file;
  return o;
}

reports::RunReport judge_dump(const conform::PortDump& d) {
  const OracleRun run = OracleRun::open(kRun);
  static const reference::checkpoint::ModelWeights w =
      reference::checkpoint::ModelWeights::load(run.weights_path(), run.config());
  return conform::conform(d, w, run.token_map(), options());
}

// Multiplies values [first, first + count) of a BF16 entry by `factor` (rounded to bf16).
void scale_bf16(reference::checkpoint::safetensors::Entry& e, int64_t first, int64_t count, float factor) {
  for (int64_t i = first; i < first + count; ++i) {
    const uint16_t bits = static_cast<uint16_t>(e.bytes[2 * i] | (e.bytes[2 * i + 1] << 8));
    const float v = formats::bf16_decode(bits) * factor;
    const uint16_t out = formats::bf16_encode(v);
    e.bytes[2 * i] = static_cast<uint8_t>(out & 0xFF);
    e.bytes[2 * i + 1] = static_cast<uint8_t>(out >> 8);
  }
}

TEST(OfficialDump, ConformPassesTheImportAndFlagsAPlantedBug) {
  const conform::PortDump clean = conform::read_port_dump(imported().dump);
  const OracleRun run = OracleRun::open(kRun);
  const int64_t dim = run.config().dim;
  {
    const reports::RunReport r = judge_dump(clean);
    EXPECT_EQ(conform::conform_exit_code(r), 0);
    const std::optional<conform::RootCause> rc = conform::root_cause(r);
    EXPECT_FALSE(rc.has_value()) << rc->component << "@" << rc->layer << " step " << rc->step << " " << rc->metric << " = "
                                 << rc->value << ": " << rc->detail;
    // It compared real values: attn_out rows with a bound, the waived stale-keys rows noted.
    int64_t bounded = 0;
    for (const reports::MetricRow& row : r.scenarios.at(0).comparisons.at(0).rows) {
      bounded += row.component == "attn_out" && row.tolerance.has_value() && std::isfinite(row.value);
    }
    EXPECT_GT(bounded, 8);
    // The stale-keys rows of step 1 failed and were waived by name, not passed and not failed.
    bool named = false;
    for (const std::string& n : r.scenarios.at(0).comparisons.at(0).notes) {
      named = named || (n.find("WAIVED step 1 layer 1 index_scores") != std::string::npos &&
                        n.find(kStaleIndexKeys) != std::string::npos);
    }
    EXPECT_TRUE(named);
  }
  // One row (one hc copy) of out_stream x 1.01 at the prefill, layer 5, token 100.
  {
    conform::PortDump d = clean;
    scale_bf16(d.steps[0].tensors.at("layer05.out_stream"), (100 * run.config().hc_mult + 2) * dim, dim, 1.01f);
    const reports::RunReport r = judge_dump(d);
    EXPECT_EQ(conform::conform_exit_code(r), 1);
    const std::optional<conform::RootCause> rc = conform::root_cause(r);
    ASSERT_TRUE(rc.has_value());
    std::cout << "planted out_stream@5 step 0 row x1.01: root cause " << rc->component << "@" << rc->layer << " step "
              << rc->step << " " << rc->metric << " = " << rc->value << "\n";
    EXPECT_EQ(rc->component, "out_stream");
    EXPECT_EQ(rc->layer, 5);
    EXPECT_EQ(rc->step, 0);
  }
  // attn_out of layer 1 at step 1, a stale-keys (layer, step) whose index_scores / topk are
  // waived: the waivers must not hide it.
  {
    conform::PortDump d = clean;
    scale_bf16(d.steps[1].tensors.at("layer01.attn_out"), 0, dim, 1.05f);
    const reports::RunReport r = judge_dump(d);
    EXPECT_EQ(conform::conform_exit_code(r), 1);
    const std::optional<conform::RootCause> rc = conform::root_cause(r);
    ASSERT_TRUE(rc.has_value());
    std::cout << "planted attn_out@1 step 1 row x1.05: root cause " << rc->component << "@" << rc->layer << " step "
              << rc->step << " " << rc->metric << " = " << rc->value << "\n";
    EXPECT_EQ(rc->component, "attn_out");
    EXPECT_EQ(rc->layer, 1);
    EXPECT_EQ(rc->step, 1);
  }
}

// The verb: an HDF5 dump, the summary (what was left out, the known differences by name), the
// conform command it prints runs and passes (steps 0 .. 1 here), an existing dump is refused.
TEST(OfficialDumpCli, ImportsPrintsTheConformCommandAndRefusesAnExistingDump) {
  const std::string dump = test::scratch() + "/w16.h5";
  const test::CliResult r = test::run_dsv41("import-official '" + kRun + "' -o '" + dump + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test::has(r.out, "engram_out@1: the run holds it at steps 1-16 of 0-16 only")) << r.out;
  EXPECT_TRUE(test::has(r.out, std::string(kStaleIndexKeys) + ": layer 1 (index_scores, topk), steps 1, 3, 5")) << r.out;
  EXPECT_TRUE(fs::is_regular_file(test::scratch() + "/w16.known_differences.json"));
  const size_t at = r.out.rfind("dsv41 conform ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string conform_args = r.out.substr(at + 6);
  conform_args.erase(conform_args.find_last_not_of('\n') + 1);
  const test::CliResult c = test::run_dsv41(conform_args + " --stop-after-step 1 --no-end-to-end -q -o '" +
                                            test::scratch() + "/conform.h5'");
  EXPECT_EQ(c.code, 0) << c.out << c.err;
  const test::CliResult again = test::run_dsv41("import-official '" + kRun + "' -o '" + dump + "'");
  EXPECT_EQ(again.code, 2);
  EXPECT_TRUE(test::has(again.err, "exists")) << again.err;
}

}  // namespace
}  // namespace dsv41::scenarios::agree
