// scenarios/runner/replay_plan.cc: the steps sampled replay checks (scenarios/runner/replay_plan.h).
#include "scenarios/runner/replay_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace dsv41::scenarios::runner {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<PlannedStep> planned_steps(const Scenario& sc, const TokenPlan& tokens) {
  DSV41_CHECK(tokens.prompts.size() == sc.events.size(), "scenario '", sc.name, "': the token plan has ",
              tokens.prompts.size(), " events, the scenario ", sc.events.size());
  std::vector<PlannedStep> out;
  int64_t step = 0;
  const auto add = [&](size_t e, const char* phase) { out.push_back({step++, e, sc.events[e].session, phase}); };
  for (size_t e = 0; e < sc.events.size(); ++e) {
    const Event& ev = sc.events[e];
    if (ev.kind == Event::kPrompt) {
      const int64_t n = static_cast<int64_t>(tokens.prompts[e].size()), chunk = ev.chunk > 0 ? ev.chunk : n;
      for (int64_t first = 0; first < n; first += chunk) add(e, "prefill");
    } else if (ev.kind == Event::kDecode) {
      for (int64_t i = 0; i < ev.decode; ++i) add(e, "decode");
    } else if (ev.kind == Event::kSpeculate) {
      for (int64_t i = 0; i < ev.speculate.rounds; ++i) add(e, "round");
    } else {
      add(e, "resume");
    }
  }
  return out;
}

uint64_t replay_seed(const Scenario& sc, const ReplaySpec& spec) {
  return spec.seed ? *spec.seed : stream_seed(sc.seed, "replay");
}

ReplaySample sample_replay_steps(const Scenario& sc, const TokenPlan& tokens, const ReplaySpec& spec) {
  DSV41_CHECK(spec.extra >= 0, "scenario '", sc.name, "': replay.extra must be >= 0, got ", spec.extra);
  const std::vector<PlannedStep> steps = planned_steps(sc, tokens);
  ReplaySample r;
  r.seed = replay_seed(sc, spec);
  r.total = static_cast<int64_t>(steps.size());
  std::set<int64_t> required;
  std::map<size_t, std::vector<int64_t>> by_event;
  for (const PlannedStep& s : steps) by_event[s.event].push_back(s.step);
  for (const auto& [e, list] : by_event) {
    const Event& ev = sc.events[e];
    if (ev.kind == Event::kPrompt) {
      required.insert(list.front());
      required.insert(list.back());
    } else if (ev.kind == Event::kDecode || ev.kind == Event::kSpeculate) {
      required.insert(list.front());
    } else {
      required.insert(list.front());
      // The resumption's first step: the next step of the same session.
      for (const PlannedStep& s : steps) {
        if (s.step > list.front() && s.session == ev.session) {
          required.insert(s.step);
          break;
        }
      }
    }
  }
  std::vector<int64_t> rest;
  for (const PlannedStep& s : steps) {
    if (!required.count(s.step)) rest.push_back(s.step);
  }
  const size_t draw = static_cast<size_t>(std::min<int64_t>(spec.extra, static_cast<int64_t>(rest.size())));
  uint64_t state = r.seed;
  for (size_t i = 0; i < draw; ++i) {
    const size_t j = i + static_cast<size_t>(splitmix64(state) % static_cast<uint64_t>(rest.size() - i));
    std::swap(rest[i], rest[j]);
  }
  r.required.assign(required.begin(), required.end());
  std::set<int64_t> all = required;
  all.insert(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(draw));
  r.steps.assign(all.begin(), all.end());
  return r;
}

std::string step_ranges(const std::vector<int64_t>& steps) {
  std::ostringstream s;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    if (i > 0) s << ", ";
    s << steps[i];
    if (j > i) s << "-" << steps[j];
    i = j + 1;
  }
  return s.str();
}

}  // namespace dsv41::scenarios::runner
