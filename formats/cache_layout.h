// formats/cache_layout.h
//
// How engines arrange and encode cache entries, turned back into canonical entries: the byte work
// behind a port dump's cache layouts (docs/port-dump.md "Cache layouts"; the dump side is
// scenarios/conform/cache_layouts.h). Host only; errors are dsv41::Error with the reason (the
// caller names the key).
//
//   canonical entries       [entries, entry_bytes], entry = [value bytes | scale bytes] (formats/packed.h)
//   block-planar page       n entries as [n x value bytes][n x scale bytes]
//   paged pool              [num_blocks, block_size, entry_bytes] + a block table [n]: logical block
//                           k is physical block table[k]; the entries are the slots in table order
//   sparse-MLA fp8 entries  FlashMLA's (and vLLM's, SGLang's) DeepSeek sparse-MLA fp8 entries, dim d of
//   (dim d, rope r)         which the last r are RoPE (SparseMlaFp8):
//     fp8_ds_mla            [(d - r) E4M3][ceil((d - r) / 128) fp32 scales, little-endian][r bf16]
//                           (FlashMLA V32_FP8Sparse, vLLM kv_cache_dtype fp8_ds_mla; d = 576, r = 64: 656 bytes)
//     fp8_ds_mla_model1     [(d - r) E4M3][r bf16][ceil((d - r) / 64) E8M0 scales, zero-padded to a multiple of 8]
//                           (FlashMLA MODEL1_FP8Sparse, DeepSeek V4; d = 512, r = 64: 448 + 128 + 7 + 1 = 584 bytes;
//                           engines keep it paged block-planar: a page's 576-byte value parts, then its 8-byte scales)
//
// Every decode here also returns, per value, how far the format's rounding may have moved it from
// the value it was packed from (`rounding`), so two caches of different formats can be compared by
// value with a bound that comes from the formats alone (scenarios/conform/cache_layouts.h).
//
// Example:
//   std::vector<uint8_t> planar = to_block_planar(bytes, 40, 72, 64, 8);   // index keys, dim 128
//   assert(from_block_planar(planar, 40, 72, 64, 8) == bytes);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/cache_format.h"

namespace dsv41::formats {

// Value bytes of one entry of `f` with `dim` values (its scales follow them); 0 for bf16 (no scales).
int value_bytes(CacheFormat f, int dim);

// Canonical entries [entries, entry_bytes] rearranged as block-planar pages of `page` entries (the
// last page may hold fewer: its n entries' values, then their scales), and back. value_bytes in
// (0, entry_bytes).
std::vector<uint8_t> to_block_planar(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                     int64_t value_bytes, int64_t page);
std::vector<uint8_t> from_block_planar(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                       int64_t value_bytes, int64_t page);

// A paged pool's entries in block-table order. pool: [num_blocks, block_size, entry_bytes]; the
// slots of blocks table[0], table[1], ... in that order form one sequence, of which the result
// holds `entries` starting at slot `first`: [entries, entry_bytes]. planar_value_bytes > 0: every
// block is block-planar (its block_size entries' values, then their scales, whatever its fill).
// Throws: a table entry outside [0, num_blocks), a block listed twice, first + entries beyond the
// table's slots, a pool of another size.
std::vector<uint8_t> unpage(const std::vector<uint8_t>& pool, int64_t num_blocks, int64_t block_size,
                            int64_t entry_bytes, const std::vector<int32_t>& table, int64_t first, int64_t entries,
                            int64_t planar_value_bytes);
// The inverse (tests, writers): canonical entries written into a pool of num_blocks blocks at the
// table's blocks from slot `first` (every other byte `fill`).
std::vector<uint8_t> page_entries(const std::vector<uint8_t>& bytes, int64_t entries, int64_t entry_bytes,
                                  int64_t num_blocks, int64_t block_size, const std::vector<int32_t>& table,
                                  int64_t first, int64_t planar_value_bytes, uint8_t fill = 0);

// The sparse-MLA fp8 entries (above). The values are split at dim - rope_dim: the first part is
// quantized per tile (128 values, fp32 scale amax / 448, 1 for an all-zero tile; 64 values, E8M0
// scale 2^ceil(log2(max(amax / 448, 1e-4)))), the RoPE part kept as bf16 (exact for bf16 inputs).
enum class SparseMlaFp8 : uint8_t { kV32, kModel1 };
const char* name(SparseMlaFp8 f);  // "fp8_ds_mla", "fp8_ds_mla_model1"
// The entry format of a name, or false when the name is none of them.
bool sparse_mla_fp8_from_name(const std::string& name, SparseMlaFp8& f);
int sparse_mla_fp8_entry_bytes(SparseMlaFp8 f, int dim, int rope_dim);
// Bytes before the scales (block-planar pages split there): kModel1 (d - r) + 2r; kV32 0 (its RoPE
// part follows the scales: no values-then-scales split).
int sparse_mla_fp8_value_bytes(SparseMlaFp8 f, int dim, int rope_dim);
std::vector<uint8_t> pack_sparse_mla_fp8(SparseMlaFp8 f, const std::vector<float>& x, int rows, int dim, int rope_dim);

// Decoded values [rows, dim] and, per value, a bound on |packed-from value - decoded value| that
// the format's rounding allows (0 for bf16 values: a bf16 cache holds the bf16 rows exactly).
struct DecodedRows {
  std::vector<float> values;
  std::vector<float> rounding;
};
// Throws naming the entry and the reason for bytes no packer writes from finite input: a scale
// that is NaN, Inf, zero or negative (E8M0: 0xFF), an E4M3 NaN code, a bf16 NaN or Inf. The E4M3
// values' rounding: s max(|v| 2^-4, 2^-10) (+ the fp32 product's); the RoPE part's: 0.
DecodedRows decode_sparse_mla_fp8(SparseMlaFp8 f, const std::vector<uint8_t>& bytes, int rows, int dim, int rope_dim);
// A CacheFormat's entries (unpack_rows, which throws for invalid bytes) with their rounding bounds:
// E2M1 codes v of scale s: s/4 below 2, s/2 at 2 and 3, s at 4 and 6 (half the wider neighbouring
// gap of the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; 6 also covers an E4M3 scale rounded down by up to
// 2^-4); E4M3 codes: s max(|v| 2^-4, 2^-10) (half an ulp; subnormal step 2^-9); bf16: 0.
DecodedRows decode_with_rounding(CacheFormat f, const std::vector<uint8_t>& bytes, int rows, int dim);

}  // namespace dsv41::formats
