// scenarios/runner/verdict.h
//
// What a pair of sides given on the command line (not in the scenario) is expected to show
// (docs/scenarios.md). The verdicts themselves are the judge's (scenarios/judge/judge.h).
//
// Example:
//   std::string why;
//   const Expectation e = default_expectation(parse_side("ref"), parse_side("ref@global"), s, &why);
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "reports/report.h"
#include "scenarios/judge/judge.h"
#include "scenarios/runner/scenario.h"

namespace dsv41::scenarios::runner {

// The expectation of a pair given on the command line (not in the scenario): bitexact when both
// backends claim the reference's bits and neither path replays (cold/full/alone) or the scenario
// never resumes; tolerance (the derived bounds) when a backend claims order-variant results
// (ref-order:<variant>, cuda) and
// neither is approximate nor takes a replaying path; measured otherwise. `why` receives the origin.
judge::Expectation default_expectation(const Side& a, const Side& b, const Scenario& s, std::string* why);

}  // namespace dsv41::scenarios::runner
