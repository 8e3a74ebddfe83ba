// reference/session/byte_accounting.h
//
// How many bytes the KV state of one session takes, derived from a ModelConfig and the entry
// sizes of formats/cache_format.h (nothing here is a hard-coded byte count).
//
//   global (persistent, grows with the sequence): each kv-source layer ("owner") with ratio r
//     stores one main KV entry (kCompressedKvFp4, head_dim) and one index-key entry (kIndexKeysFp4,
//     index_head_dim) per r tokens; every other compressed layer reads an owner's caches.
//     bytes/token = sum over owners of (main + index) / r, an exact rational.
//     Released config: (3/2 + 1) x (288 + 68) = 890 B/token.
//   compressor partial groups (persistent, constant per session): a ratio-r owner with r > 1
//     carries up to r - 1 pending tokens of kv and score, head_dim fp32 each.
//   SWA rings (constant per session, NOT persisted: bounded replay recomputes them): every
//     backbone layer and DSpark block keeps window_size slots of kWindowKvFp8(head_dim) entries.
//
// Example:
//   ByteAccounting b = byte_accounting(load_config("full"));
//   b.global_bytes_per_token.num == 890 && b.global_bytes_per_token.den == 1
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/ops/config.h"

namespace dsv41::reference::session {

// An exact non-negative fraction num/den in lowest terms (den > 0).
struct Rational {
  int64_t num = 0;
  int64_t den = 1;

  static Rational of(int64_t num, int64_t den);  // normalizes; throws on den <= 0
  Rational operator+(const Rational& o) const;
  bool operator==(const Rational&) const = default;
  double value() const { return static_cast<double>(num) / static_cast<double>(den); }
  std::string str() const;  // "890" or "356/3"
};

struct OwnerBytes {
  int layer = 0;                  // the kv source layer
  int ratio = 0;                  // tokens per entry
  int main_entry_bytes = 0;       // entry_bytes(kCompressedKvFp4, head_dim)
  int index_entry_bytes = 0;      // entry_bytes(kIndexKeysFp4, index_head_dim)
  int entry_bytes = 0;            // main + index
  Rational bytes_per_token;       // entry_bytes / ratio
  std::vector<int> reader_layers;  // layers reading this owner's caches (itself included)
  int64_t partial_state_bytes = 0;  // (ratio - 1) x head_dim x 2 (kv, score) x fp32
};

struct ByteAccounting {
  std::vector<OwnerBytes> owners;     // in layer order
  Rational global_bytes_per_token;    // sum of the owners' bytes_per_token
  Rational bf16_bytes_per_token;      // the same caches stored as bf16 (the official code)
  int64_t compressor_partial_bytes_per_session = 0;  // sum of the owners' partial_state_bytes
  int window_kv_layers = 0;                 // n_layers + n_mtp_layers rings
  int window_kv_slots = 0;                 // window_size slots per ring
  int window_kv_entry_bytes = 0;            // entry_bytes(kWindowKvFp8, head_dim)
  int64_t window_kv_bytes_per_session = 0;  // window_kv_layers x window_kv_slots x window_kv_entry_bytes
};

ByteAccounting byte_accounting(const ModelConfig& c);

// Exact bytes stored in the global caches after `tokens` tokens: complete groups only,
// sum over owners of floor(tokens / ratio) x entry_bytes.
int64_t global_bytes_for_tokens(const ByteAccounting& b, int64_t tokens);

}  // namespace dsv41::reference::session
