// `dsv41 weights`: writes deterministic random weights for a config in the official checkpoint
// format (reference/checkpoint/weights.h), or checks that a weights file fits a config.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "base/error.h"
#include "reference/ops/config.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/ops/tensor.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {

CLI::Option* seed_option(CLI::Option* option) {
  const std::string name = option->get_name();
  return option->check(CLI::Validator(
      [name](std::string& text) -> std::string {
        const bool digits = !text.empty() && text.size() <= 20 &&
                            text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (text.size() < 20 || text <= "18446744073709551615")) return {};
        return "a seed is a decimal integer from 0 to 2^64-1, got '" + text + "'";
      },
      "SEED", "seed"));
}

CLI::Option* finite_option(CLI::Option* option, double lo, double hi, bool lo_open) {
  const std::string name = option->get_name();
  return option->check(CLI::Validator(
      [lo, hi, lo_open](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size() && errno == 0;
        // NaN passes every comparison CLI::Range makes; it is refused here, with the infinities.
        if (number && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi) return {};
        std::ostringstream want;
        want << "a finite number " << (lo_open ? "above " : "from ") << lo << (lo_open ? " and at most " : " to ") << hi
             << ", got '" << text << "'";
        return want.str();
      },
      "NUMBER", "finite"));
}

Verb add_weights_verb(CLI::App& parent) {
  struct Args {
    std::string config, output, check;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("weights", "generate seeded random weights (official format) or check a weights file");
  app->add_option("--config", a->config, "config.json path or preset (tiny, full)")->required();
  seed_option(app->add_option("--seed", a->seed, "generator seed (printed; default 0)"));
  app->add_option("-o,--output", a->output, "write generated weights to this safetensors file");
  app->add_option("--check", a->check, "load this safetensors file and check every tensor against the config");
  return {app, [a] {
            if (a->check.empty() && a->output.empty()) {
              DSV41_FAIL("weights: give -o FILE to generate weights or --check FILE to check a file");
            }
            // The generated file never replaces the config (base/output_file.h, VerbFiles); `-o W
            // --check W` checks what was just written.
            output::VerbFiles().input(a->config, "config (--config)").output(a->output, "weights (-o)").check();
            const reference::ModelConfig c = reference::load_config(a->config);
            // Generate first, so "-o W --check W" checks what was just written.
            if (!a->output.empty()) {
              // The generator builds every tensor in memory: refuse sizes this tool cannot hold
              // (the released config is about 512 GB) instead of exhausting memory.
              int64_t total = 0;
              for (const reference::checkpoint::TensorSpec& t : reference::checkpoint::expected_tensors(c)) {
                total += reference::stored_bytes(t.dtype, reference::Tensor<float>::count(t.shape));
              }
              constexpr int64_t kMaxGenerateBytes = int64_t{8} << 30;
              if (total > kMaxGenerateBytes) {
                DSV41_FAIL("weights: the weights of this config take ", total / 1000000, " MB; generating holds them in "
                           "memory, so the limit is ", kMaxGenerateBytes >> 20, " MiB (use a smaller config)");
              }
              std::cerr << "weights: seed " << a->seed << "\n";
              const std::map<std::string, std::string> meta = {
                  {"producer", "dsv41 weights"},
                  {"seed", std::to_string(a->seed)},
                  {"config_hash", reference::config_hash(c)}};
              reference::checkpoint::safetensors::write(a->output, reference::checkpoint::generate_weights(c, a->seed), meta);
              std::cout << "weights: wrote '" << a->output << "' (" << reference::checkpoint::expected_tensors(c).size()
                        << " tensors, seed " << a->seed << ")\n";
            }
            if (!a->check.empty()) {
              reference::checkpoint::ModelWeights::load(a->check, c);
              std::cout << "weights: '" << a->check << "' holds every tensor of the config ("
                        << reference::checkpoint::expected_tensors(c).size()
                        << " tensors), names, dtypes and shapes as expected\n";
            }
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
