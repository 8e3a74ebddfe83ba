#include "reference/model/state_diff.h"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "base/error.h"

namespace dsv41::reference::model {
namespace {

// "0x3c"
std::string hex(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(v));
  return buf;
}

// The first differing byte of two ranges of n bytes: "" when equal, else
// "<what> differs at byte offset o of n: 0xaa vs 0xbb".
std::string bytes_diff(const std::string& what, const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) {
      return detail::concat(what, " differs at byte offset ", i, " of ", n, ": ", hex(x[i]), " vs ", hex(y[i]));
    }
  }
  return "";
}

// "<what> differs: a vs b" when the two values differ, else "".
template <typename T>
std::string value_diff(const std::string& what, const T& a, const T& b) {
  if (a == b) return "";
  std::ostringstream os;
  os << what << " differs: " << a << " vs " << b;
  return os.str();
}

std::string ring_diff(const std::string& where, const WindowKvRing& a, const WindowKvRing& b) {
  for (const std::string& d : {value_diff(where + " window", a.window, b.window),
                               value_diff(where + " head_dim", a.head_dim, b.head_dim),
                               value_diff(where + " format", std::string(formats::info(a.format).name),
                                          std::string(formats::info(b.format).name)),
                               value_diff(where + " slot count", a.positions.size(), b.positions.size())}) {
    if (!d.empty()) return d;
  }
  for (size_t s = 0; s < a.positions.size(); ++s) {
    if (a.positions[s] != b.positions[s]) {
      return detail::concat(where, ": slot ", s, " holds position ", a.positions[s], " vs ", b.positions[s],
                            " (-1: empty)");
    }
  }
  const std::vector<uint8_t>& x = a.bytes.data();
  const std::vector<uint8_t>& y = b.bytes.data();
  const auto entry = static_cast<size_t>(a.entry_bytes());
  DSV41_CHECK(x.size() == y.size() && x.size() == a.positions.size() * entry, "state diff: ", where, " holds ",
              x.size(), " / ", y.size(), " bytes for ", a.positions.size(), " slots of ", entry, " bytes");
  for (size_t s = 0; s < a.positions.size(); ++s) {
    if (a.positions[s] < 0) continue;  // empty: stale bytes
    const std::string d = bytes_diff(detail::concat(where, ": slot ", s, " (position ", a.positions[s], ")"),
                                     x.data() + s * entry, y.data() + s * entry, entry);
    if (!d.empty()) return d;
  }
  return "";
}

std::string compressor_diff(const std::string& where, const std::optional<CompressorState>& a,
                            const std::optional<CompressorState>& b) {
  if (a.has_value() != b.has_value()) {
    return detail::concat(where, ": present in ", a ? "the first" : "the second", " state only");
  }
  if (!a) return "";
  for (const std::string& d : {value_diff(where + " ratio", a->ratio, b->ratio),
                               value_diff(where + " dim", a->dim, b->dim),
                               value_diff(where + " next_pos", a->next_pos, b->next_pos)}) {
    if (!d.empty()) return d;
  }
  const int64_t group_start = a->next_pos - a->pending();
  const size_t row = static_cast<size_t>(a->dim) * sizeof(float);
  for (const char* name : {"kv", "score"}) {
    const Tensor<float>& x = std::string(name) == "kv" ? a->kv : a->score;
    const Tensor<float>& y = std::string(name) == "kv" ? b->kv : b->score;
    for (int slot = 0; slot < a->pending(); ++slot) {
      const std::string d = bytes_diff(
          detail::concat(where, ": pending ", name, " row ", slot, " (position ", group_start + slot, ")"),
          x.row(slot), y.row(slot), row);
      if (!d.empty()) return d;
    }
  }
  return "";
}

std::string packed_diff(const std::string& where, const std::optional<PackedCache>& a,
                        const std::optional<PackedCache>& b) {
  if (a.has_value() != b.has_value()) {
    return detail::concat(where, ": present in ", a ? "the first" : "the second", " state only");
  }
  if (!a) return "";
  for (const std::string& d :
       {value_diff(where + " format", std::string(formats::info(a->format()).name),
                   std::string(formats::info(b->format()).name)),
        value_diff(where + " owner layer", a->owner_layer(), b->owner_layer()),
        value_diff(where + " ratio", a->ratio(), b->ratio()), value_diff(where + " dim", a->dim(), b->dim()),
        value_diff(where + " capacity", a->capacity(), b->capacity()),
        value_diff(where + " position offset", a->position_offset(), b->position_offset()),
        value_diff(where + " entry count (size)", a->size(), b->size())}) {
    if (!d.empty()) return d;
  }
  for (int64_t e = 0; e < a->size(); ++e) {
    const std::string d =
        bytes_diff(detail::concat(where, ": entry ", e, " (compressed position ", a->position_offset() + e, ")"),
                   a->entry(e), b->entry(e), static_cast<size_t>(a->entry_bytes()));
    if (!d.empty()) return d;
  }
  return "";
}

std::string ids_diff(const std::string& what, const char* unit, int64_t first, const std::vector<int64_t>& a,
                     const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return detail::concat(what, " length differs: ", a.size(), " vs ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return detail::concat(what, ": ", unit, " ", first + static_cast<int64_t>(i), " holds ", a[i], " vs ", b[i]);
    }
  }
  return "";
}

}  // namespace

std::string first_state_difference(const ModelState& a, const ModelState& b) {
  if (a.precision != b.precision) {
    return detail::concat("cache precision differs: ", name(a.precision), " vs ", name(b.precision));
  }
  if (std::string d = value_diff("pos", a.pos, b.pos); !d.empty()) return d;
  if (std::string d = value_diff("layer count", a.layers.size(), b.layers.size()); !d.empty()) return d;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerState& x = a.layers[l];
    const LayerState& y = b.layers[l];
    const std::string layer = "layer " + std::to_string(l) + " ";
    for (const std::string& d : {ring_diff(layer + "window_kv", x.window_kv, y.window_kv),
                                 compressor_diff(layer + "compressor", x.compressor, y.compressor),
                                 packed_diff(layer + "compressed_kv", x.compressed_kv, y.compressed_kv),
                                 packed_diff(layer + "index_keys", x.index_keys, y.index_keys)}) {
      if (!d.empty()) return d;
    }
  }
  for (const std::string& d :
       {value_diff("Engram history pad id", a.engram.pad_id(), b.engram.pad_id()),
        value_diff("Engram history first position", a.engram.first_position(), b.engram.first_position()),
        ids_diff("Engram history", "position", a.engram.first_position(), a.engram.ids(), b.engram.ids()),
        ids_diff("recent tokens", "slot", 0, a.recent_tokens, b.recent_tokens)}) {
    if (!d.empty()) return d;
  }
  if (std::string d = value_diff("DSpark ring count", a.dspark_window_kv.size(), b.dspark_window_kv.size()); !d.empty()) {
    return d;
  }
  for (size_t i = 0; i < a.dspark_window_kv.size(); ++i) {
    const std::string what = "DSpark block " + std::to_string(i) + " dspark_window_kv";
    if (std::string d = ring_diff(what, a.dspark_window_kv[i], b.dspark_window_kv[i]); !d.empty()) return d;
  }
  return "";
}

}  // namespace dsv41::reference::model
