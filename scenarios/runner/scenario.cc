#include "base/json_keys.h"
#include "base/json_limits.h"
#include "scenarios/runner/scenario.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/input_file.h"
#include "base/json_context.h"
#include "reference/model/speculative.h"
#include "scenarios/runner/backend.h"

namespace dsv41::scenarios::runner {
namespace {

using nlohmann::json;

// Checks that an object has only the given keys (a typo never silently does nothing).
void only_keys(const json& j, const std::string& where, const std::set<std::string>& keys) {
  DSV41_CHECK(j.is_object(), where, ": must be a JSON object, got ", j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (keys.count(it.key()) == 0) {
      std::string known;
      for (const std::string& k : keys) known += (known.empty() ? "" : ", ") + k;
      DSV41_FAIL(where, ": unknown key '", it.key(), "' (known: ", known, ")");
    }
  }
}

// The most tokens, steps or rounds one count of a scenario may ask for (docs/cli.md "Limits"):
// 2^20, the longest context of any DeepSeek-V4 config; checked before anything is allocated.
constexpr int64_t kMaxScenarioCount = int64_t{1} << 20;

// A bounded excerpt of a JSON value for a message: never the whole of a large value.
std::string excerpt(const json& j) {
  if (j.is_array()) return "an array of " + std::to_string(j.size()) + " elements";
  if (j.is_object()) return "an object of " + std::to_string(j.size()) + " keys";
  std::string s = j.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

int64_t positive(const json& j, const std::string& where, bool allow_zero = false) {
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(kMaxScenarioCount)) {
    DSV41_FAIL(where, ": must be at most ", kMaxScenarioCount, ", got ", j.get<uint64_t>());
  }
  DSV41_CHECK(j.is_number_integer(), where, ": must be an integer, got ", excerpt(j));
  const int64_t v = j.get<int64_t>();
  DSV41_CHECK(allow_zero ? v >= 0 : v > 0, where, ": must be ", allow_zero ? ">= 0" : "> 0", ", got ", v);
  DSV41_CHECK(v <= kMaxScenarioCount, where, ": must be at most ", kMaxScenarioCount, ", got ", v);
  return v;
}

std::string text(const json& j, const std::string& where) {
  DSV41_CHECK(j.is_string(), where, ": must be a string, got ", excerpt(j));
  return j.get<std::string>();
}

std::vector<TokenSegment> parse_segments(const json& j, const std::string& where) {
  std::vector<TokenSegment> out;
  DSV41_CHECK(j.is_array() && !j.empty(), where, ": must be a non-empty array of token segments");
  std::vector<int64_t> literal;
  const auto flush = [&] {
    if (literal.empty()) return;
    TokenSegment s;
    s.kind = TokenSegment::kLiteral;
    s.ids = std::move(literal);
    literal.clear();
    out.push_back(std::move(s));
  };
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const json& e = j[i];
    if (e.is_number_integer()) {
      const int64_t id = e.get<int64_t>();
      DSV41_CHECK(id >= 0, w, ": a token id must be >= 0, got ", id);
      literal.push_back(id);
      continue;
    }
    flush();
    TokenSegment s;
    DSV41_CHECK(e.is_object(), w, ": must be a token id or an object ({\"random\": n}, {\"span\": name}, "
                "{\"near\": name, \"change\": k})");
    if (e.contains("random")) {
      only_keys(e, w, {"random"});
      s.kind = TokenSegment::kRandom;
      s.count = positive(e["random"], w + ".random");
    } else if (e.contains("span")) {
      only_keys(e, w, {"span"});
      s.kind = TokenSegment::kSpan;
      s.span = text(e["span"], w + ".span");
    } else if (e.contains("near")) {
      only_keys(e, w, {"near", "change"});
      s.kind = TokenSegment::kNear;
      s.span = text(e["near"], w + ".near");
      s.count = e.contains("change") ? positive(e["change"], w + ".change") : 1;
    } else {
      DSV41_FAIL(w, ": a segment needs one of random, span, near");
    }
    out.push_back(std::move(s));
  }
  flush();
  return out;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SpeculateSpec parse_speculate(const json& e, const std::string& w) {
  SpeculateSpec sp;
  sp.rounds = positive(e["speculate"], w + ".speculate");
  if (e.contains("policy")) {
    sp.policy = text(e["policy"], w + ".policy");
    try {
      reference::model::VerifyPolicy::parse(sp.policy);
    } catch (const Error& err) {
      DSV41_FAIL(w, ".policy: ", err.what());
    }
  }
  if (e.contains("drafts")) {
    const std::string d = text(e["drafts"], w + ".drafts");
    if (d == "dspark") {
      sp.drafter = SpeculateSpec::kDSpark;
    } else if (d.rfind("lookahead:", 0) == 0) {
      sp.drafter = SpeculateSpec::kLookahead;
      size_t used = 0;
      try {
        sp.lookahead = std::stoll(d.substr(10), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      DSV41_CHECK(used == d.size() - 10 && used > 0 && sp.lookahead >= 1 && sp.lookahead <= 64, w,
                  ".drafts: lookahead:N needs N in [1, 64], got '", d, "'");
      DSV41_CHECK(reference::model::VerifyPolicy::parse(sp.policy).kind == reference::model::VerifyPolicy::Kind::kFixed, w,
                  ": lookahead drafts have no confidence: the policy must be fixed:K, got ", sp.policy);
    } else {
      DSV41_FAIL(w, ".drafts: '", d, "' is not dspark or lookahead:N");
    }
  }
  if (e.contains("reject_at")) {
    DSV41_CHECK(e["reject_at"].is_array() && !e["reject_at"].empty(), w, ".reject_at: must be a non-empty array");
    for (const json& r : e["reject_at"]) {
      DSV41_CHECK(r.is_number_integer() && r.get<int64_t>() >= -1, w, ".reject_at: entries are draft indices >= 0 "
                  "or -1 (none), got ", r.dump());
      sp.reject_at.push_back(r.get<int64_t>());
    }
  }
  if (e.contains("temperature")) {
    DSV41_CHECK(e["temperature"].is_number() && e["temperature"].get<double>() >= 0, w, ".temperature: must be >= 0");
    sp.temperature = e["temperature"].get<double>();
  }
  if (e.contains("top_p")) {
    DSV41_CHECK(e["top_p"].is_number() && e["top_p"].get<double>() > 0 && e["top_p"].get<double>() <= 1, w,
                ".top_p: must be in (0, 1]");
    sp.top_p = e["top_p"].get<double>();
  }
  DSV41_CHECK(sp.temperature > 0 || sp.top_p == 1, w, ": top_p applies to sampling (temperature > 0)");
  DSV41_CHECK(sp.temperature == 0 || sp.drafter == SpeculateSpec::kDSpark, w,
              ": sampling needs the draft distributions: drafts must be dspark");
  return sp;
}

}  // namespace

uint64_t stream_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return seed ^ h;
}

const char* name(CachePath p) {
  switch (p) {
    case CachePath::kCold: return "cold";
    case CachePath::kFull: return "full";
    case CachePath::kGlobal: return "global";
    case CachePath::kDecoder: return "decoder";
    case CachePath::kAlone: return "alone";
  }
  return "?";
}

std::string Side::text() const {
  std::string s = backend + "@" + name(path);
  if (path == CachePath::kDecoder) {
    s += ':';
    s += std::to_string(decoder_rows);
  }
  return plain ? s + "/plain" : s;
}

Side parse_side(const std::string& given) {
  DSV41_CHECK(!given.empty(), "side: empty (expected <backend>[@<cache path>][/plain], e.g. ref@global)");
  Side s;
  std::string spec = given;
  if (spec.size() > 6 && spec.compare(spec.size() - 6, 6, "/plain") == 0) {
    s.plain = true;
    spec.resize(spec.size() - 6);
  }
  const size_t at = spec.find('@');
  s.backend = spec.substr(0, at);
  validate_backend_name(s.backend);
  if (at == std::string::npos) return s;
  const std::string p = spec.substr(at + 1);
  if (p == "cold") {
    s.path = CachePath::kCold;
  } else if (p == "full") {
    s.path = CachePath::kFull;
  } else if (p == "global") {
    s.path = CachePath::kGlobal;
  } else if (p == "alone") {
    s.path = CachePath::kAlone;
  } else if (p.rfind("decoder:", 0) == 0) {
    s.path = CachePath::kDecoder;
    const std::string n = p.substr(8);
    size_t used = 0;
    try {
      s.decoder_rows = std::stoll(n, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSV41_CHECK(used == n.size() && !n.empty() && s.decoder_rows > 0, "side '", spec,
                "': decoder:N needs a positive row count N, got '", n, "'");
  } else {
    DSV41_FAIL("side '", spec, "': unknown cache path '", p, "' (cold, full, global, decoder:N, alone)");
  }
  return s;
}

// A pair's "replay": {"extra": K, "seed": S} (both optional; docs/scale.md).
static ReplaySpec parse_replay(const json& r, const std::string& where) {
  DSV41_CHECK(r.is_object(), where, ": must be an object {\"extra\": K, \"seed\": S}, got ", excerpt(r));
  only_keys(r, where, {"extra", "seed"});
  ReplaySpec spec;
  if (r.contains("extra")) spec.extra = positive(r["extra"], where + ".extra", /*allow_zero=*/true);
  if (r.contains("seed")) {
    DSV41_CHECK(r["seed"].is_number_unsigned() || (r["seed"].is_number_integer() && r["seed"].get<int64_t>() >= 0),
                where, ".seed: must be a non-negative integer");
    spec.seed = r["seed"].get<uint64_t>();
  }
  return spec;
}

Scenario parse_scenario(const std::string& json_text, const std::string& source) {
  const std::string where = "scenario '" + source + "'";
  json j;
  dsv41::check_json_nesting(json_text, where);
  try {
    j = dsv41::parse_json_without_duplicates(json_text, where);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 4e866
    DSV41_FAIL(where, ": not valid JSON: ", e.what());
  }
  only_keys(j, where, {"name", "kind", "description", "seed", "spans", "events", "pairs", "modes", "tolerances",
                       "default_tolerances", "notes", "check_bytes"});
  Scenario s;
  s.source = source;
  DSV41_CHECK(j.contains("name"), where, ": needs a name");
  s.name = text(j["name"], where + ".name");
  DSV41_CHECK(!s.name.empty() && s.name.find_first_of("/ \t") == std::string::npos, where,
              ": name '", s.name, "' must be non-empty without '/' or spaces");
  s.kind = j.contains("kind") ? text(j["kind"], where + ".kind") : "custom";
  s.description = j.contains("description") ? text(j["description"], where + ".description") : "";
  if (j.contains("seed")) {
    DSV41_CHECK(j["seed"].is_number_unsigned() || (j["seed"].is_number_integer() && j["seed"].get<int64_t>() >= 0),
                where, ".seed: must be a non-negative integer");
    s.seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("notes")) {
    DSV41_CHECK(j["notes"].is_array(), where, ".notes: must be an array of strings");
    for (size_t i = 0; i < j["notes"].size(); ++i) s.notes.push_back(text(j["notes"][i], where + ".notes"));
  }
  if (j.contains("spans")) {
    DSV41_CHECK(j["spans"].is_object(), where, ".spans: must be an object of name -> segments");
    for (auto it = j["spans"].begin(); it != j["spans"].end(); ++it) {
      const std::string w = where + ".spans." + it.key();
      json segs = it.value().is_array() ? it.value() : json::array({it.value()});
      s.spans[it.key()] = parse_segments(segs, w);
      for (const TokenSegment& seg : s.spans[it.key()]) {
        DSV41_CHECK(seg.kind == TokenSegment::kLiteral || seg.kind == TokenSegment::kRandom, w,
                    ": a span is made of token ids and random segments only");
      }
    }
  }
  DSV41_CHECK(j.contains("events") && j["events"].is_array() && !j["events"].empty(), where,
              ": needs a non-empty array 'events'");
  std::set<std::string> started;
  for (size_t i = 0; i < j["events"].size(); ++i) {
    const std::string w = where + ".events[" + std::to_string(i) + "]";
    const json& e = j["events"][i];
    only_keys(e, w, {"session", "prompt", "chunk", "decode", "resume", "probe", "speculate", "policy", "drafts",
                     "reject_at", "temperature", "top_p"});
    Event ev;
    if (e.contains("session")) ev.session = text(e["session"], w + ".session");
    const int kinds = e.contains("prompt") + e.contains("decode") + e.contains("resume") + e.contains("speculate");
    DSV41_CHECK(kinds == 1, w, ": needs exactly one of prompt, decode, resume, speculate");
    for (const char* key : {"policy", "drafts", "reject_at", "temperature", "top_p"}) {
      DSV41_CHECK(!e.contains(key) || e.contains("speculate"), w, ": ", key, " belongs to a speculate event");
    }
    if (e.contains("prompt")) {
      ev.kind = Event::kPrompt;
      ev.segments = parse_segments(e["prompt"], w + ".prompt");
      if (e.contains("chunk")) ev.chunk = positive(e["chunk"], w + ".chunk");
      started.insert(ev.session);
    } else if (e.contains("decode")) {
      ev.kind = Event::kDecode;
      ev.decode = positive(e["decode"], w + ".decode");
      DSV41_CHECK(started.count(ev.session), w, ": session '", ev.session, "' decodes before any prompt");
    } else if (e.contains("speculate")) {
      ev.kind = Event::kSpeculate;
      ev.speculate = parse_speculate(e, w);
      DSV41_CHECK(started.count(ev.session), w, ": session '", ev.session, "' speculates before any prompt");
    } else {
      ev.kind = Event::kResume;
      DSV41_CHECK(e["resume"].is_boolean() && e["resume"].get<bool>(), w, ".resume: must be true");
      DSV41_CHECK(started.count(ev.session), w, ": session '", ev.session, "' resumes before any prompt");
    }
    DSV41_CHECK(!e.contains("chunk") || ev.kind == Event::kPrompt, w, ": chunk belongs to a prompt event");
    if (e.contains("probe")) {
      DSV41_CHECK(e["probe"].is_boolean(), w, ".probe: must be true or false");
      DSV41_CHECK(ev.kind == Event::kPrompt || ev.kind == Event::kDecode, w, ": only prompt and decode events probe");
      ev.probe = e["probe"].get<bool>();
    }
    for (const TokenSegment& seg : ev.segments) {
      if (seg.kind == TokenSegment::kSpan || seg.kind == TokenSegment::kNear) {
        DSV41_CHECK(s.spans.count(seg.span), w, ": unknown span '", seg.span, "'");
      }
    }
    s.events.push_back(std::move(ev));
  }
  if (j.contains("pairs")) {
    DSV41_CHECK(j["pairs"].is_array(), where, ".pairs: must be an array");
    for (size_t i = 0; i < j["pairs"].size(); ++i) {
      const std::string w = where + ".pairs[" + std::to_string(i) + "]";
      const json& p = j["pairs"][i];
      only_keys(p, w, {"a", "b", "expect", "why", "replay"});
      DSV41_CHECK(p.contains("a") && p.contains("b") && p.contains("expect"), w, ": needs a, b and expect");
      Pair pair;
      pair.a = parse_side(text(p["a"], w + ".a"));
      pair.b = parse_side(text(p["b"], w + ".b"));
      const std::string ex = text(p["expect"], w + ".expect");
      if (ex == "bitexact") {
        pair.expect = judge::Expectation::kBitExact;
      } else if (ex == "tolerance") {
        pair.expect = judge::Expectation::kTolerance;
      } else if (ex == "measured") {
        pair.expect = judge::Expectation::kMeasured;
      } else {
        DSV41_FAIL(w, ".expect: '", ex, "' is not bitexact, tolerance or measured");
      }
      DSV41_CHECK(p.contains("why"), w, ": needs 'why': where the expectation comes from");
      pair.why = text(p["why"], w + ".why");
      if (p.contains("replay")) pair.replay = parse_replay(p["replay"], w + ".replay");
      s.pairs.push_back(std::move(pair));
    }
  }
  if (j.contains("modes")) {
    DSV41_CHECK(j["modes"].is_array() && !j["modes"].empty(), where, ".modes: must be a non-empty array");
    for (const json& m : j["modes"]) {
      const std::string v = text(m, where + ".modes");
      DSV41_CHECK(v == "free-running" || v == "teacher-forced", where, ".modes: '", v,
                  "' is not free-running or teacher-forced");
      s.modes.push_back(v);
    }
  } else {
    s.modes = {"free-running", "teacher-forced"};
  }
  if (j.contains("tolerances")) {
    DSV41_CHECK(j["tolerances"].is_array(), where, ".tolerances: must be an array");
    for (size_t i = 0; i < j["tolerances"].size(); ++i) {
      const std::string w = where + ".tolerances[" + std::to_string(i) + "]";
      const json& t = j["tolerances"][i];
      only_keys(t, w, {"component", "metric", "max", "min", "origin", "note"});
      judge::ToleranceRule r;
      DSV41_CHECK(t.contains("component") && t.contains("metric"), w, ": needs component and metric");
      r.component = text(t["component"], w + ".component");
      r.metric = text(t["metric"], w + ".metric");
      DSV41_CHECK(t.contains("max") != t.contains("min"), w, ": needs exactly one of max, min");
      const json& b = t.contains("max") ? t["max"] : t["min"];
      DSV41_CHECK(b.is_number(), w, ": the bound must be a number");
      r.tolerance.bound = b.get<double>();
      r.tolerance.higher_is_better = t.contains("min");
      r.tolerance.origin = t.contains("origin") ? text(t["origin"], w + ".origin") : "";
      DSV41_CHECK(r.tolerance.origin == "stated" || r.tolerance.origin == "analytic" || r.tolerance.origin == "measured",
                  w, ".origin: must be stated, analytic or measured (every tolerance records where it comes from)");
      DSV41_CHECK(t.contains("note"), w, ": needs a note saying where the number comes from");
      r.tolerance.note = text(t["note"], w + ".note");
      s.tolerances.push_back(std::move(r));
    }
  }
  if (j.contains("default_tolerances")) {
    DSV41_CHECK(j["default_tolerances"].is_boolean(), where, ".default_tolerances: must be true or false");
    s.default_tolerances = j["default_tolerances"].get<bool>();
  }
  if (j.contains("check_bytes")) {
    DSV41_CHECK(j["check_bytes"].is_boolean(), where, ".check_bytes: must be true or false");
    s.check_bytes = j["check_bytes"].get<bool>();
  }
  s.json = j.dump(2);
  return s;
}

Scenario load_scenario_file(const std::string& path) {
  const std::string text = input::read_text_file(path, "scenario file", input::kMaxScenarioBytes);
  // A field of the wrong type names the file (base/json_context.h), not "[json.exception...]".
  return json_context("scenario '" + path + "'", [&] { return parse_scenario(text, path); });
}

Scenario load_scenario(const std::string& name_or_path) {
  for (const std::string& n : builtin_scenario_names()) {
    if (n == name_or_path) return builtin_scenario(n);
  }
  if (name_or_path.find('/') == std::string::npos && name_or_path.find(".json") == std::string::npos) {
    std::string known;
    for (const std::string& n : builtin_scenario_names()) known += (known.empty() ? "" : ", ") + n;
    DSV41_FAIL("scenario '", name_or_path, "': not a built-in scenario (", known, ") nor a .json path");
  }
  return load_scenario_file(name_or_path);
}

TokenPlan plan_tokens(const Scenario& s, int64_t vocab) {
  DSV41_CHECK(vocab > 0, "plan_tokens: vocab must be > 0");
  TokenPlan plan;
  const auto random_ids = [&](const std::string& stream, int64_t n) {
    uint64_t st = stream_seed(s.seed, stream);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int64_t>(splitmix(st) % static_cast<uint64_t>(vocab)));
    return out;
  };
  const auto check_ids = [&](const std::vector<int64_t>& ids, const std::string& where) {
    for (int64_t id : ids) {
      DSV41_CHECK(id >= 0 && id < vocab, "scenario '", s.name, "': ", where, ": token ", id,
                  " is outside the vocab [0, ", vocab, ")");
    }
  };
  for (const auto& [name, segs] : s.spans) {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < segs.size(); ++i) {
      const std::vector<int64_t> part = segs[i].kind == TokenSegment::kLiteral
                                            ? segs[i].ids
                                            : random_ids("span:" + name + ":" + std::to_string(i), segs[i].count);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    check_ids(ids, "span '" + name + "'");
    plan.spans[name] = std::move(ids);
  }
  plan.prompts.resize(s.events.size());
  for (size_t e = 0; e < s.events.size(); ++e) {
    const Event& ev = s.events[e];
    if (ev.kind != Event::kPrompt) continue;
    std::vector<int64_t>& ids = plan.prompts[e];
    for (size_t i = 0; i < ev.segments.size(); ++i) {
      const TokenSegment& seg = ev.segments[i];
      const std::string stream = "event:" + std::to_string(e) + ":" + std::to_string(i);
      std::vector<int64_t> part;
      switch (seg.kind) {
        case TokenSegment::kLiteral: part = seg.ids; break;
        case TokenSegment::kRandom: part = random_ids(stream, seg.count); break;
        case TokenSegment::kSpan: part = plan.spans.at(seg.span); break;
        case TokenSegment::kNear: {
          part = plan.spans.at(seg.span);
          DSV41_CHECK(seg.count <= static_cast<int64_t>(part.size()), "scenario '", s.name, "': events[", e,
                      "]: near '", seg.span, "' changes ", seg.count, " of its ", part.size(), " tokens");
          uint64_t st = stream_seed(s.seed, stream);
          // Change `count` distinct tokens, each to another id (a near-duplicate, never the span).
          std::set<size_t> changed;
          while (static_cast<int64_t>(changed.size()) < seg.count) {
            const size_t at = static_cast<size_t>(splitmix(st) % part.size());
            if (!changed.insert(at).second) continue;
            const int64_t delta = 1 + static_cast<int64_t>(splitmix(st) % static_cast<uint64_t>(std::max<int64_t>(1, vocab - 1)));
            part[at] = (part[at] + delta) % vocab;
          }
          break;
        }
      }
      ids.insert(ids.end(), part.begin(), part.end());
    }
    check_ids(ids, "events[" + std::to_string(e) + "].prompt");
  }
  return plan;
}

}  // namespace dsv41::scenarios::runner
