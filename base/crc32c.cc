#include "base/crc32c.h"

#include <array>

namespace dsv41 {
namespace {

// kTables[0][b]: the CRC register after shifting in byte b (reflected: low bit first).
// kTables[k][b]: the same after shifting in b followed by k zero bytes, so eight table lookups
// advance the register by eight bytes at once ("slicing-by-8"; the same function as the
// byte-at-a-time loop, which handles the tail).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) != 0 ? (r >> 1) ^ kCrc32cPolynomial : r >> 1;
    t[0][b] = r;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = make_tables();

uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace

uint32_t crc32c(const uint8_t* data, size_t n, uint32_t previous) {
  const auto& t = kTables;
  uint32_t r = ~previous;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t lo = r ^ load_le32(data + i), hi = load_le32(data + i + 4);
    r = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; i < n; ++i) r = (r >> 8) ^ t[0][(r ^ data[i]) & 0xFFu];
  return ~r;
}

}  // namespace dsv41
