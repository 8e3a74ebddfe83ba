// `dsv41 bytes --config FILE|PRESET [--json]`: the KV-state byte accounting of a config
// (reference/session/byte_accounting.h) as a table or as JSON (fields in docs/bytes.md).
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "formats/cache_format.h"
#include "reference/session/byte_accounting.h"
#include "reference/ops/config.h"
#include "scenarios/cli/cli.h"

namespace dsv41::scenarios::cli {
namespace {

using reference::session::ByteAccounting;
using reference::session::OwnerBytes;
using reference::session::Rational;

constexpr int64_t kMillionTokens = 1000000;
constexpr double kMB = 1e6;
constexpr double kMiB = 1024.0 * 1024.0;

struct BytesOptions {
  std::string config;
  bool json = false;
};

// "2-7, 9, 11-12"
std::string ranges(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

// "178" or "118.667 (356/3)"
std::string exact(const Rational& r) {
  if (r.den == 1) return r.str();
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << r.value() << " (" << r.str() << ")";
  return os.str();
}

std::string fixed3(double v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << v;
  return os.str();
}

nlohmann::ordered_json number(const Rational& r) {
  return r.den == 1 ? nlohmann::ordered_json(r.num) : nlohmann::ordered_json(r.value());
}

void print_table(const reference::ModelConfig& c, const std::string& source,
                 const ByteAccounting& b, std::ostream& out) {
  using formats::CacheFormat;
  out << "dsv41 bytes: config " << source << " (hash " << reference::config_hash(c) << ")\n\n"
      << "Global KV cache (persistent, grows with the sequence): one owner per kv source layer\n"
      << "  main KV " << formats::info(CacheFormat::kCompressedKvFp4).name << " (head_dim " << c.head_dim
      << "), index keys " << formats::info(CacheFormat::kIndexKeysFp4).name << " (index_head_dim "
      << c.index_head_dim << ")\n\n";
  const auto row = [&out](const std::string& owner, const std::string& ratio,
                          const std::string& readers, const std::string& main,
                          const std::string& index, const std::string& entry,
                          const std::string& per_token) {
    out << "  " << std::setw(5) << owner << "  " << std::setw(5) << ratio << "  " << std::left
        << std::setw(16) << readers << std::right << std::setw(7) << main << "  " << std::setw(7)
        << index << "  " << std::setw(7) << entry << "  " << per_token << "\n";
  };
  row("owner", "ratio", "read by layers", "main B", "index B", "B/entry", "B/token");
  for (const OwnerBytes& o : b.owners) {
    row(std::to_string(o.layer), std::to_string(o.ratio), ranges(o.reader_layers),
        std::to_string(o.main_entry_bytes), std::to_string(o.index_entry_bytes),
        std::to_string(o.entry_bytes), exact(o.bytes_per_token));
  }
  out << "  global bytes per token: " << exact(b.global_bytes_per_token) << "\n"
      << "  (as bf16 caches, the official code's storage: " << exact(b.bf16_bytes_per_token)
      << " B/token)\n\n";

  const int64_t million = reference::session::global_bytes_for_tokens(b, kMillionTokens);
  out << "1M tokens (10^6): " << million << " B = " << fixed3(million / kMB)
      << " MB (10^6 B) = " << fixed3(million / kMiB) << " MiB (2^20 B)\n\n"
      << "Per-session constant state\n"
      << "  compressor partial groups (persistent): " << b.compressor_partial_bytes_per_session
      << " B = sum over ratio>1 owners of (ratio-1) x " << c.head_dim
      << " x 2 (kv, score) x 4 B (fp32)\n"
      << "  SWA rings (local state, outside the global store; bounded replay recomputes them): "
      << b.window_kv_bytes_per_session << " B = " << b.window_kv_layers << " layers x " << b.window_kv_slots
      << " slots x " << b.window_kv_entry_bytes << " B ("
      << formats::info(CacheFormat::kWindowKvFp8).name << ") = "
      << fixed3(b.window_kv_bytes_per_session / kMB) << " MB = "
      << fixed3(b.window_kv_bytes_per_session / kMiB) << " MiB\n";
}

void print_json(const reference::ModelConfig& c, const std::string& source,
                const ByteAccounting& b, std::ostream& out) {
  using nlohmann::ordered_json;
  ordered_json owners = ordered_json::array();
  for (const OwnerBytes& o : b.owners) {
    owners.push_back({{"layer", o.layer},
                      {"ratio", o.ratio},
                      {"reader_layers", o.reader_layers},
                      {"main_entry_bytes", o.main_entry_bytes},
                      {"index_entry_bytes", o.index_entry_bytes},
                      {"entry_bytes", o.entry_bytes},
                      {"bytes_per_token", number(o.bytes_per_token)},
                      {"bytes_per_token_exact", o.bytes_per_token.str()},
                      {"partial_state_bytes", o.partial_state_bytes}});
  }
  const int64_t million = reference::session::global_bytes_for_tokens(b, kMillionTokens);
  const ordered_json j = {
      {"config", source},
      {"config_hash", reference::config_hash(c)},
      {"global_bytes_per_token", number(b.global_bytes_per_token)},
      {"global_bytes_per_token_exact", b.global_bytes_per_token.str()},
      {"bf16_bytes_per_token", number(b.bf16_bytes_per_token)},
      {"per_owner", owners},
      {"tokens_1m",
       {{"tokens", kMillionTokens},
        {"bytes", million},
        {"mb", million / kMB},
        {"mib", million / kMiB}}},
      {"compressor_partial_bytes_per_session", b.compressor_partial_bytes_per_session},
      {"window_kv",
       {{"layers", b.window_kv_layers},
        {"window_size", b.window_kv_slots},
        {"entry_bytes", b.window_kv_entry_bytes}}},
      {"window_kv_bytes_per_session", b.window_kv_bytes_per_session}};
  out << j.dump(2) << "\n";
}

}  // namespace

Verb add_bytes_verb(CLI::App& parent) {
  auto opts = std::make_shared<BytesOptions>();
  CLI::App* app = parent.add_subcommand(
      "bytes", "KV-cache bytes per token (global) and per session (SWA, compressor state)");
  app->add_option("--config", opts->config, "config file, or a preset: tiny, full")->required();
  app->add_flag("--json", opts->json, "print one JSON object (fields in docs/bytes.md)");
  return {app, [opts] {
            const reference::ModelConfig c = reference::load_config(opts->config);
            const ByteAccounting b = reference::session::byte_accounting(c);
            if (opts->json) {
              print_json(c, opts->config, b, std::cout);
            } else {
              print_table(c, opts->config, b, std::cout);
            }
            return runner::kExitOk;
          }};
}

}  // namespace dsv41::scenarios::cli
