#include "reference/model/kv_cache.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "formats/qdq.h"
#include "reference/seam/ops.h"

namespace dsv41::reference::model {
namespace {

std::string hex_byte(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}

std::vector<int64_t> range(int64_t first, int64_t count) {
  std::vector<int64_t> v(static_cast<size_t>(std::max<int64_t>(count, 0)));
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------ PackedCache

PackedCache::PackedCache(std::string label, formats::CacheFormat format, int owner_layer, int ratio, int64_t dim,
                         int64_t capacity, int64_t position_offset)
    : label_(std::move(label)),
      format_(format),
      owner_layer_(owner_layer),
      ratio_(ratio),
      dim_(dim),
      capacity_(capacity),
      position_offset_(position_offset),
      entry_bytes_(formats::entry_bytes(format, static_cast<int>(dim))) {
  DSV41_CHECK(owner_layer >= 0 && ratio >= 1 && capacity >= 0 && position_offset >= 0, label_, ": owner ",
              owner_layer, ", ratio ", ratio, ", capacity ", capacity, ", position_offset ", position_offset);
  storage_ = Tensor<uint8_t>({capacity, entry_bytes_}, label_);
}

void PackedCache::place(const seam::Ops& ops) { storage_ = ops.upload(std::move(storage_)); }
void PackedCache::fetch(const seam::Ops& ops) { storage_ = ops.download(std::move(storage_)); }

void PackedCache::write(const seam::Ops& ops, int64_t first_entry, const Tensor<float>& rows) {
  DSV41_CHECK(rows.rank() == 2 && rows.dim(1) == dim_, label_, " of layer ", owner_layer_, ": rows of width ",
              rows.rank() == 2 ? rows.dim(1) : -1, ", want ", dim_);
  const int64_t n = rows.dim(0);
  DSV41_CHECK(first_entry >= 0 && first_entry <= size_ && first_entry + n <= capacity_, label_, " of layer ",
              owner_layer_, ": write of ", n, " entries at ", first_entry, " (size ", size_, ", capacity ",
              capacity_, ")");
  ops.write_entries(storage_, format_, range(first_entry, n), rows);  // the QDQ happens here
  size_ = first_entry + n;
}

CacheRows PackedCache::rows(int expected_owner, int expected_ratio, int64_t count) const {
  if (expected_owner != owner_layer_ || expected_ratio != ratio_) {
    DSV41_FAIL(label_, ": a consumer expects the cache of layer ", expected_owner, " (ratio ", expected_ratio,
               ") but this cache belongs to layer ", owner_layer_, " (ratio ", ratio_, ")");
  }
  DSV41_CHECK(count >= 0 && count <= size_, label_, " of layer ", owner_layer_, ": read of ", count, " entries, ",
              size_, " written");
  return CacheRows{format_, dim_, count, &storage_};
}

Tensor<float> PackedCache::read(const seam::Ops& ops, int expected_owner, int expected_ratio, int64_t count) const {
  return ops.read_entries(rows(expected_owner, expected_ratio, count), range(0, count));
}

const uint8_t* PackedCache::entry(int64_t e) const {
  DSV41_CHECK(e >= 0 && e < size_, label_, " of layer ", owner_layer_, ": entry ", e, " of ", size_);
  return storage_.row(e);
}

void PackedCache::restore(const uint8_t* bytes, int64_t count) {
  DSV41_CHECK(count >= 0 && count <= capacity_, label_, " of layer ", owner_layer_, ": restore of ", count,
              " entries, capacity ", capacity_);
  if (format_ == formats::CacheFormat::kBf16) {  // raw bf16: finite values are all it can hold
    try {
      formats::unpack_rows(format_, std::vector<uint8_t>(bytes, bytes + count * entry_bytes_),
                           static_cast<int>(count), static_cast<int>(dim_));
    } catch (const Error& e) {
      DSV41_FAIL(label_, " of layer ", owner_layer_, " (bf16): ", e.what());
    }
  } else {
    // The scales the quantizer can write: from the amax floor to the largest finite amax (E4M3
    // and E8M0 codes of positive finite values are ordered like their values).
    const bool compressed = format_ == formats::CacheFormat::kCompressedKvFp4;
    DSV41_CHECK(compressed || format_ == formats::CacheFormat::kIndexKeysFp4, label_, ": cannot restore format ",
                formats::info(format_).name);
    const float big = std::numeric_limits<float>::max();
    const uint8_t lo = compressed ? formats::compressed_kv_scale(0.0f) : formats::index_scale(0.0f);
    const uint8_t hi = compressed ? formats::compressed_kv_scale(big) : formats::index_scale(big);
    const int64_t block = compressed ? formats::kCompressedKvBlock : formats::kIndexBlock;
    for (int64_t e = 0; e < count; ++e) {
      const uint8_t* scales = bytes + e * entry_bytes_ + dim_ / 2;
      for (int64_t b = 0; b < dim_ / block; ++b) {
        if (scales[b] < lo || scales[b] > hi) {
          DSV41_FAIL(label_, " of layer ", owner_layer_, ": entry ", e, " block ", b, " has scale byte ",
                     hex_byte(scales[b]), ", not an ", compressed ? "E4M3" : "E8M0",
                     " scale the quantizer writes [", hex_byte(lo), ", ", hex_byte(hi), "]");
        }
      }
    }
  }
  std::copy(bytes, bytes + count * entry_bytes_, storage_.data().begin());
  size_ = count;
}

// ------------------------------------------------------------------------------ WindowKvRing

WindowKvRing::WindowKvRing(int window_, int64_t head_dim_, formats::CacheFormat format_)
    : window(window_), head_dim(head_dim_), format(format_) {
  DSV41_CHECK(window > 0 && head_dim > 0, "window_kv ring: window ", window, ", head_dim ", head_dim);
  bytes = Tensor<uint8_t>({window, entry_bytes()}, "window_kv");
  positions.assign(static_cast<size_t>(window), -1);
}

void WindowKvRing::write(const seam::Ops& ops, int64_t first_position, const Tensor<float>& rows) {
  const int64_t n = rows.dim(0);
  DSV41_CHECK(n <= window && first_position >= 0, "window_kv ring: write of ", n, " rows at position ",
              first_position, " into ", window, " slots");
  std::vector<int64_t> slots;
  for (int64_t i = 0; i < n; ++i) slots.push_back((first_position + i) % window);
  try {
    ops.write_entries(bytes, format, slots, rows);
  } catch (const Error& e) {
    DSV41_FAIL("SWA ring: window KV at positions ", first_position, "..", first_position + n - 1, ": ", e.what());
  }
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(slots[static_cast<size_t>(i)])] = first_position + i;
}

Tensor<float> WindowKvRing::read_positions(const seam::Ops& ops, int64_t first, int64_t count) const {
  DSV41_CHECK(count >= 0 && count <= window, "SWA ring: cannot read ", count, " positions from a ring of ", window);
  std::vector<int64_t> slots;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = first + i, slot = p % window;
    DSV41_CHECK(p >= 0 && positions[static_cast<size_t>(slot)] == p, "SWA ring does not hold position ", p,
                " (slot ", slot, " holds ", positions[static_cast<size_t>(slot)], ")");
    slots.push_back(slot);
  }
  return ops.read_entries(CacheRows{format, head_dim, window, &bytes}, slots);
}

Tensor<float> WindowKvRing::read_all(const seam::Ops& ops) const {
  std::vector<int64_t> held;
  for (int64_t s = 0; s < window; ++s) {
    if (positions[static_cast<size_t>(s)] >= 0) held.push_back(s);  // never read: its index is -1
  }
  const Tensor<float> values = ops.download(ops.read_entries(CacheRows{format, head_dim, window, &bytes}, held));
  Tensor<float> out({window, head_dim}, "window_kv_ring");
  for (size_t i = 0; i < held.size(); ++i) {
    std::copy(values.row(static_cast<int64_t>(i)), values.row(static_cast<int64_t>(i)) + head_dim, out.row(held[i]));
  }
  return out;
}

Tensor<float> WindowKvRing::read_slots(const seam::Ops& ops, int64_t count) const {
  DSV41_CHECK(count >= 0 && count <= window, "window_kv ring: cannot read ", count, " slots of ", window);
  for (int64_t s = 0; s < count; ++s) {
    DSV41_CHECK(positions[static_cast<size_t>(s)] >= 0, "window_kv ring: slot ", s, " is empty");
  }
  return ops.read_entries(CacheRows{format, head_dim, window, &bytes}, range(0, count));
}

void WindowKvRing::clear() { std::fill(positions.begin(), positions.end(), int64_t{-1}); }

// ------------------------------------------------------------------------------ compressor

CompressorState::CompressorState(int ratio_, int64_t dim_)
    : ratio(ratio_),
      dim(dim_),
      kv({std::max(ratio_, 0), std::max<int64_t>(dim_, 0)}, "compressor_kv_state", 0.0f),
      score({std::max(ratio_, 0), std::max<int64_t>(dim_, 0)}, "compressor_score_state",
            -std::numeric_limits<float>::infinity()) {
  DSV41_CHECK(ratio >= 2, "compressor state: ratio ", ratio,
              " (ratio 1 has no pooling: latent = norm(wkv(x)), no state)");
  DSV41_CHECK(dim > 0, "compressor state: dim ", dim);
}

CompressedLatents compress(const seam::Ops& ops, CompressorState& state, const Tensor<float>& kv, const Tensor<float>& score,
                           int64_t start_pos) {
  DSV41_CHECK(start_pos == state.next_pos, "compress: tokens from position ", start_pos,
              " but the compressor state expects position ", state.next_pos,
              " next (tokens must arrive in order, without gaps)");
  CompressedLatents out = ops.compress(kv, score, start_pos, state.ratio, state.kv, state.score);
  state.next_pos = start_pos + kv.dim(0);
  return out;
}

// ------------------------------------------------------------------------------ views

namespace {

// A ring's occupied slots by ascending position.
CacheView ring_view(const char* kind, int layer, const WindowKvRing& ring, const seam::Ops& ops) {
  const Tensor<uint8_t> bytes = ops.download(ring.bytes);
  CacheView v;
  v.kind = kind;
  v.layer = layer;
  v.format = ring.format;
  v.dim = ring.head_dim;
  v.entry_bytes = ring.entry_bytes();
  std::vector<int64_t> slots;  // occupied slots, by ascending position
  for (int s = 0; s < ring.window; ++s) {
    if (ring.positions[static_cast<size_t>(s)] >= 0) slots.push_back(s);
  }
  std::sort(slots.begin(), slots.end(), [&ring](int64_t a, int64_t b) {
    return ring.positions[static_cast<size_t>(a)] < ring.positions[static_cast<size_t>(b)];
  });
  for (int64_t s : slots) {
    v.bytes.insert(v.bytes.end(), bytes.row(s), bytes.row(s) + v.entry_bytes);
    v.positions.push_back(ring.positions[static_cast<size_t>(s)]);
  }
  v.entries = static_cast<int64_t>(slots.size());
  return v;
}

}  // namespace

std::vector<CacheView> cache_views(const ModelState& state, const seam::Ops& ops) {
  std::vector<CacheView> out;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    out.push_back(ring_view("window_kv", static_cast<int>(l), state.layers[l].window_kv, ops));
  }
  const auto view_of = [&ops](const char* kind, int layer, const PackedCache& cache) {
    const Tensor<uint8_t> bytes = ops.download(cache.storage());
    CacheView v;
    v.kind = kind;
    v.layer = layer;
    v.format = cache.format();
    v.dim = cache.dim();
    v.entry_bytes = cache.entry_bytes();
    v.entries = cache.size();
    for (int64_t e = 0; e < cache.size(); ++e) {
      v.bytes.insert(v.bytes.end(), bytes.row(e), bytes.row(e) + cache.entry_bytes());
      v.positions.push_back(cache.position_offset() + e);
    }
    return v;
  };
  for (size_t l = 0; l < state.layers.size(); ++l) {
    const LayerState& ls = state.layers[l];
    if (ls.compressed_kv) out.push_back(view_of("compressed_kv", static_cast<int>(l), *ls.compressed_kv));
    if (ls.index_keys) out.push_back(view_of("index_keys", static_cast<int>(l), *ls.index_keys));
  }
  return out;
}

std::vector<CacheView> compressor_views(const ModelState& state, const seam::Ops& ops) {
  std::vector<CacheView> out;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    if (!state.layers[l].compressor) continue;
    const CompressorState& c = *state.layers[l].compressor;
    const Tensor<float> kv = ops.download(c.kv), score = ops.download(c.score);
    CacheView v;
    v.kind = "compressor";
    v.layer = static_cast<int>(l);
    // fp32 rows are no CacheFormat: `format` stays kBf16, a label every reader ignores for this
    // kind (a port dump's `.format` metadata; docs/port-dump.md, "Caches").
    v.dim = c.dim;
    v.entry_bytes = 2 * c.dim * static_cast<int64_t>(sizeof(float));
    v.entries = c.pending();
    const int64_t group_start = c.next_pos - c.pending();
    for (int slot = 0; slot < c.pending(); ++slot) {
      for (const Tensor<float>* t : {&kv, &score}) {
        const auto* b = reinterpret_cast<const uint8_t*>(t->row(slot));
        v.bytes.insert(v.bytes.end(), b, b + c.dim * static_cast<int64_t>(sizeof(float)));
      }
      v.positions.push_back(group_start + slot);
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<CacheView> dspark_views(const ModelState& state, const seam::Ops& ops) {
  std::vector<CacheView> out;
  const int n_layers = static_cast<int>(state.layers.size());
  for (size_t i = 0; i < state.dspark_window_kv.size(); ++i) {
    out.push_back(ring_view("dspark_window_kv", n_layers + static_cast<int>(i), state.dspark_window_kv[i], ops));
  }
  return out;
}

}  // namespace dsv41::reference::model
