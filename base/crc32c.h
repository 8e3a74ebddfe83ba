// base/crc32c.h
//
// CRC-32C (Castagnoli), the checksum of iSCSI (RFC 3720), ext4 and SSE4.2's crc32 instruction:
// reflected polynomial 0x82F63B78, initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF. Check value
// CRC-32C("123456789") = 0xE3069283. Like every CRC with this polynomial it detects every
// single-bit error, every burst of up to 32 bits and every odd number of bit errors in a message
// (the session store, docs/session-store.md, protects each section with it).
//
// Table-driven, eight bytes per step (slicing-by-8: the byte-at-a-time table loop, unrolled
// through eight derived tables; tests/base/crc32c_test.cc checks it against the bit-at-a-time
// definition). The same bits on every platform and run (integer arithmetic, bytes assembled
// little-endian explicitly).
//
// Example:
//   uint32_t c = crc32c(bytes.data(), bytes.size());
//   uint32_t same = crc32c(second.data(), second.size(), crc32c(first.data(), first.size()));
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv41 {

inline constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;  // 0x1EDC6F41, bit-reversed

// The CRC-32C of data[0, n). `previous` continues a CRC: crc32c(b, nb, crc32c(a, na)) is the CRC
// of a followed by b; the default 0 starts a new one.
uint32_t crc32c(const uint8_t* data, size_t n, uint32_t previous = 0);

}  // namespace dsv41
