// The replay study (scenarios/runner/replay_study.h) on the tiny config with the official oracle weights:
// a session shorter than the window replays entirely, so resumed == uninterrupted exactly; a
// longer one shows a divergence, and every metric stays in its range.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "golden/golden_io.h"
#include "reference/model/model.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/runner/replay_study.h"

namespace dsv41::scenarios::runner {
namespace {

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";

reference::model::Model& tiny_model() {
  static reference::model::Model* m = [] {
    const reference::ModelConfig c = reference::load_config_file(kOracle + "config.json");
    return new reference::model::Model(c, reference::checkpoint::ModelWeights::load(kOracle + "weights.safetensors", c),
                                reference::model::default_token_map(c));
  }();
  return *m;
}

void expect_in_range(const ReplayStepResult& r) {
  EXPECT_TRUE(std::isfinite(r.logit_max_abs));
  EXPECT_GE(r.kl, -1e-12);
  for (const auto& [l, j] : r.topk_jaccard) {
    EXPECT_GE(j, 0.0) << "layer " << l;
    EXPECT_LE(j, 1.0) << "layer " << l;
  }
  EXPECT_EQ(r.stream_nmse.size(), 10u);
}

TEST(ReplayStudy, SessionShorterThanTheWindowIsExact) {
  ReplayStudyOptions o;
  o.length = 40;  // < window 64: every resume replays the whole session
  o.resumptions = {1, 3};
  o.steps = 2;
  o.turns = 2;
  o.turn_len = 4;
  const std::vector<ReplayStepResult> rs = run_replay_study(tiny_model(), o);
  ASSERT_EQ(rs.size(), 2u * 2u + 2u);
  for (const ReplayStepResult& r : rs) {
    expect_in_range(r);
    EXPECT_EQ(r.logit_max_abs, 0.0) << r.experiment << " " << r.resumptions << " step " << r.step;
    EXPECT_TRUE(r.top1_equal);
    for (double n : r.stream_nmse) EXPECT_EQ(n, 0.0);
  }
}

TEST(ReplayStudy, LongSessionDivergesAndIsReported) {
  ReplayStudyOptions o;
  o.length = 150;  // > window: the replay truncates windows
  o.resumptions = {1};
  o.steps = 1;
  o.turns = 1;
  const std::vector<ReplayStepResult> rs = run_replay_study(tiny_model(), o);
  ASSERT_EQ(rs.size(), 2u);
  for (const ReplayStepResult& r : rs) {
    expect_in_range(r);
    EXPECT_GT(r.logit_max_abs, 0.0);
    // Layer 0's KV depends on the token alone, so its rebuilt ring and its output are exact.
    EXPECT_EQ(r.stream_nmse[0], 0.0);
  }
  const std::string md = replay_study_markdown(rs);
  EXPECT_NE(md.find("| resumptions | 1 | 1 |"), std::string::npos) << md;
  EXPECT_NE(replay_study_json(rs).find("\"experiment\": \"turns\""), std::string::npos);
}

}  // namespace
}  // namespace dsv41::scenarios::runner
