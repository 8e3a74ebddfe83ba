// base/sha256.h
//
// SHA-256 (FIPS 180-4, §6.2), written from the standard: `dsv41 run` (scenarios/cli/cli_run.cc)
// records the digest of the weights file it ran with in the divergence report
// (RunMeta::weights_sha256, docs/report-schema.md), so a report names the exact bytes behind its
// numbers. The hex digests are those of `sha256sum` (64 lowercase hex digits, most significant
// byte first).
//
// Contract: a message of any length n >= 0 bytes (the standard allows < 2^64 bits; a longer one
// is a dsv41::Error). Sha256 hashes a message given in pieces of any sizes: the digest depends
// only on the concatenated bytes, never on how they were split. Integer arithmetic only, with
// words assembled big-endian explicitly, so the same bits on every platform and run.
// sha256_file_hex reads the file in 1 MiB blocks (memory stays bounded for a weights file of any
// size) and throws a dsv41::Error naming the path when the file cannot be opened or read.
//
// Not a constant-time implementation; it hashes public files, never secrets.
//
// Example:
//   std::string h = sha256_hex(bytes.data(), bytes.size());   // "ba7816bf..." for "abc"
//   std::string w = sha256_file_hex("golden/oracle/weights.safetensors");
//   Sha256 s;
//   s.update(head.data(), head.size());
//   s.update(tail.data(), tail.size());
//   std::string same = to_hex(s.finish());                    // = the hash of head + tail
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dsv41 {

// FIPS 180-4 §4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
// 64 primes (one per round).
inline constexpr std::array<uint32_t, 64> kSha256RoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// FIPS 180-4 §5.3.3: the first 32 bits of the fractional parts of the square roots of the first
// 8 primes (the initial hash value H(0)).
inline constexpr std::array<uint32_t, 8> kSha256InitialHash = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

using Sha256Digest = std::array<uint8_t, 32>;  // H0..H7, each big-endian

// An incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();

  // Appends data[0, n) to the message. n == 0 (data may be null) is a no-op.
  void update(const uint8_t* data, size_t n);

  // Pads the message (§5.1.1: a 1 bit, zeros, the 64-bit bit length) and returns the digest.
  // Calling update() or finish() after finish() is a dsv41::Error.
  Sha256Digest finish();

 private:
  std::array<uint32_t, 8> h_;      // the running hash value H(i)
  std::array<uint8_t, 64> block_;  // [64] bytes of the block being filled
  size_t block_len_ = 0;           // bytes of block_ in use, < 64
  uint64_t message_bytes_ = 0;     // message length so far
  bool finished_ = false;
};

// 64 lowercase hex digits of a digest, most significant byte first (as sha256sum prints it).
std::string to_hex(const Sha256Digest& digest);

// The SHA-256 of data[0, n) as 64 lowercase hex digits.
std::string sha256_hex(const uint8_t* data, size_t n);

// The SHA-256 of the file's bytes as 64 lowercase hex digits, read in 1 MiB blocks.
// A dsv41::Error "sha256: cannot open '<path>'" / "sha256: error reading '<path>'" otherwise.
std::string sha256_file_hex(const std::string& path);

}  // namespace dsv41
