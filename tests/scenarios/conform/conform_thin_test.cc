// tests/scenarios/conform/conform_thin_test.cc
//
// Thin dumps (docs/conform.md "Thin dumps"; scenarios/conform/conform_forcing.h): a component whose
// direct inputs the dump lacks is not teacher-forced. Under the order-variant claim it is measured,
// never failed with a bound that assumes forced inputs; the report, its notes and the support
// matrix say which components were forced; a failure of an unforced component names the missing
// inputs. A bug in a forced component of a thin dump is still flagged and located there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "reference/checkpoint/safetensors.h"
#include "reference/model/model.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/conform_forcing.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/selftest/bug_zoo.h"
#include "scenarios/defects/reordered_ops.h"

namespace {

namespace fs = std::filesystem;
namespace st = dsv41::reference::checkpoint::safetensors;
using dsv41::reports::Verdict;
using dsv41::scenarios::conform::ConformOptions;

const dsv41::scenarios::selftest::SelftestModel& model() {
  static const dsv41::scenarios::selftest::SelftestModel m = dsv41::scenarios::selftest::load_selftest_model("", "");
  return m;
}

std::string temp(const std::string& name) {
  return testing::TempDir() + "/dsv41_thin_" + std::to_string(::getpid()) + "_" + name;
}

// The zoo scenario's dump by a correct order-variant port (split-K sums), with a defect when given.
std::string port_dump(const std::string& name, const dsv41::scenarios::defects::Mutation* m = nullptr) {
  const std::string d = temp(name);
  fs::remove_all(d);
  const auto ops = dsv41::scenarios::defects::make_reordered_ops(dsv41::scenarios::defects::SumOrder::kSplitK);
  dsv41::scenarios::selftest::DumpDefects defects;
  bool fired = false;
  defects.mutation = m;
  defects.fired = &fired;
  dsv41::scenarios::selftest::write_scenario_dump(d, model().config, model().weights_path, model().weights,
                                                  dsv41::scenarios::selftest::zoo_scenario(), *ops, "thin test", defects);
  if (m != nullptr) {
    EXPECT_TRUE(fired) << "the planted defect did not fire";
  }
  return d;
}

// A copy of a directory dump without the components in `drop` (manifest and every step file).
std::string thin_copy(const std::string& src, const std::string& name, const std::set<std::string>& drop) {
  const std::string dst = temp(name);
  fs::remove_all(dst);
  fs::create_directories(dst);
  std::ifstream in(src + "/dump.json");
  nlohmann::json m = nlohmann::json::parse(in);
  for (const std::string& c : drop) m["components"].erase(c);
  m.erase("not_covered");
  for (const auto& step : m["steps"]) {
    const std::string file = step["file"].get<std::string>();
    const st::SafetensorsFile f = st::SafetensorsFile::read(src + "/" + file);
    std::vector<st::Entry> keep;
    std::map<std::string, std::string> meta;
    for (const std::string& key : f.names()) {
      const size_t dot = key.find('.');
      std::string component = key.substr(dot + 1);
      if (component.rfind("cache.", 0) == 0) component = component.substr(0, component.find('.', 6));
      const size_t dot2 = component.find('.');
      if (component.rfind("cache.", 0) != 0 && dot2 != std::string::npos) component = component.substr(0, dot2);
      if (key.rfind("step.", 0) != 0 && drop.count(component)) continue;
      keep.push_back(f.get(key));
    }
    for (const auto& [k, v] : f.metadata()) meta[k] = v;
    st::write(dst + "/" + file, keep, meta);
  }
  std::ofstream(dst + "/dump.json") << m.dump(1);
  return dst;
}

dsv41::reports::RunReport judge(const std::string& dir) {
  ConformOptions o;
  o.order_variant = true;
  return dsv41::scenarios::conform::conform(dsv41::scenarios::conform::read_port_dump(dir), model().weights,
                                            dsv41::reference::model::default_token_map(model().config), o);
}

const dsv41::reports::Comparison& forced_cmp(const dsv41::reports::RunReport& r) {
  return r.scenarios.front().comparisons.front();
}

bool any_note(const dsv41::reports::Comparison& c, const std::string& part) {
  for (const std::string& n : c.notes) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

// The mid-layer streams a thin port leaves out: what links one sublayer to the next.
const std::set<std::string> kStreams = {"attn_stream", "in_stream", "out_stream", "engram_out"};

TEST(ConformThinDump, TheForcingOfEachComponentFollowsTheDataflow) {
  const auto schedule = dsv41::reference::layer_schedule(model().config);
  using dsv41::scenarios::conform::direct_inputs;
  const auto has = [](const std::vector<std::pair<std::string, int>>& v, const std::string& c, int l) {
    return std::find(v.begin(), v.end(), std::make_pair(c, l)) != v.end();
  };
  EXPECT_TRUE(has(direct_inputs(model().config, schedule, "hc_ffn_pre", 2), "attn_stream", 2));
  EXPECT_TRUE(has(direct_inputs(model().config, schedule, "ffn_in", 2), "hc_attn_pre", 2));
  EXPECT_TRUE(has(direct_inputs(model().config, schedule, "ffn_out", 2), "experts", 2));
  EXPECT_TRUE(has(direct_inputs(model().config, schedule, "in_stream", 1), "out_stream", 0));
  EXPECT_TRUE(has(direct_inputs(model().config, schedule, "logits", -1), "final_norm_out", -1));
  EXPECT_TRUE(direct_inputs(model().config, schedule, "embed", -1).empty());
  EXPECT_TRUE(direct_inputs(model().config, schedule, "in_pre", 0).empty());
}

TEST(ConformThinDump, AFullOrderVariantDumpIsForcedEverywhereAndPasses) {
  static const std::string full = port_dump("full");
  const dsv41::scenarios::conform::PortDump d = dsv41::scenarios::conform::read_port_dump(full);
  for (const auto& [key, f] : dsv41::scenarios::conform::teacher_forcing(d)) {
    EXPECT_TRUE(f.forced) << key.first << "@" << key.second << " lacks " << (f.missing.empty() ? "" : f.missing[0]);
  }
  const dsv41::reports::RunReport r = judge(full);
  EXPECT_EQ(r.verdict, Verdict::kPass) << (forced_cmp(r).notes.empty() ? "" : forced_cmp(r).notes.front());
  EXPECT_FALSE(any_note(forced_cmp(r), "NOT FORCED"));
}

TEST(ConformThinDump, ACorrectThinPortPassesWithItsUnforcedComponentsBoundedFreeRunningAndNamed) {
  const std::string thin = thin_copy(port_dump("thin_src"), "thin", kStreams);
  const dsv41::reports::RunReport r = judge(thin);
  const dsv41::reports::Comparison& c = forced_cmp(r);
  std::string fails;
  for (const std::string& n : c.notes) {
    if (n.rfind("FAIL", 0) == 0) fails += n + "\n";
  }
  EXPECT_NE(r.verdict, Verdict::kFail) << fails;
  EXPECT_TRUE(any_note(c, "NOT FORCED hc_ffn_pre")) << "the notes name the unforced components";
  EXPECT_TRUE(any_note(c, "attn_stream")) << "and the missing input";
  // Unforced float rows get their free-running bound (their own plus the missing chain's), wider
  // than the forced bound; forced ones keep their derived bound.
  int forced_bound = 0, free_bound = 0;
  double forced_value = 0, free_value = 0;
  for (const dsv41::reports::MetricRow& row : c.rows) {
    if (row.metric != dsv41::scenarios::judge::kRowRelMetric) continue;
    ASSERT_TRUE(std::isfinite(row.value)) << row.component;
    if (row.component == "attn_out" && row.tolerance) {
      ++forced_bound;
      forced_value = row.tolerance->bound;
      EXPECT_EQ(row.tolerance->note.find("free-running"), std::string::npos) << "attn_out's inputs are all in the dump";
    }
    if (row.component == "hc_ffn_comb" && row.layer > 0 && row.tolerance) {
      ++free_bound;
      free_value = row.tolerance->bound;
      EXPECT_NE(row.tolerance->note.find("free-running"), std::string::npos) << row.tolerance->note;
      EXPECT_NE(row.tolerance->note.find("attn_stream@"), std::string::npos) << "the note names the missing chain";
    }
  }
  EXPECT_GT(forced_bound, 0) << "attn_out keeps its inputs (attn_in) and its derived bound";
  EXPECT_GT(free_bound, 0) << "hc_ffn_comb's input attn_stream is missing: its free-running bound";
  const auto b = dsv41::scenarios::judge::derived_bound(model().config, "hc_ffn_comb");
  ASSERT_TRUE(b.has_value());
  EXPECT_GT(free_value, b->bound) << "wider than hc_ffn_comb's forced bound";
  EXPECT_GT(forced_value, 0.0);
  bool said = false;
  for (const std::string& line : dsv41::scenarios::conform::support_matrix_lines(dsv41::scenarios::conform::read_port_dump(thin))) {
    if (line.rfind("hc_ffn_post:", 0) == 0) said = line.find("NOT teacher-forced") != std::string::npos;
  }
  EXPECT_TRUE(said) << "the support matrix says which components are not teacher-forced";
}

TEST(ConformThinDump, ABugInAForcedComponentOfAThinDumpIsStillLocatedThere) {
  const dsv41::scenarios::defects::Mutation m = dsv41::scenarios::defects::parse_mutation("attn_out:L2:S3:x1.02");
  const std::string thin = thin_copy(port_dump("bug_src", &m), "bug", kStreams);
  const dsv41::reports::RunReport r = judge(thin);
  EXPECT_EQ(r.verdict, Verdict::kFail);
  const std::optional<dsv41::scenarios::conform::RootCause> rc = dsv41::scenarios::conform::root_cause(r);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->component, "attn_out");
  EXPECT_EQ(rc->layer, 2);
  EXPECT_EQ(rc->step, 3);
}

}  // namespace
