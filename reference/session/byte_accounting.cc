#include "reference/session/byte_accounting.h"

#include <numeric>

#include "formats/cache_format.h"
#include "base/error.h"

namespace dsv41::reference::session {

using formats::CacheFormat;
using formats::entry_bytes;

Rational Rational::of(int64_t num, int64_t den) {
  DSV41_CHECK(den > 0, "Rational needs a positive denominator, got ", num, "/", den);
  const int64_t g = std::gcd(num, den);
  return Rational{num / g, den / g};
}

Rational Rational::operator+(const Rational& o) const {
  return of(num * o.den + o.num * den, den * o.den);
}

std::string Rational::str() const {
  return den == 1 ? std::to_string(num) : std::to_string(num) + "/" + std::to_string(den);
}

ByteAccounting byte_accounting(const ModelConfig& c) {
  const std::vector<LayerInfo> schedule = layer_schedule(c);
  ByteAccounting b;
  for (int owner : c.kv_source_layers) {
    OwnerBytes o;
    o.layer = owner;
    o.ratio = c.compress_ratios[owner];
    o.main_entry_bytes = entry_bytes(CacheFormat::kCompressedKvFp4, c.head_dim);
    o.index_entry_bytes = entry_bytes(CacheFormat::kIndexKeysFp4, c.index_head_dim);
    o.entry_bytes = o.main_entry_bytes + o.index_entry_bytes;
    o.bytes_per_token = Rational::of(o.entry_bytes, o.ratio);
    for (const LayerInfo& l : schedule) {
      if (l.kv_owner == owner) o.reader_layers.push_back(l.layer);
    }
    o.partial_state_bytes = int64_t{o.ratio - 1} * c.head_dim * 2 * int64_t{sizeof(float)};
    const int bf16 = entry_bytes(CacheFormat::kBf16, c.head_dim) +
                     entry_bytes(CacheFormat::kBf16, c.index_head_dim);
    b.global_bytes_per_token = b.global_bytes_per_token + o.bytes_per_token;
    b.bf16_bytes_per_token = b.bf16_bytes_per_token + Rational::of(bf16, o.ratio);
    b.compressor_partial_bytes_per_session += o.partial_state_bytes;
    b.owners.push_back(std::move(o));
  }
  b.window_kv_layers = c.total_layers();
  b.window_kv_slots = c.window_size;
  b.window_kv_entry_bytes = entry_bytes(CacheFormat::kWindowKvFp8, c.head_dim);
  b.window_kv_bytes_per_session = int64_t{b.window_kv_layers} * b.window_kv_slots * b.window_kv_entry_bytes;
  return b;
}

int64_t global_bytes_for_tokens(const ByteAccounting& b, int64_t tokens) {
  DSV41_CHECK(tokens >= 0, "token count must be >= 0, got ", tokens);
  int64_t total = 0;
  for (const OwnerBytes& o : b.owners) total += tokens / o.ratio * o.entry_bytes;
  return total;
}

}  // namespace dsv41::reference::session
