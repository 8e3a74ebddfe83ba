// Progress on stderr (scenarios/runner/progress.h, docs/cli.md "Progress"): the helper's styles and
// throttling, and `forward` (per chunk and layer), `run` (per event and step) and `replay-study`
// (per case) end to end: lines when stderr is not a terminal, a bar when asked, nothing with -q.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "scenarios/runner/progress.h"
#include "tests/support/run_cli.h"

namespace dsv41::scenarios::cli {
namespace {

using dsv41::test::CliResult;
using dsv41::test::has;
using dsv41::test::run_dsv41;

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";
const std::string kModel = "--config '" + kOracle + "config.json' --weights '" + kOracle + "weights.safetensors'";

// Sets the progress environment for the commands a test runs, and clears it after.
struct Env {
  Env(const char* style, const char* interval) {
    setenv("DSV41_PROGRESS", style, 1);
    setenv("DSV41_PROGRESS_INTERVAL", interval, 1);
  }
  ~Env() {
    unsetenv("DSV41_PROGRESS");
    unsetenv("DSV41_PROGRESS_INTERVAL");
  }
};

std::string captured(const std::function<void(std::FILE*)>& fn) {
  std::FILE* f = std::tmpfile();
  fn(f);
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(Progress, LinesAreThrottledAndTheLastAlwaysComes) {
  Env env("lines", "1000");  // one line per 1000 s: only the first update shows
  const std::string out = captured([](std::FILE* f) {
    runner::Progress p("work", 4, false, f);
    for (int i = 1; i <= 4; ++i) p.update(i, "unit " + std::to_string(i));
    p.finish("4 units");
    p.finish("again");  // once
  });
  EXPECT_EQ(count(out, "\n"), 2) << out;
  EXPECT_TRUE(has(out, "work:  25% unit 1\n")) << out;
  EXPECT_TRUE(has(out, "work: 100% 4 units in ")) << out;
  EXPECT_FALSE(has(out, "again")) << out;
}

TEST(Progress, ABarRedrawsInPlaceAndQuietPrintsNothing) {
  Env env("bar", "0");
  const std::string bar = captured([](std::FILE* f) {
    runner::Progress p("work", 2, false, f);
    p.update(1, "half");
    p.note("a note between");  // clears the bar first
    p.finish();
  });
  EXPECT_TRUE(has(bar, "\r[############............] work:  50% half")) << bar;
  EXPECT_TRUE(has(bar, "\r\x1b[Ka note between\n")) << bar;
  EXPECT_TRUE(has(bar, "work: 100% done in ")) << bar;
  const std::string quiet = captured([](std::FILE* f) {
    runner::Progress p("work", 2, /*quiet=*/true, f);
    p.update(1, "half");
    p.finish();
  });
  EXPECT_EQ(quiet, "");
  // Not a terminal and no DSV41_PROGRESS: lines.
  unsetenv("DSV41_PROGRESS");
  std::FILE* f = std::tmpfile();
  EXPECT_EQ(runner::Progress::style_for(f, false), runner::Progress::Style::kLines);
  EXPECT_EQ(runner::Progress::style_for(f, true), runner::Progress::Style::kOff);
  std::fclose(f);
}

TEST(ProgressCli, ForwardShowsEachChunkAndLayer) {
  Env env("lines", "0");
  const std::string out = dsv41::test::scratch() + "/f.h5";
  const CliResult r = run_dsv41("forward " + kModel + " --prompt 5,723,380,17,4,9 --chunk 2 --decode 11,12 -o '" + out + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"forward: ", "prefill chunk 1/3 (tokens 0..1) layer 1/", "prefill chunk 3/3 (tokens 4..5)",
                           "decode 2/2 layer ", "forward: 100% 5 steps in "}) {
    EXPECT_TRUE(has(r.err, part)) << part << "\n" << r.err;
  }
  const CliResult q = run_dsv41("forward " + kModel + " --prompt 5,723,380 --decode 11 -q -o '" + out + "'");
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_FALSE(has("\n" + q.err, "\n[")) << q.err;  // no progress line, only what is not progress
  EXPECT_TRUE(has(q.err, "dsv41 forward: wrote ")) << q.err;
}

TEST(ProgressCli, RunShowsEventsAndSteps) {
  Env env("lines", "0");
  const std::string out = dsv41::test::scratch() + "/r.h5";
  const CliResult r = run_dsv41("run full_cache_hit --sides ref,ref --mode free-running --stop-after-step 1 -o '" + out + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* part : {"run: ", "scenario 1/1 full_cache_hit [ref@", "event 1/", "step 0 (prefill)",
                           "step 1 (", "run: 100% 1 scenarios in ", "dsv41 run: scenario full_cache_hit: pass"}) {
    EXPECT_TRUE(has(r.err, part)) << part << "\n" << r.err;
  }
  const CliResult q = run_dsv41("run full_cache_hit --sides ref,ref --mode free-running --stop-after-step 0 -q -o '" + out + "'");
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_FALSE(has("\n" + q.err, "\n[")) << q.err;
  EXPECT_TRUE(has(q.err, "dsv41 run: scenario full_cache_hit: pass")) << q.err;
}

TEST(ProgressCli, ReplayStudyShowsEachCase) {
  Env env("lines", "0");
  const CliResult r = run_dsv41("replay-study " + kModel + " --length 24 --resumptions 1,2 --steps 1 --turns 1 --turn-len 2");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"replay-study:   0% case 1/3: 1 resumption: prompt of ", "case 2/3: 2 resumptions",
                           "case 3/3: follow-up turn 1/1", "replay-study: 100% "}) {
    EXPECT_TRUE(has(r.err, part)) << part << "\n" << r.err;
  }
  EXPECT_TRUE(has(r.out, "| experiment |")) << "the table still goes to stdout";
  const CliResult q = run_dsv41("replay-study " + kModel + " --length 24 --resumptions 1 --steps 1 --turns 0 -q");
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_FALSE(has("\n" + q.err, "\n[")) << q.err;
}

// `run --time-sides`: a side's backend is made on its session's first use, which comes before
// its first timed step, so setup and steps are separate wall times and neither is negative. With
// a model whose copy outlasts a one-token step (scenarios/configs/small.json), subtracting the
// setup from the timed steps printed a negative step time (seen on the H200 at the released dims:
// "steps -9.258 s").
TEST(ProgressCli, TimeSidesNeverPrintsANegativeTime) {
  const std::string dir = dsv41::test::scratch();
  const std::string scen = dir + "/one_token.json";
  std::FILE* f = std::fopen(scen.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"name": "one_token", "events": [{"prompt": [1]}]})", f);
  std::fclose(f);
  const CliResult r = run_dsv41("run '" + scen + "' --config '" + std::string(DSV41_SOURCE_DIR) +
                                "/scenarios/configs/small.json' --sides ref,ref --time-sides -q -o '" + dir + "/t.h5'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  int lines = 0;
  for (size_t at = r.err.find("dsv41 run: time "); at != std::string::npos; at = r.err.find("dsv41 run: time ", at + 1)) {
    const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
    ++lines;
    for (const char* word : {" setup ", " steps "}) {
      int seen = 0;
      for (size_t w = line.find(word); w != std::string::npos; w = line.find(word, w + 1)) {
        const double v = std::strtod(line.c_str() + w + std::string(word).size(), nullptr);
        EXPECT_GE(v, 0.0) << line;
        ++seen;
      }
      EXPECT_EQ(seen, 2) << line;  // sides A and B
    }
  }
  EXPECT_EQ(lines, 2) << r.err;  // the free-running and the teacher-forced comparison
}

}  // namespace
}  // namespace dsv41::scenarios::cli
