#include "base/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "base/error.h"

namespace dsv41 {
namespace {

// §3.2 / §4.1.2: ROTR^n, and the four functions of SHA-256 (all on 32-bit words, mod 2^32).
constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
constexpr uint32_t ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
constexpr uint32_t maj(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (x & z) ^ (y & z); }
constexpr uint32_t big_sigma0(uint32_t x) { return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22); }
constexpr uint32_t big_sigma1(uint32_t x) { return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25); }
constexpr uint32_t small_sigma0(uint32_t x) { return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3); }
constexpr uint32_t small_sigma1(uint32_t x) { return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10); }

uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// §6.2.2: one block M(i) of 64 bytes updates the hash value H(i-1) -> H(i).
void compress(std::array<uint32_t, 8>& h, const uint8_t* block) {
  // 1. The message schedule W_0..W_63.
  std::array<uint32_t, 64> w{};
  for (int t = 0; t < 16; ++t) w[static_cast<size_t>(t)] = load_be32(block + 4 * t);
  for (size_t t = 16; t < 64; ++t) {
    w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
  }
  // 2. The working variables a..h from H(i-1).
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  // 3. 64 rounds.
  for (size_t t = 0; t < 64; ++t) {
    const uint32_t t1 = hh + big_sigma1(e) + ch(e, f, g) + kSha256RoundConstants[t] + w[t];
    const uint32_t t2 = big_sigma0(a) + maj(a, b, c);
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  // 4. H(i) = H(i-1) + the working variables.
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

constexpr size_t kFileBlockBytes = size_t{1} << 20;  // sha256_file_hex reads 1 MiB at a time

}  // namespace

Sha256::Sha256() : h_(kSha256InitialHash), block_{} {}

void Sha256::update(const uint8_t* data, size_t n) {
  DSV41_CHECK(!finished_, "Sha256::update after finish");
  if (n == 0) return;
  // The bit length must fit the 64-bit length field of the padding (§5.1.1).
  constexpr uint64_t kMaxBytes = (uint64_t{1} << 61) - 1;
  DSV41_CHECK(n <= kMaxBytes - message_bytes_, "SHA-256 message longer than 2^64 - 1 bits: ", message_bytes_,
              " + ", n, " bytes");
  message_bytes_ += n;
  size_t i = 0;
  if (block_len_ > 0) {  // top up the partial block first
    const size_t take = std::min(n, block_.size() - block_len_);
    std::memcpy(block_.data() + block_len_, data, take);
    block_len_ += take;
    i = take;
    if (block_len_ < block_.size()) return;
    compress(h_, block_.data());
    block_len_ = 0;
  }
  for (; i + 64 <= n; i += 64) compress(h_, data + i);  // whole blocks straight from the input
  std::memcpy(block_.data(), data + i, n - i);
  block_len_ = n - i;
}

Sha256Digest Sha256::finish() {
  DSV41_CHECK(!finished_, "Sha256::finish called twice");
  finished_ = true;
  // §5.1.1: append the bit 1 (byte 0x80), then k zero bits so the length is 448 mod 512 bits,
  // then the message length in bits as a 64-bit big-endian integer. One block, or two when
  // fewer than 8 bytes are left after the 0x80 byte.
  const uint64_t bit_length = message_bytes_ * 8;
  block_[block_len_++] = 0x80;
  if (block_len_ > 56) {
    std::fill(block_.begin() + static_cast<std::ptrdiff_t>(block_len_), block_.end(), uint8_t{0});
    compress(h_, block_.data());
    block_len_ = 0;
  }
  std::fill(block_.begin() + static_cast<std::ptrdiff_t>(block_len_), block_.begin() + 56, uint8_t{0});
  for (int k = 0; k < 8; ++k) block_[static_cast<size_t>(56 + k)] = static_cast<uint8_t>(bit_length >> (56 - 8 * k));
  compress(h_, block_.data());
  // §6.2.2: the digest is H0..H7, each big-endian.
  Sha256Digest out{};
  for (size_t j = 0; j < 8; ++j) {
    for (size_t k = 0; k < 4; ++k) out[4 * j + k] = static_cast<uint8_t>(h_[j] >> (24 - 8 * k));
  }
  return out;
}

std::string to_hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * digest.size());
  for (const uint8_t b : digest) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0xF]);
  }
  return s;
}

std::string sha256_hex(const uint8_t* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return to_hex(s.finish());
}

std::string sha256_file_hex(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) DSV41_FAIL("sha256: cannot open '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> buf(kFileBlockBytes);  // [1 MiB] the block being hashed
  Sha256 s;
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), f.get());
    s.update(buf.data(), got);
    if (got < buf.size()) {
      // A short read is the end of the file or an error (e.g. a directory: EISDIR).
      if (std::ferror(f.get()) != 0) DSV41_FAIL("sha256: error reading '", path, "': ", std::strerror(errno));
      break;
    }
  }
  return to_hex(s.finish());
}

}  // namespace dsv41
