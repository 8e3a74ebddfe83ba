// reference/ops/config_footprint.h
//
// A config's derived sizes, computed in closed form with overflow-checked 64-bit arithmetic
// (issue 35, class 5: sizes checked before anything is allocated). weight_bytes and n_tensors
// equal the sums over checkpoint::expected_tensors(c) (F32 head) without listing them (a config
// of 65536 layers x 65536 experts names 2^34 tensors); state_bytes is a lower bound of one
// sequence's caches (the window rings at 1 byte a value, the compressed KV and index-key caches
// at half a byte). validate() refuses a config past the limits below; check_fits_machine refuses
// one whose weights and state exceed this machine's physical memory, before they are allocated.
//
// Example:
//   const ConfigFootprint f = config_footprint(c, "config 'c.json'");   // throws on overflow
//   check_fits_machine(c, "config 'c.json'");
#pragma once

#include <cstdint>
#include <string>

#include "reference/ops/config.h"

namespace dsv41::reference {

struct ConfigFootprint {
  uint64_t n_tensors = 0;     // checkpoint tensors (weights and scales)
  uint64_t weight_bytes = 0;  // their stored bytes (F4 at half a byte, F32 head)
  uint64_t state_bytes = 0;   // at least this many bytes of caches per sequence
};

// Config limits on the derived sizes (docs/cli.md "Limits"): the full preset has ~10^5 tensors and
// under 2^40 bytes of weights.
inline constexpr uint64_t kMaxConfigTensors = uint64_t{1} << 20;
inline constexpr uint64_t kMaxConfigWeightBytes = uint64_t{1} << 44;  // 16 TiB
inline constexpr uint64_t kMaxConfigStateBytes = uint64_t{1} << 44;   // 16 TiB

// The derived sizes; throws "<source>: derived weight bytes overflow 64 bits" on overflow. Needs the
// per-field limits and list checks of validate() to have passed (layer ids in range).
ConfigFootprint config_footprint(const ModelConfig& c, const std::string& source);

// Throws "<source>: weights (N bytes) and the caches of one sequence (M bytes) need X bytes, more
// than this machine's physical memory (P bytes)" before a model of this config is allocated.
void check_fits_machine(const ModelConfig& c, const std::string& source);

}  // namespace dsv41::reference
