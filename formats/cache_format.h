// formats/cache_format.h
//
// The cache formats by name, with their byte accounting, and the checked host API that packs,
// unpacks and quantize-dequantizes whole tensors of rows. Host-only (throws dsv41::Error); the
// per-entry device-usable functions are in formats/packed.h.
//
//   CacheFormat      element  scale        block  entry bytes for dim d   used for
//   kCompressedKvFp4       E2M1     E4M3         16     d/2 + d/16              compressed (global) KV
//   kIndexKeysFp4     E2M1     E8M0 (ceil)  32     d/2 + d/32              indexer keys (and queries)
//   kWindowKvFp8        E4M3     E8M0 (ceil)  32     d + d/32                SWA ring (local state)
//   kBf16            BF16     -            1      2d                      uncompressed ablation
//
// Errors: a dim that is not a multiple of the block, a NaN or +-Inf element (named by row,
// block and element), a byte buffer of the wrong size.
//
// Example:
//   std::vector<uint8_t> bytes = pack_rows(CacheFormat::kCompressedKvFp4, x, rows, 512);
//   std::vector<float> back = unpack_rows(CacheFormat::kCompressedKvFp4, bytes, rows, 512);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::formats {

enum class CacheFormat : uint8_t { kCompressedKvFp4, kIndexKeysFp4, kWindowKvFp8, kBf16 };

struct CacheFormatInfo {
  const char* name;      // stable identifier, used in files and reports
  const char* element;   // element type
  const char* scale;     // scale type ("none" for bf16)
  int block;             // elements per scale
};

const CacheFormatInfo& info(CacheFormat f);
// Parses a name produced by info(f).name; throws naming the accepted names otherwise.
CacheFormat cache_format_from_name(const std::string& name);

// Bytes of one entry (one token's vector of `dim` values); throws if dim is not a positive
// multiple of the format's block.
int entry_bytes(CacheFormat f, int dim);

// x: [rows, dim] fp32 (bf16 values in practice) -> [rows, entry_bytes] packed.
std::vector<uint8_t> pack_rows(CacheFormat f, const std::vector<float>& x, int rows, int dim);
// bytes: [rows, entry_bytes] -> [rows, dim] fp32: bf16 values, exact, or +-Inf where an
// E8M0-scaled value overflows bf16 (formats/qdq.h).
std::vector<float> unpack_rows(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim);
// Whether every entry of a packed buffer holds bytes pack_rows can produce from finite input:
// E4M3 scales positive and finite (0x01..0x7E), E8M0 scales not NaN (0xFF), no E4M3 NaN element,
// no bf16 NaN or Inf. bytes: [rows, entry_bytes] (a wrong size throws). Judges a port's cache under
// any claim: an invalid byte is invalid however the port sums.
struct EntryCheck {
  int64_t rows = 0;
  int64_t invalid = 0;     // entries that do not decode
  int64_t first = -1;      // the first of them (-1: none)
  std::string why;         // its reason, as unpack_rows would throw it
};
EntryCheck check_entries(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim);
// unpack_rows(pack_rows(x)): the value the official code keeps in its bf16 cache.
std::vector<float> qdq_rows(CacheFormat f, const std::vector<float>& x, int rows, int dim);

}  // namespace dsv41::formats
