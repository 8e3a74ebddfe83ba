// reports/report_items.cc: the work-item tables of a sweep report (reports/internal/report_items.h).
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "reports/h5_reader.h"
#include "reports/internal/report_items.h"

namespace dsv41::reports {

void validate_items(const RunReport& report) {
  std::set<std::string> scenarios, seen;
  for (const ScenarioResult& s : report.scenarios) scenarios.insert(s.name);
  for (const ItemMeta& m : report.meta.items) {
    DSV41_CHECK(scenarios.count(m.item), "report: /meta/items: item '", m.item, "' is not a scenario of the report");
    DSV41_CHECK(seen.insert(m.item).second, "report: /meta/items: item '", m.item, "' appears twice");
  }
}

void write_items(H5Writer& w, const std::vector<ItemMeta>& items) {
  if (items.empty()) return;
  std::vector<std::string> item, scenario, model, config_name, config_hash, weights, sha, sides, modes, host, gpu, exit;
  std::vector<uint64_t> seed;
  std::vector<double> cost, seconds;
  std::vector<int64_t> rank;
  for (const ItemMeta& m : items) {
    item.push_back(m.item);
    scenario.push_back(m.scenario);
    model.push_back(m.model);
    config_name.push_back(m.config_name);
    config_hash.push_back(m.config_hash);
    weights.push_back(m.weights);
    sha.push_back(m.weights_sha256);
    sides.push_back(m.sides);
    modes.push_back(m.modes);
    seed.push_back(m.seed);
    cost.push_back(m.estimated_cost);
    rank.push_back(m.rank);
    host.push_back(m.host);
    gpu.push_back(m.gpu);
    seconds.push_back(m.seconds);
    exit.push_back(m.exit);
  }
  // The orders of layout::item_columns() and layout::volatile_item_columns().
  w.write_columns(layout::kItems, {{"item", item}, {"scenario", scenario}, {"model", model},
                                   {"config_name", config_name}, {"config_hash", config_hash}, {"weights", weights},
                                   {"weights_sha256", sha}, {"sides", sides}, {"modes", modes}, {"seed", seed},
                                   {"estimated_cost", cost}});
  w.write_columns(layout::kVolatileItems, {{"item", item}, {"rank", rank}, {"host", host}, {"gpu", gpu},
                                           {"seconds", seconds}, {"exit", exit}});
}

std::vector<ItemMeta> read_report_items(const std::string& path) {
  const H5Reader r(path);
  if (r.kind(layout::kItems) == H5Reader::Kind::kMissing) return {};
  const auto column = [&](const char* group, const char* name) { return std::string(group) + "/" + name; };
  const std::vector<std::string> item = r.read_strings(column(layout::kItems, "item"));
  const size_t n = item.size();
  const auto strings = [&](const char* group, const char* name) {
    std::vector<std::string> v = r.read_strings(column(group, name));
    DSV41_CHECK(v.size() == n, "'", path, "': ", group, "/", name, ": ", v.size(), " rows, ", group, "/item ", n);
    return v;
  };
  const std::vector<std::string> scenario = strings(layout::kItems, "scenario"), model = strings(layout::kItems, "model"),
                                 config_name = strings(layout::kItems, "config_name"),
                                 config_hash = strings(layout::kItems, "config_hash"),
                                 weights = strings(layout::kItems, "weights"),
                                 sha = strings(layout::kItems, "weights_sha256"), sides = strings(layout::kItems, "sides"),
                                 modes = strings(layout::kItems, "modes");
  const std::vector<uint64_t> seed = r.read_uints(column(layout::kItems, "seed"));
  const std::vector<double> cost = r.read_doubles(column(layout::kItems, "estimated_cost"));
  const std::vector<std::string> vitem = strings(layout::kVolatileItems, "item"),
                                 host = strings(layout::kVolatileItems, "host"), gpu = strings(layout::kVolatileItems, "gpu"),
                                 exit = strings(layout::kVolatileItems, "exit");
  const std::vector<int64_t> rank = r.read_ints(column(layout::kVolatileItems, "rank"));
  const std::vector<double> seconds = r.read_doubles(column(layout::kVolatileItems, "seconds"));
  DSV41_CHECK(seed.size() == n && cost.size() == n && rank.size() == n && seconds.size() == n, "'", path,
              "': ", layout::kItems, ": columns of different lengths");
  std::vector<ItemMeta> out(n);
  for (size_t i = 0; i < n; ++i) {
    DSV41_CHECK(vitem[i] == item[i], "'", path, "': ", layout::kVolatileItems, "/item row ", i, " is '", vitem[i],
                "', ", layout::kItems, "/item '", item[i], "'");
    out[i] = {item[i], scenario[i], model[i], config_name[i], config_hash[i], weights[i], sha[i], sides[i], modes[i],
              seed[i], cost[i], rank[i], host[i], gpu[i], seconds[i], exit[i]};
  }
  return out;
}

}  // namespace dsv41::reports
