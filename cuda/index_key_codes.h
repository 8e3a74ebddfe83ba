// cuda/index_key_codes.h: how the production fused indexer (cuda/index_select.cu) turns one packed
// index-key entry (formats/packed.h IndexKeysEntry: E2M1 nibbles, one E8M0 scale per 32 channels)
// into int8 codes times a power of two, host and device (DSV41_HD), so that the host tests check the
// rule against the reference's unpack (tests/cuda/index_select_production_test.cc,
// IndexKeyCodes.*: runs without a device).
//
//   value of channel c in block b = e2m1(m_c) * 2^(s_b - 127) = 2 m_c * 2^(s_b - 128)
//   s_min = the smallest s_b over the blocks holding a nonzero code (128 for an all-zero key)
//   code_c = 2 m_c << (s_b - s_min)      (|code| <= 12 * 8 = 96 when the scales span <= x8)
//   value  = code_c * 2^(s_min - 128)
// A key is encodable when no scale byte is the NaN code 0xFF, the nonzero blocks' scales span at
// most a factor 8 (s_max - s_min <= 3) and |s_min - 128| <= 30 (cuda/indexer_mma.cuh kEBound).
#pragma once

#include <cstdint>

#include "base/base.h"

namespace dsv41::gpu::index_key_codes {

// Whether a block's 16 nibble bytes (as 4 little-endian words) hold a nonzero magnitude.
DSV41_HD inline bool block_nonzero(const uint32_t (&w)[4]) {
  return ((w[0] | w[1] | w[2] | w[3]) & 0x77777777u) != 0;
}

// The 32 int8 codes of one block (channel 4 i + c in byte c of out[i]): 2 m << shift, shift 0..3.
DSV41_HD inline void expand_block(const uint32_t (&w)[4], int shift, uint32_t (&out)[8]) {
  for (int i = 0; i < 8; ++i) {
    uint32_t word = 0;
    for (int c = 0; c < 4; ++c) {
      const int ch = 4 * i + c;  // channel within the block: nibble ch of its 16 bytes
      const uint32_t code = (w[ch / 8] >> (4 * (ch % 8))) & 0xFu;
      const int mag = static_cast<int>((0xC8643210u >> (4 * (code & 7u))) & 0xFu) << shift;  // |2m| << shift
      word |= (static_cast<uint32_t>(code & 8u ? -mag : mag) & 0xFFu) << (8 * c);
    }
    out[i] = word;
  }
}

// Whether a key with these extreme scales of its nonzero blocks (s_min = 255, s_max = 0 when none)
// and a NaN scale anywhere is encodable; s_min is replaced by 128 for an all-zero key.
DSV41_HD inline bool key_encodable(int& s_min, int s_max, bool nan_scale) {
  if (s_min == 255 && s_max == 0) s_min = s_max = 128;
  return !nan_scale && s_max - s_min <= 3 && s_min - 128 >= -30 && s_min - 128 <= 30;
}

}  // namespace dsv41::gpu::index_key_codes
