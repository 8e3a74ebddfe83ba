#include "reference/crc32c.h"

#include <array>

namespace dsv41::reference {
namespace {

// table[b] = the CRC register after shifting in byte b (reflected: low bit first).
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) != 0 ? (r >> 1) ^ kCrc32cPolynomial : r >> 1;
    t[b] = r;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(const uint8_t* data, size_t n, uint32_t previous) {
  uint32_t r = ~previous;
  for (size_t i = 0; i < n; ++i) r = (r >> 8) ^ kTable[(r ^ data[i]) & 0xFFu];
  return ~r;
}

}  // namespace dsv41::reference
