// `dsv41 layer-config`: the config of one released layer kind (scenarios/runner/layer_kinds.h,
// docs/released-dims.md), derived from a base config, written as config.json.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "base/error.h"
#include "base/output_file.h"
#include "reference/ops/config.h"
#include "scenarios/cli/cli.h"
#include "scenarios/runner/layer_kinds.h"

namespace dsv41::scenarios::cli {

Verb add_layer_config_verb(CLI::App& parent) {
  struct Args {
    std::string base = "full", kind, output;
    bool list = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "layer-config", "the config of one layer kind of the released schedule at a base config's dims");
  app->add_option("--base", a->base, "config.json path or preset the dims come from (default: full)");
  app->add_option("--kind", a->kind, "swa, full2, full1, reuse2, reuse1, reindex, engram or dspark");
  app->add_option("-o,--output", a->output, "write the derived config.json here");
  app->add_flag("--list", a->list, "list the kinds, then exit");
  return {app, [a] {
            if (a->list) {
              for (const runner::LayerKind& k : runner::layer_kinds()) {
                std::cout << std::left << std::setw(8) << k.name << " layer " << k.target << ": " << k.what
                          << " (released layers " << k.released_layers << ")\n";
              }
              return runner::kExitOk;
            }
            DSV41_CHECK(!a->kind.empty(), "layer-config: give --kind KIND (--list shows the kinds)");
            const runner::LayerKind& kind = runner::layer_kind(a->kind);
            // The output never replaces the base (base/output_file.h, VerbFiles).
            output::VerbFiles().input(a->base, "base config (--base)").output(a->output, "layer config (-o)").check();
            const reference::ModelConfig base = reference::load_config(a->base);
            const reference::ModelConfig c = runner::kind_config(base, kind, "'" + a->base + "'");
            const runner::WeightBytes packed = runner::weight_bytes(c, true), plain = runner::weight_bytes(c, false);
            std::ostringstream line;
            line.setf(std::ios::fixed);
            line.precision(2);
            line << "layer-config: kind " << kind.name << " of '" << a->base << "': " << c.total_layers()
                 << " layer(s), layer " << kind.target << " " << kind.what << " (released layers "
                 << kind.released_layers << "); weights " << packed.file / 1e9 << " GB in the file, held "
                 << plain.held / 1e9 << " GB as fp32 values, " << packed.held / 1e9
                 << " GB with packed F4 (--packed-experts), config hash " << reference::config_hash(c) << "\n";
            std::cerr << line.str();
            const std::string json = reference::to_json_string(c) + "\n";
            if (a->output.empty()) {
              std::cout << json;
            } else {
              output::write_file_atomically(a->output, "layer config", json.data(), json.size());
              std::cout << "layer-config: wrote '" << a->output << "'\n";
            }
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
