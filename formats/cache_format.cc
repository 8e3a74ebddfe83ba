#include "formats/cache_format.h"

#include <cstddef>
#include <ios>

#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/packed.h"

namespace dsv41::formats {
namespace {

constexpr CacheFormatInfo kInfos[] = {
    {"fp4_e2m1_e4m3_b16", "E2M1", "E4M3", kCompressedKvBlock},
    {"fp4_e2m1_e8m0_b32", "E2M1", "E8M0", kIndexBlock},
    {"fp8_e4m3_e8m0_b32", "E4M3", "E8M0", kFp8Block},
    {"bf16", "BF16", "none", 1},
};

void check_dim(CacheFormat f, int dim) {
  const CacheFormatInfo& i = info(f);
  DSV41_CHECK(dim > 0 && dim % i.block == 0 && (i.block == 1 || dim % 2 == 0),
              "format ", i.name, " needs a dim that is a positive multiple of ", i.block,
              ", got dim=", dim);
}

bool pack_one(CacheFormat f, const float* x, int dim, uint8_t* out) {
  switch (f) {
    case CacheFormat::kCompressedKvFp4: return pack_compressed_kv(x, dim, out);
    case CacheFormat::kIndexKeysFp4: return pack_index_keys(x, dim, out);
    case CacheFormat::kWindowKvFp8: return pack_window_kv(x, dim, out);
    case CacheFormat::kBf16: return pack_bf16(x, dim, out);
  }
  return false;
}

void unpack_one(CacheFormat f, const uint8_t* in, int dim, float* out) {
  switch (f) {
    case CacheFormat::kCompressedKvFp4: unpack_compressed_kv(in, dim, out); return;
    case CacheFormat::kIndexKeysFp4: unpack_index_keys(in, dim, out); return;
    case CacheFormat::kWindowKvFp8: unpack_window_kv(in, dim, out); return;
    case CacheFormat::kBf16: unpack_bf16(in, dim, out); return;
  }
}

// A stored entry can only hold bytes that pack_one produces from finite input: positive,
// non-NaN E4M3 scales, non-NaN E8M0 scales and non-NaN E4M3 elements. Anything else is a
// corrupt cache, reported with its position.
void validate_entry(CacheFormat f, const uint8_t* in, int dim, int row) {
  const char* name = info(f).name;
  switch (f) {
    case CacheFormat::kCompressedKvFp4:
      for (int b = 0; b < dim / kCompressedKvBlock; ++b) {
        const uint8_t s = in[dim / 2 + b];
        DSV41_CHECK(s >= 0x01 && s <= 0x7E, "corrupt ", name, " entry at row ", row,
                    ": E4M3 scale byte 0x", std::hex, int{s}, std::dec, " of block ", b,
                    " is not a positive finite scale");
      }
      return;
    case CacheFormat::kIndexKeysFp4:
      for (int b = 0; b < dim / kIndexBlock; ++b) {
        DSV41_CHECK(in[dim / 2 + b] != 0xFF, "corrupt ", name, " entry at row ", row,
                    ": E8M0 scale of block ", b, " is 0xFF (NaN)");
      }
      return;
    case CacheFormat::kWindowKvFp8:
      for (int b = 0; b < dim / kFp8Block; ++b) {
        DSV41_CHECK(in[dim + b] != 0xFF, "corrupt ", name, " entry at row ", row,
                    ": E8M0 scale of block ", b, " is 0xFF (NaN)");
      }
      for (int i = 0; i < dim; ++i) {
        DSV41_CHECK(!E4M3::is_nan(in[i]), "corrupt ", name, " entry at row ", row,
                    ": element ", i, " holds the E4M3 NaN code 0x", std::hex, int{in[i]});
      }
      return;
    case CacheFormat::kBf16:
      for (int i = 0; i < dim; ++i) {
        const uint32_t c = in[2 * i] | (uint32_t{in[2 * i + 1]} << 8);
        DSV41_CHECK((c & 0x7F80u) != 0x7F80u, "corrupt ", name, " entry at row ", row,
                    ": element ", i, " is NaN or Inf (0x", std::hex, c, ")");
      }
      return;
  }
}

}  // namespace

const CacheFormatInfo& info(CacheFormat f) { return kInfos[static_cast<int>(f)]; }

CacheFormat cache_format_from_name(const std::string& name) {
  std::string names;
  for (int i = 0; i < 4; ++i) {
    if (name == kInfos[i].name) return static_cast<CacheFormat>(i);
    names += (i ? ", " : "") + std::string(kInfos[i].name);
  }
  DSV41_FAIL("unknown cache format '", name, "' (known: ", names, ")");
}

int entry_bytes(CacheFormat f, int dim) {
  check_dim(f, dim);
  switch (f) {
    case CacheFormat::kCompressedKvFp4: return compressed_kv_entry_bytes(dim);
    case CacheFormat::kIndexKeysFp4: return index_keys_entry_bytes(dim);
    case CacheFormat::kWindowKvFp8: return window_kv_entry_bytes(dim);
    case CacheFormat::kBf16: return bf16_entry_bytes(dim);
  }
  return 0;
}

std::vector<uint8_t> pack_rows(CacheFormat f, const std::vector<float>& x, int rows, int dim) {
  const int eb = entry_bytes(f, dim);
  DSV41_CHECK(rows >= 0 && x.size() == static_cast<size_t>(rows) * dim, "pack_rows(", info(f).name,
              "): input has ", x.size(), " values, expected rows*dim = ", rows, "*", dim);
  std::vector<uint8_t> out(static_cast<size_t>(rows) * eb);
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<size_t>(r) * dim;
    if (!pack_one(f, row, dim, out.data() + static_cast<size_t>(r) * eb)) {
      for (int i = 0; i < dim; ++i) {
        const uint32_t a = f32_bits(row[i]) & 0x7FFFFFFFu;
        DSV41_CHECK(a < 0x7F800000u, "pack_rows(", info(f).name, "): non-finite input ",
                    row[i], " at row ", r, ", element ", i, " (block ", i / info(f).block,
                    "); the cache formats have no defined encoding for NaN/Inf blocks");
      }
      // Every input is finite, yet the entry is not: a finite value beyond the format's range
      // (bf16 rounds |x| >= 0x1.FFp127 to Inf).
      for (int i = 0; i < dim; ++i) {
        DSV41_CHECK(f != CacheFormat::kBf16 || (formats::bf16_encode(row[i]) & 0x7F80u) != 0x7F80u,
                    "pack_rows(", info(f).name, "): input ", row[i], " at row ", r, ", element ", i,
                    " overflows bf16 (rounds to Inf)");
      }
      DSV41_FAIL("pack_rows(", info(f).name, "): row ", r, " cannot be encoded");
    }
  }
  return out;
}

std::vector<float> unpack_rows(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim) {
  const int eb = entry_bytes(f, dim);
  DSV41_CHECK(rows >= 0 && bytes.size() == static_cast<size_t>(rows) * eb, "unpack_rows(",
              info(f).name, "): ", bytes.size(), " bytes, expected rows*entry_bytes = ", rows, "*",
              eb);
  std::vector<float> out(static_cast<size_t>(rows) * dim);
  for (int r = 0; r < rows; ++r) {
    validate_entry(f, bytes.data() + static_cast<size_t>(r) * eb, dim, r);
    unpack_one(f, bytes.data() + static_cast<size_t>(r) * eb, dim,
               out.data() + static_cast<size_t>(r) * dim);
  }
  return out;
}

EntryCheck check_entries(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim) {
  const int eb = entry_bytes(f, dim);
  DSV41_CHECK(rows >= 0 && bytes.size() == static_cast<size_t>(rows) * eb, "check_entries(",
              info(f).name, "): ", bytes.size(), " bytes, expected rows*entry_bytes = ", rows, "*",
              eb);
  EntryCheck c;
  c.rows = rows;
  for (int r = 0; r < rows; ++r) {
    try {
      validate_entry(f, bytes.data() + static_cast<size_t>(r) * eb, dim, r);
    } catch (const Error& e) {
      if (c.first < 0) {
        c.first = r;
        c.why = e.what();
      }
      ++c.invalid;
    }
  }
  return c;
}

std::vector<float> qdq_rows(CacheFormat f, const std::vector<float>& x, int rows, int dim) {
  return unpack_rows(f, pack_rows(f, x, rows, dim), rows, dim);
}

}  // namespace dsv41::formats
