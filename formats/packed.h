// formats/packed.h
//
// Byte layouts of the three packed cache entries (one entry = one token's vector) and their
// pack/unpack. docs/formats.md draws the same layouts.
//
//   entry           for dim d (released d)   bytes                 layout
//   CompressedKvEntry     head_dim (512)           d/2 + d/16   (288)    [d/2 nibble bytes][d/16 E4M3 scales]
//   IndexKeysEntry   index_head_dim (128)     d/2 + d/32   (68)     [d/2 nibble bytes][d/32 E8M0 scales]
//   WindowKvEntry      head_dim (512)           d + d/32     (528)    [d E4M3 bytes][d/32 E8M0 scales]
//
// Nibble order: element 2k is the LOW nibble of byte k, element 2k+1 the high nibble (CUDA's
// __nv_cvt_float2_to_fp4x2, torch float4_e2m1fn_x2, DeepGEMM, TileKernels all agree). Scales
// follow the values, one byte per block, in channel order. No padding anywhere.
//
// pack_*(x, d, out) quantizes d fp32 values (bf16 values in practice) into one entry and returns
// false if some block held NaN/Inf (bytes are still written, deterministically). unpack_*(in,
// d, out) writes the d dequantized values: bf16 values, exact, or +-Inf where an E8M0-scaled
// value overflows bf16 (formats/qdq.h). unpack(pack(x)) equals the QDQ of x bit for bit. The checked host API is formats/cache_format.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/base.h"
#include "formats/qdq.h"

namespace dsv41::formats {

DSV41_HD constexpr int compressed_kv_entry_bytes(int d) { return d / 2 + d / kCompressedKvBlock; }
DSV41_HD constexpr int index_keys_entry_bytes(int d) { return d / 2 + d / kIndexBlock; }
DSV41_HD constexpr int window_kv_entry_bytes(int d) { return d + d / kFp8Block; }
DSV41_HD constexpr int bf16_entry_bytes(int d) { return 2 * d; }

// Fixed-size views for compile-time dims (the released model: D = 512 main, 128 indexer).
template <int D>
struct CompressedKvEntry {
  static_assert(D % kCompressedKvBlock == 0, "main KV dim must be a multiple of 16");
  uint8_t nibbles[D / 2];             // E2M1 pairs, element 2k in the low nibble of byte k
  uint8_t scales[D / kCompressedKvBlock];   // E4M3 scale of elements [16b, 16b + 16)
};
template <int D>
struct IndexKeysEntry {
  static_assert(D % kIndexBlock == 0, "index dim must be a multiple of 32");
  uint8_t nibbles[D / 2];
  uint8_t scales[D / kIndexBlock];    // E8M0 scale of elements [32b, 32b + 32)
};
template <int D>
struct WindowKvEntry {
  static_assert(D % kFp8Block == 0, "SWA dim must be a multiple of 32");
  uint8_t values[D];                  // E4M3
  uint8_t scales[D / kFp8Block];      // E8M0 scale of elements [32b, 32b + 32)
};

static_assert(sizeof(CompressedKvEntry<512>) == 288, "released main KV entry is 288 B");
static_assert(sizeof(IndexKeysEntry<128>) == 68, "released index key entry is 68 B");
static_assert(sizeof(WindowKvEntry<512>) == 528, "released SWA entry is 528 B");
static_assert(sizeof(CompressedKvEntry<512>) == compressed_kv_entry_bytes(512));
static_assert(sizeof(IndexKeysEntry<128>) == index_keys_entry_bytes(128));
static_assert(sizeof(WindowKvEntry<512>) == window_kv_entry_bytes(512));
static_assert(sizeof(CompressedKvEntry<128>) == compressed_kv_entry_bytes(128));  // tiny config
static_assert(sizeof(IndexKeysEntry<64>) == index_keys_entry_bytes(64));

DSV41_HD inline void pack_nibbles(const uint8_t* codes, int n, uint8_t* out) {
  for (int k = 0; k < n / 2; ++k) {
    out[k] = static_cast<uint8_t>((codes[2 * k] & 0xFu) | ((codes[2 * k + 1] & 0xFu) << 4));
  }
}
DSV41_HD inline uint8_t nibble_at(const uint8_t* packed, int i) {
  return static_cast<uint8_t>((packed[i / 2] >> ((i & 1) * 4)) & 0xFu);
}

// ---- main KV (FP4 E2M1 + E4M3 per 16) ----
DSV41_HD inline bool pack_compressed_kv(const float* x, int d, uint8_t* out) {
  bool finite = true;
  uint8_t* scales = out + d / 2;
  for (int b = 0; b < d / kCompressedKvBlock; ++b) {
    uint8_t codes[kCompressedKvBlock];
    finite &= quantize_compressed_kv_block(x + b * kCompressedKvBlock, &scales[b], codes);
    pack_nibbles(codes, kCompressedKvBlock, out + b * kCompressedKvBlock / 2);
  }
  return finite;
}
DSV41_HD inline void unpack_compressed_kv(const uint8_t* in, int d, float* out) {
  const uint8_t* scales = in + d / 2;
  for (int i = 0; i < d; ++i) out[i] = dequant_fp4_e4m3(nibble_at(in, i), scales[i / kCompressedKvBlock]);
}

// ---- indexer keys/queries (FP4 E2M1 + E8M0 per 32) ----
DSV41_HD inline bool pack_index_keys(const float* x, int d, uint8_t* out) {
  bool finite = true;
  uint8_t* scales = out + d / 2;
  for (int b = 0; b < d / kIndexBlock; ++b) {
    uint8_t codes[kIndexBlock];
    finite &= quantize_index_block(x + b * kIndexBlock, &scales[b], codes);
    pack_nibbles(codes, kIndexBlock, out + b * kIndexBlock / 2);
  }
  return finite;
}
DSV41_HD inline void unpack_index_keys(const uint8_t* in, int d, float* out) {
  const uint8_t* scales = in + d / 2;
  for (int i = 0; i < d; ++i) out[i] = dequant_fp4_e8m0(nibble_at(in, i), scales[i / kIndexBlock]);
}

// ---- SWA KV (FP8 E4M3 + E8M0 per 32) ----
DSV41_HD inline bool pack_window_kv(const float* x, int d, uint8_t* out) {
  bool finite = true;
  uint8_t* scales = out + d;
  for (int b = 0; b < d / kFp8Block; ++b) {
    finite &= quantize_fp8_block(x + b * kFp8Block, &scales[b], out + b * kFp8Block);
  }
  return finite;
}
DSV41_HD inline void unpack_window_kv(const uint8_t* in, int d, float* out) {
  const uint8_t* scales = in + d;
  for (int i = 0; i < d; ++i) out[i] = dequant_fp8_e8m0(in[i], scales[i / kFp8Block]);
}

// ---- bf16 (uncompressed reference / ablation format) ----
DSV41_HD inline bool pack_bf16(const float* x, int d, uint8_t* out) {
  bool finite = true;
  for (int i = 0; i < d; ++i) {
    const uint16_t c = bf16_encode(x[i]);
    finite &= (c & 0x7F80u) != 0x7F80u;
    out[2 * i] = static_cast<uint8_t>(c & 0xFFu);  // little endian
    out[2 * i + 1] = static_cast<uint8_t>(c >> 8);
  }
  return finite;
}
DSV41_HD inline void unpack_bf16(const uint8_t* in, int d, float* out) {
  for (int i = 0; i < d; ++i) out[i] = bf16_decode(in[2 * i] | (uint32_t{in[2 * i + 1]} << 8));
}

}  // namespace dsv41::formats
