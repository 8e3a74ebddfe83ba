// scenarios/conform/conform_forcing.cc
//
// Which of a dump's components are teacher-forced (scenarios/conform/conform_forcing.h): the
// dataflow and the chains are the judge's (scenarios/judge/order_variant.h).
#include "scenarios/conform/conform_forcing.h"

#include <algorithm>

namespace dsv41::scenarios::conform {

ForcingMap teacher_forcing(const PortDump& d) {
  const reference::ModelConfig& c = d.config;
  const std::vector<reference::LayerInfo> schedule = reference::layer_schedule(c);
  const auto held = [&](const judge::ForcingNode& n) {
    const auto it = d.components.find(n.first);
    return it != d.components.end() && std::find(it->second.begin(), it->second.end(), n.second) != it->second.end();
  };
  ForcingMap out;
  for (const auto& [component, layers] : d.components) {
    for (int layer : layers) out[{component, layer}] = judge::chain_forcing(c, schedule, component, layer, held);
  }
  return out;
}

std::vector<std::string> forcing_lines(const ForcingMap& f) {
  // Grouped per component and missing-input pattern: "attn_out layers 1-3: attn_in@L not in the dump".
  std::map<std::pair<std::string, std::string>, std::vector<int>> groups;
  for (const auto& [key, x] : f) {
    if (x.forced) continue;
    std::string why;
    for (const std::string& m : x.missing) {
      const size_t at = m.find('@');
      const std::string name = m.substr(0, at);
      if (why.find(name) == std::string::npos) why += (why.empty() ? "" : ", ") + name;
    }
    groups[{key.first, why}].push_back(key.second);
  }
  std::vector<std::string> lines;
  for (const auto& [key, layers] : groups) {
    std::string ls;
    for (size_t i = 0; i < layers.size();) {
      size_t k = i;
      while (k + 1 < layers.size() && layers[k + 1] == layers[k] + 1) ++k;
      if (!ls.empty()) ls += ", ";
      ls += std::to_string(layers[i]);
      if (k > i) {
        ls += '-';
        ls += std::to_string(layers[k]);
      }
      i = k + 1;
    }
    lines.push_back(key.first + (layers.size() == 1 && layers[0] < 0 ? " (model)" : " layers " + ls) +
                    ": not teacher-forced (inputs not in the dump: " + key.second + ")");
  }
  return lines;
}

}  // namespace dsv41::scenarios::conform
