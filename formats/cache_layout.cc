// formats/cache_layout.cc: block-planar pages, paged pools and the sparse-MLA fp8 entries
// (formats/cache_layout.h).
#include "formats/cache_layout.h"

#include <cmath>
#include <cstring>
#include <ios>
#include <set>

#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/packed.h"

namespace dsv41::formats {
namespace {

void check_entries_size(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes, const char* what) {
  DSV41_CHECK(entries >= 0 && entry_bytes > 0 && static_cast<int64_t>(bytes.size()) == entries * entry_bytes, what,
              ": ", bytes.size(), " bytes, expected entries * entry_bytes = ", entries, " * ", entry_bytes);
}

// Interleaved entries [values | scales] <-> block-planar pages of `page` entries.
std::vector<uint8_t> regroup(const std::vector<uint8_t>& bytes, int64_t entries, int64_t eb, int64_t vb, int64_t page,
                             bool to_planar) {
  const char* what = to_planar ? "to_block_planar" : "from_block_planar";
  check_entries_size(bytes, entries, eb, what);
  DSV41_CHECK(vb > 0 && vb < eb && page >= 1, what, ": value bytes ", vb, " of an entry of ", eb,
              " (a layout with scales after the values), pages of ", page);
  const int64_t sb = eb - vb;
  std::vector<uint8_t> out(bytes.size());
  for (int64_t p0 = 0; p0 < entries; p0 += page) {
    const int64_t n = std::min(page, entries - p0);
    const uint8_t* in = bytes.data() + p0 * eb;
    uint8_t* o = out.data() + p0 * eb;
    for (int64_t e = 0; e < n; ++e) {
      const int64_t inter_v = e * eb, inter_s = e * eb + vb, planar_v = e * vb, planar_s = n * vb + e * sb;
      std::memcpy(o + (to_planar ? planar_v : inter_v), in + (to_planar ? inter_v : planar_v), static_cast<size_t>(vb));
      std::memcpy(o + (to_planar ? planar_s : inter_s), in + (to_planar ? inter_s : planar_s), static_cast<size_t>(sb));
    }
  }
  return out;
}

void check_table(const std::vector<int32_t>& table, int64_t num_blocks) {
  std::set<int32_t> seen;
  for (size_t k = 0; k < table.size(); ++k) {
    DSV41_CHECK(table[k] >= 0 && table[k] < num_blocks, "block table entry ", k, " is ", table[k],
                ", outside the pool's blocks [0, ", num_blocks, ")");
    DSV41_CHECK(seen.insert(table[k]).second, "block table entry ", k, " lists block ", table[k],
                " a second time (a block holds one part of one sequence)");
  }
}

void check_paging(const std::vector<int32_t>& table, int64_t num_blocks, int64_t block_size, int64_t first,
                  int64_t entries) {
  DSV41_CHECK(num_blocks >= 0 && block_size >= 1, "a pool of ", num_blocks, " blocks of ", block_size, " entries");
  check_table(table, num_blocks);
  const int64_t slots = static_cast<int64_t>(table.size()) * block_size;
  DSV41_CHECK(first >= 0 && first < std::max<int64_t>(block_size, 1) && entries >= 0 && first + entries <= slots,
              "entries [", first, ", ", first + entries, ") of the block table's ", table.size(), " blocks of ",
              block_size, " slots (", slots, "; the first valid slot lies in the first block)");
}

float f32_le(const uint8_t* p) {
  uint32_t u = 0;
  std::memcpy(&u, p, 4);  // little-endian hosts (all dsv41 runs on)
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Half an ulp of an E4M3 code value v (|v| <= 448), times the scale: the rounding that put it there.
float e4m3_rounding(float v, float s) {
  return s * std::max(std::fabs(v) * 0.0625f, 0x1p-10f);
}

// Half the wider gap of the E2M1 grid (0, 0.5, 1, 1.5, 2, 3, 4, 6) next to code value v, times s.
float e2m1_rounding(float v, float s) {
  const float a = std::fabs(v);
  return s * (a < 2.0f ? 0.25f : (a < 4.0f ? 0.5f : 1.0f));
}

}  // namespace

int value_bytes(CacheFormat f, int dim) {
  entry_bytes(f, dim);  // checks dim
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
    case CacheFormat::kIndexKeysFp4: return dim / 2;
    case CacheFormat::kWindowKvFp8: return dim;
    case CacheFormat::kBf16: return 0;
  }
  return 0;
}

std::vector<uint8_t> to_block_planar(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                     int64_t value_bytes, int64_t page) {
  return regroup(bytes, entries, entry_bytes, value_bytes, page, true);
}

std::vector<uint8_t> from_block_planar(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                       int64_t value_bytes, int64_t page) {
  return regroup(bytes, entries, entry_bytes, value_bytes, page, false);
}

std::vector<uint8_t> unpage(const std::vector<uint8_t>& pool, int64_t num_blocks, int64_t block_size,
                            int64_t entry_bytes, const std::vector<int32_t>& table, int64_t first, int64_t entries,
                            int64_t planar_value_bytes) {
  check_paging(table, num_blocks, block_size, first, entries);
  const int64_t block_bytes = block_size * entry_bytes;
  DSV41_CHECK(static_cast<int64_t>(pool.size()) == num_blocks * block_bytes, "a pool of ", pool.size(),
              " bytes, expected num_blocks * block_size * entry_bytes = ", num_blocks, " * ", block_size, " * ",
              entry_bytes);
  std::vector<uint8_t> seq;
  seq.reserve(static_cast<size_t>(static_cast<int64_t>(table.size()) * block_bytes));
  for (int32_t b : table) {
    std::vector<uint8_t> block(pool.begin() + b * block_bytes, pool.begin() + (b + 1) * block_bytes);
    if (planar_value_bytes > 0) block = from_block_planar(block, block_size, entry_bytes, planar_value_bytes, block_size);
    seq.insert(seq.end(), block.begin(), block.end());
  }
  return std::vector<uint8_t>(seq.begin() + first * entry_bytes, seq.begin() + (first + entries) * entry_bytes);
}

std::vector<uint8_t> page_entries(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                  int64_t num_blocks, int64_t block_size, const std::vector<int32_t>& table,
                                  int64_t first, int64_t planar_value_bytes, uint8_t fill) {
  check_entries_size(bytes, entries, entry_bytes, "page_entries");
  check_paging(table, num_blocks, block_size, first, entries);
  const int64_t block_bytes = block_size * entry_bytes;
  std::vector<uint8_t> pool(static_cast<size_t>(num_blocks * block_bytes), fill);
  std::vector<uint8_t> seq(static_cast<size_t>(static_cast<int64_t>(table.size()) * block_bytes), fill);
  std::memcpy(seq.data() + first * entry_bytes, bytes.data(), bytes.size());
  for (size_t k = 0; k < table.size(); ++k) {
    std::vector<uint8_t> block(seq.begin() + static_cast<int64_t>(k) * block_bytes,
                               seq.begin() + static_cast<int64_t>(k + 1) * block_bytes);
    if (planar_value_bytes > 0) block = to_block_planar(block, block_size, entry_bytes, planar_value_bytes, block_size);
    std::memcpy(pool.data() + table[k] * block_bytes, block.data(), block.size());
  }
  return pool;
}

namespace {

struct SparseMlaShape {
  int nope, rope, tile, tiles, scale_bytes, scales_at, rope_at, bytes;
};

SparseMlaShape sparse_mla_shape(SparseMlaFp8 f, int dim, int rope_dim) {
  DSV41_CHECK(rope_dim >= 0 && dim > rope_dim, name(f), ": dim ", dim, " with a RoPE part of ", rope_dim,
              " (the fp8 part must hold at least one value)");
  SparseMlaShape s{};
  s.nope = dim - rope_dim;
  s.rope = rope_dim;
  s.tile = f == SparseMlaFp8::kV32 ? 128 : 64;
  s.tiles = (s.nope + s.tile - 1) / s.tile;
  if (f == SparseMlaFp8::kV32) {  // [nope E4M3 | tiles fp32 | rope bf16]
    s.scale_bytes = 4 * s.tiles;
    s.scales_at = s.nope;
    s.rope_at = s.nope + s.scale_bytes;
  } else {  // [nope E4M3 | rope bf16 | tiles E8M0, padded to 8]
    s.scale_bytes = (s.tiles + 7) / 8 * 8;
    s.rope_at = s.nope;
    s.scales_at = s.nope + 2 * s.rope;
  }
  s.bytes = s.nope + 2 * s.rope + s.scale_bytes;
  return s;
}

float tile_scale(SparseMlaFp8 f, const uint8_t* scales, int t) {
  return f == SparseMlaFp8::kV32 ? f32_le(scales + 4 * t) : (scales[t] == 0xFF ? std::nanf("") : e8m0_decode(scales[t]));
}

}  // namespace

const char* name(SparseMlaFp8 f) { return f == SparseMlaFp8::kV32 ? "fp8_ds_mla" : "fp8_ds_mla_model1"; }

bool sparse_mla_fp8_from_name(const std::string& n, SparseMlaFp8& f) {
  for (SparseMlaFp8 k : {SparseMlaFp8::kV32, SparseMlaFp8::kModel1}) {
    if (n == name(k)) {
      f = k;
      return true;
    }
  }
  return false;
}

int sparse_mla_fp8_entry_bytes(SparseMlaFp8 f, int dim, int rope_dim) { return sparse_mla_shape(f, dim, rope_dim).bytes; }

int sparse_mla_fp8_value_bytes(SparseMlaFp8 f, int dim, int rope_dim) {
  const SparseMlaShape s = sparse_mla_shape(f, dim, rope_dim);
  return f == SparseMlaFp8::kV32 ? 0 : s.scales_at;
}

std::vector<uint8_t> pack_sparse_mla_fp8(SparseMlaFp8 f, const std::vector<float>& x, int rows, int dim, int rope_dim) {
  const SparseMlaShape sh = sparse_mla_shape(f, dim, rope_dim);
  DSV41_CHECK(rows >= 0 && x.size() == static_cast<size_t>(rows) * dim, "pack ", name(f), ": ", x.size(),
              " values, expected rows * dim = ", rows, " * ", dim);
  std::vector<uint8_t> out(static_cast<size_t>(rows) * sh.bytes, 0);
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<size_t>(r) * dim;
    uint8_t* e = out.data() + static_cast<size_t>(r) * sh.bytes;
    for (int t = 0; t < sh.tiles; ++t) {
      const int t0 = t * sh.tile, n = std::min(sh.tile, sh.nope - t0);
      float amax = 0;
      for (int i = 0; i < n; ++i) {
        DSV41_CHECK(std::isfinite(row[t0 + i]), "pack ", name(f), ": non-finite value at row ", r, ", element ", t0 + i);
        amax = std::max(amax, std::fabs(row[t0 + i]));
      }
      float s = 0;
      if (f == SparseMlaFp8::kV32) {
        s = amax > 0 ? amax / 448.0f : 1.0f;
        std::memcpy(e + sh.scales_at + 4 * t, &s, 4);
      } else {
        e[sh.scales_at + t] = e8m0_encode_ceil(std::max(amax / 448.0f, 1e-4f));
        s = e8m0_decode(e[sh.scales_at + t]);
      }
      for (int i = 0; i < n; ++i) e[t0 + i] = e4m3_encode_satfinite(row[t0 + i] / s);
    }
    for (int i = 0; i < sh.rope; ++i) {
      const uint16_t c = bf16_encode(row[sh.nope + i]);
      e[sh.rope_at + 2 * i] = static_cast<uint8_t>(c & 0xFFu);
      e[sh.rope_at + 2 * i + 1] = static_cast<uint8_t>(c >> 8);
    }
  }
  return out;
}

DecodedRows decode_sparse_mla_fp8(SparseMlaFp8 f, const std::vector<uint8_t>& bytes, int rows, int dim, int rope_dim) {
  const SparseMlaShape sh = sparse_mla_shape(f, dim, rope_dim);
  check_entries_size(bytes, rows, sh.bytes, name(f));
  DecodedRows d;
  d.values.resize(static_cast<size_t>(rows) * dim);
  d.rounding.resize(d.values.size());
  for (int r = 0; r < rows; ++r) {
    const uint8_t* e = bytes.data() + static_cast<size_t>(r) * sh.bytes;
    float* v = d.values.data() + static_cast<size_t>(r) * dim;
    float* b = d.rounding.data() + static_cast<size_t>(r) * dim;
    for (int i = 0; i < sh.nope; ++i) {
      const float s = tile_scale(f, e + sh.scales_at, i / sh.tile);
      DSV41_CHECK(std::isfinite(s) && s > 0, name(f), " entry ", r, ": the ",
                  f == SparseMlaFp8::kV32 ? "fp32" : "E8M0", " scale of tile ", i / sh.tile, " is ", s,
                  ", not a positive finite scale");
      DSV41_CHECK(!E4M3::is_nan(e[i]), name(f), " entry ", r, ": element ", i, " holds the E4M3 NaN code 0x", std::hex,
                  int{e[i]});
      const float code = e4m3_decode(e[i]);
      v[i] = code * s;
      b[i] = e4m3_rounding(code, s) + std::fabs(v[i]) * 0x1p-23f;  // and the fp32 product's rounding
    }
    for (int i = 0; i < sh.rope; ++i) {
      const uint32_t c = e[sh.rope_at + 2 * i] | (uint32_t{e[sh.rope_at + 2 * i + 1]} << 8);
      DSV41_CHECK((c & 0x7F80u) != 0x7F80u, name(f), " entry ", r, ": RoPE element ", i, " is bf16 NaN or Inf (0x",
                  std::hex, c, ")");
      v[sh.nope + i] = bf16_decode(c);
      b[sh.nope + i] = 0;
    }
  }
  return d;
}

DecodedRows decode_with_rounding(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim) {
  DecodedRows d;
  d.values = unpack_rows(f, bytes, rows, dim);
  d.rounding.assign(d.values.size(), 0.0f);
  if (f == CacheFormat::kBf16) return d;
  const int eb = entry_bytes(f, dim), vb = value_bytes(f, dim), block = info(f).block;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* scales = bytes.data() + static_cast<size_t>(r) * eb + vb;
    for (int i = 0; i < dim; ++i) {
      const size_t k = static_cast<size_t>(r) * dim + i;
      const uint8_t sc = scales[i / block];
      switch (f) {
        case CacheFormat::kCompressedKvFp4: {
          const float s = e4m3_decode(sc);
          d.rounding[k] = e2m1_rounding(d.values[k] / s, s);
          break;
        }
        case CacheFormat::kIndexKeysFp4: {
          const float s = e8m0_decode(sc);
          d.rounding[k] = e2m1_rounding(d.values[k] / s, s);
          break;
        }
        case CacheFormat::kWindowKvFp8: {
          const float s = e8m0_decode(sc);
          d.rounding[k] = e4m3_rounding(d.values[k] / s, s);
          break;
        }
        case CacheFormat::kBf16: break;
      }
    }
  }
  return d;
}

}  // namespace dsv41::formats
