// base/crc32c: CRC-32C against published check values, a bit-at-a-time model, and the
// error-detection property the session store relies on (every single-bit error is detected).
//
// Published values:
//   "123456789" -> 0xE3069283: the check value of CRC-32C (CRC-32/ISCSI) in the CRC RevEng
//     catalogue (reveng.sourceforge.io/crc-catalogue) and in RFC 3720's polynomial choice.
//   RFC 3720 (iSCSI) Appendix B.4: 32 bytes of 0x00 -> aa 36 91 8a, 32 bytes of 0xFF ->
//     43 ab a8 62, 0x00..0x1F -> 4e 79 dd 46, 0x1F..0x00 -> 5c db 3f 11, and a 48-byte
//     SCSI Read (10) command PDU -> 56 3a 96 d9 (bytes as sent, i.e. the CRC little-endian).
#include "base/crc32c.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/support/seed.h"

namespace dsv41::reference {
namespace {

uint32_t crc_of(const std::vector<uint8_t>& v) { return crc32c(v.data(), v.size()); }

// The definition, one bit at a time (no table): reflected register, polynomial 0x82F63B78.
uint32_t crc32c_bitwise(const std::vector<uint8_t>& v) {
  uint32_t r = 0xFFFFFFFFu;
  for (uint8_t byte : v) {
    r ^= byte;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) != 0 ? (r >> 1) ^ 0x82F63B78u : r >> 1;
  }
  return r ^ 0xFFFFFFFFu;
}

// A CRC as RFC 3720 prints it (the 4 bytes as sent, least significant first).
uint32_t from_wire(uint8_t b0, uint8_t b1, uint8_t b2, uint8_t b3) {
  return uint32_t{b0} | uint32_t{b1} << 8 | uint32_t{b2} << 16 | uint32_t{b3} << 24;
}

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(reinterpret_cast<const uint8_t*>(s.data()), s.size()), 0xE3069283u);
}

TEST(Crc32c, EmptyMessageIsZero) { EXPECT_EQ(crc32c(nullptr, 0), 0u); }

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
    down[static_cast<size_t>(i)] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc_of(zeros), from_wire(0xaa, 0x36, 0x91, 0x8a));
  EXPECT_EQ(crc_of(ones), from_wire(0x43, 0xab, 0xa8, 0x62));
  EXPECT_EQ(crc_of(up), from_wire(0x4e, 0x79, 0xdd, 0x46));
  EXPECT_EQ(crc_of(down), from_wire(0x5c, 0xdb, 0x3f, 0x11));
  const std::vector<uint8_t> read10_pdu = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
      0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc_of(read10_pdu), from_wire(0x56, 0x3a, 0x96, 0xd9));
}

// Random lengths 0..300 (every table index and byte alignment), from the data seed.
TEST(Crc32c, EqualsTheBitwiseDefinition) {
  std::mt19937_64 rng(test::seed_for("crc32c/bitwise"));
  for (int n = 0; n <= 300; ++n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
    ASSERT_EQ(crc_of(v), crc32c_bitwise(v)) << "length " << n;
  }
}

RC_GTEST_PROP(Crc32cProperty, ContinuingEqualsTheWhole, (const std::vector<uint8_t>& a, const std::vector<uint8_t>& b)) {
  std::vector<uint8_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  RC_ASSERT(crc32c(b.data(), b.size(), crc_of(a)) == crc_of(ab));
}

RC_GTEST_PROP(Crc32cProperty, DetectsEverySingleBitError, (const std::vector<uint8_t>& v)) {
  RC_PRE(!v.empty());
  const uint32_t crc = crc_of(v);
  std::vector<uint8_t> w = v;
  for (size_t bit = 0; bit < 8 * w.size(); ++bit) {
    w[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    RC_ASSERT(crc_of(w) != crc);
    w[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace dsv41::reference
