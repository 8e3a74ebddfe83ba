// reports/report_replay.cc: the sampled-replay and per-side tables (reports/internal/report_replay.h).
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "reports/internal/report_replay.h"

namespace dsv41::reports {
namespace {

std::string join_steps(const std::vector<int64_t>& steps) {
  std::ostringstream s;
  for (size_t i = 0; i < steps.size(); ++i) s << (i ? "," : "") << steps[i];
  return s.str();
}

std::vector<int64_t> split_steps(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSV41_CHECK(used == part.size() && v >= 0, where, ": '", part, "' is not a step index");
    out.push_back(v);
  }
  return out;
}

std::string gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

void write_replay_tables(H5Writer& w, const RunReport& r) {
  std::vector<std::string> scen, checked, sscen, side, spec;
  std::vector<int64_t> index, total, count, sindex, peak, in_use;
  std::vector<uint64_t> seed;
  std::vector<double> seconds;
  for (const ScenarioResult& s : r.scenarios) {
    for (size_t c = 0; c < s.comparisons.size(); ++c) {
      const Comparison& cmp = s.comparisons[c];
      if (cmp.replay) {
        scen.push_back(s.name);
        index.push_back(static_cast<int64_t>(c));
        seed.push_back(cmp.replay->seed);
        total.push_back(cmp.replay->steps_total);
        count.push_back(static_cast<int64_t>(cmp.replay->steps_checked.size()));
        checked.push_back(join_steps(cmp.replay->steps_checked));
      }
      for (const SideMeasure& m : cmp.sides) {
        sscen.push_back(s.name);
        sindex.push_back(static_cast<int64_t>(c));
        side.push_back(m.side);
        spec.push_back(m.spec);
        seconds.push_back(m.seconds);
        peak.push_back(m.peak_device_bytes);
        in_use.push_back(m.device_in_use_bytes);
      }
    }
  }
  if (!scen.empty()) {
    w.write_columns(kReplayTable, {{"scenario", scen}, {"comparison", index}, {"seed", seed}, {"steps_total", total},
                                   {"steps_checked", count}, {"checked", checked}});
  }
  if (!sscen.empty()) {
    w.write_columns(kSidesTable, {{"scenario", sscen}, {"comparison", sindex}, {"side", side}, {"spec", spec},
                                  {"seconds", seconds}, {"peak_device_bytes", peak},
                                  {"device_in_use_bytes", in_use}});
  }
}

void read_replay_tables(const H5Reader& r, RunReport& report) {
  std::map<std::pair<std::string, int64_t>, Comparison*> by_key;
  for (ScenarioResult& s : report.scenarios) {
    for (size_t c = 0; c < s.comparisons.size(); ++c) by_key[{s.name, static_cast<int64_t>(c)}] = &s.comparisons[c];
  }
  const std::string t = kReplayTable;
  if (r.kind(t) != H5Reader::Kind::kMissing) {
    const std::vector<std::string> scen = r.read_strings(t + "/scenario"), checked = r.read_strings(t + "/checked");
    const std::vector<int64_t> index = r.read_ints(t + "/comparison"), total = r.read_ints(t + "/steps_total");
    const std::vector<uint64_t> seed = r.read_uints(t + "/seed");
    const size_t n = scen.size();
    DSV41_CHECK(index.size() == n && total.size() == n && seed.size() == n && checked.size() == n, "'", r.path(),
                "': ", t, ": columns of different lengths");
    for (size_t i = 0; i < n; ++i) {
      const auto it = by_key.find({scen[i], index[i]});
      DSV41_CHECK(it != by_key.end(), "'", r.path(), "': ", t, " row ", i, " names no comparison of the report");
      it->second->replay = ReplayRecord{seed[i], total[i], split_steps(checked[i], t + "/checked")};
    }
  }
  const std::string v = kSidesTable;
  if (r.kind(v) != H5Reader::Kind::kMissing) {
    const std::vector<std::string> scen = r.read_strings(v + "/scenario"), side = r.read_strings(v + "/side"),
                                   spec = r.read_strings(v + "/spec");
    const std::vector<int64_t> index = r.read_ints(v + "/comparison"), peak = r.read_ints(v + "/peak_device_bytes"),
                               in_use = r.read_ints(v + "/device_in_use_bytes");
    const std::vector<double> seconds = r.read_doubles(v + "/seconds");
    const size_t n = scen.size();
    DSV41_CHECK(side.size() == n && spec.size() == n && index.size() == n && peak.size() == n && in_use.size() == n &&
                    seconds.size() == n,
                "'", r.path(), "': ", v, ": columns of different lengths");
    for (size_t i = 0; i < n; ++i) {
      const auto it = by_key.find({scen[i], index[i]});
      DSV41_CHECK(it != by_key.end(), "'", r.path(), "': ", v, " row ", i, " names no comparison of the report");
      it->second->sides.push_back(SideMeasure{side[i], spec[i], seconds[i], peak[i], in_use[i]});
    }
  }
}

std::vector<std::string> replay_lines(const Comparison& c) {
  std::vector<std::string> out;
  if (c.replay) {
    std::ostringstream s;
    s << "sampled replay (seed " << c.replay->seed << "): " << c.replay->steps_checked.size() << " of "
      << c.replay->steps_total << " steps checked (" << join_steps(c.replay->steps_checked)
      << "); the others neither pass nor fail";
    out.push_back(s.str());
  }
  for (const SideMeasure& m : c.sides) {
    std::ostringstream s;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f", m.seconds);
    s << "side " << m.side << " (" << m.spec << "): " << secs << " s";
    if (m.peak_device_bytes >= 0) {
      s << ", peak device allocations " << gib(m.peak_device_bytes) << ", device memory in use (max at a step's end) "
        << gib(m.device_in_use_bytes);
    } else {
      s << ", no device memory (a host side)";
    }
    out.push_back(s.str());
  }
  return out;
}

}  // namespace dsv41::reports
