// base/sha256: SHA-256 against the standard's example vectors, against coreutils'
// `sha256sum` at every padding edge, against itself when the message comes in pieces, and on
// files: sha256_file_hex equals the in-memory hash across its 1 MiB read blocks, reproduces the
// oracle weights' entry of golden/oracle/SHA256SUMS, and names the path when it cannot read.
//
// Published values (typed from the documents, not produced by this code):
//   FIPS 180-2 Appendix B (the NIST example computations): "abc" (B.1, one block), the 448-bit
//     "abcdbcdecdefdefg..." (B.2, padding spills into a second block), one million 'a' (B.3).
//   NIST CAVP SHA256ShortMsg.rsp, Len = 0: the empty message.
//   NIST CSRC "SHA256" example values: the 896-bit "abcdefghbcdefghi..." message (two blocks of
//     message, a third of padding).
//
// Lengths, each chosen for a path of Sha256::finish (§5.1.1 padding: 0x80, zeros to 56 mod 64,
// the 8-byte bit length): 55 (the last length whose padding fits one block), 56 (the 0x80 byte
// fits, the length does not: two blocks), 63 (only the 0x80 byte fits), 64 (exactly one block:
// padding is a whole block), 65 (one byte into the second block), plus 0, 1, 119, 120, 127, 128
// (the same edges one block later). Random bytes from the printed data seed (DSV41_SEED
// overrides).
#include "base/sha256.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/support/seed.h"

namespace dsv41::scenarios {
namespace {

namespace fs = std::filesystem;

std::string hex_of(const std::string& s) {
  return sha256_hex(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
std::string hex_of(const std::vector<uint8_t>& v) { return sha256_hex(v.data(), v.size()); }

// A well-formed digest: 64 lowercase hex digits, not all zero (a hash that was never computed).
void expect_digest_shape(const std::string& h) {
  ASSERT_EQ(h.size(), 64u) << h;
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
      << h;
  EXPECT_NE(h, std::string(64, '0'));
}

std::vector<uint8_t> random_bytes(const std::string& name, size_t n) {
  std::mt19937_64 rng(test::seed_for(name + "/n=" + std::to_string(n)));
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A per-process directory for the running test, removed when it passes.
class Sha256Files : public testing::Test {
 protected:
  std::string scratch() const {
    const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir =
        testing::TempDir() + "/dsv41_sha256_test_" + std::to_string(::getpid()) + "_" + t->name();
    fs::create_directories(dir);
    return dir;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(scratch());
  }
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string path = scratch() + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    EXPECT_TRUE(out.good()) << path;
    return path;
  }
};

// ---- the standard's constants, from their definition ----

using u128 = unsigned __int128;

// floor(x^(1/k)) for k = 2 or 3, by bisection on exact 128-bit integers.
uint64_t integer_root(u128 x, int k) {
  uint64_t lo = 0, hi = uint64_t{1} << 40;  // every root below is < 2^36
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    u128 p = 1;
    for (int i = 0; i < k; ++i) p *= mid;
    if (p <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

std::vector<uint64_t> first_primes(size_t count) {
  std::vector<uint64_t> primes;
  for (uint64_t n = 2; primes.size() < count; ++n) {
    if (std::none_of(primes.begin(), primes.end(), [n](uint64_t p) { return n % p == 0; })) primes.push_back(n);
  }
  return primes;
}

// §4.2.2 / §5.3.3: the first 32 fractional bits of cbrt(p) are floor(cbrt(p * 2^96)) mod 2^32,
// those of sqrt(p) are floor(sqrt(p * 2^64)) mod 2^32: exact integer roots, no floating point.
TEST(Sha256, ConstantsAreTheFractionalBitsOfPrimeRoots) {
  const std::vector<uint64_t> primes = first_primes(64);
  ASSERT_EQ(primes.back(), 311u);  // the 64th prime
  for (size_t i = 0; i < 64; ++i) {
    const uint32_t k = static_cast<uint32_t>(integer_root(static_cast<u128>(primes[i]) << 96, 3));
    EXPECT_EQ(kSha256RoundConstants[i], k) << "K[" << i << "], cube root of " << primes[i];
  }
  for (size_t i = 0; i < 8; ++i) {
    const uint32_t h = static_cast<uint32_t>(integer_root(static_cast<u128>(primes[i]) << 64, 2));
    EXPECT_EQ(kSha256InitialHash[i], h) << "H0[" << i << "], square root of " << primes[i];
  }
}

// ---- published vectors ----

TEST(Sha256, EmptyMessage) {
  const std::string h = sha256_hex(nullptr, 0);
  expect_digest_shape(h);
  EXPECT_EQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Fips180_2_B1_OneBlock) {
  const std::string h = hex_of(std::string("abc"));
  expect_digest_shape(h);
  EXPECT_EQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, Fips180_2_B2_TwoBlocks) {
  const std::string h = hex_of(std::string("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"));
  expect_digest_shape(h);
  EXPECT_EQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, Fips180_2_B3_OneMillionA) {
  const std::string h = hex_of(std::string(1000000, 'a'));
  expect_digest_shape(h);
  EXPECT_EQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, NistExample896Bits) {
  const std::string h = hex_of(std::string(
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"));
  expect_digest_shape(h);
  EXPECT_EQ(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

// ---- padding edges against coreutils ----

bool have_sha256sum() { return std::system("command -v sha256sum >/dev/null 2>&1") == 0; }

// sha256sum's digest of a file (the first field of its output line).
std::string sha256sum_of(const std::string& path, const std::string& out_path) {
  const std::string cmd = "sha256sum '" + path + "' > '" + out_path + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out_path);
  std::string digest;
  in >> digest;
  return digest;
}

TEST_F(Sha256Files, PaddingEdgesAgreeWithSha256sum) {
  if (!have_sha256sum()) GTEST_SKIP() << "sha256sum (coreutils) not found";
  for (const size_t n : {size_t{0}, size_t{1}, size_t{55}, size_t{56}, size_t{63}, size_t{64}, size_t{65},
                         size_t{119}, size_t{120}, size_t{127}, size_t{128}}) {
    SCOPED_TRACE("length " + std::to_string(n));
    const std::vector<uint8_t> bytes = random_bytes("sha256/padding", n);
    const std::string path = write("m" + std::to_string(n) + ".bin", bytes);
    const std::string expected = sha256sum_of(path, scratch() + "/sum.txt");
    expect_digest_shape(expected);
    EXPECT_EQ(hex_of(bytes), expected);
    EXPECT_EQ(sha256_file_hex(path), expected);
  }
}

// ---- pieces ----

// Every split of a 200-byte message into two pieces (both padding paths, every block offset).
TEST(Sha256, EveryTwoPieceSplitEqualsTheWhole) {
  const std::vector<uint8_t> m = random_bytes("sha256/split", 200);
  const std::string whole = hex_of(m);
  expect_digest_shape(whole);
  for (size_t cut = 0; cut <= m.size(); ++cut) {
    Sha256 s;
    s.update(m.data(), cut);
    s.update(m.data() + cut, m.size() - cut);
    ASSERT_EQ(to_hex(s.finish()), whole) << "cut at " << cut;
  }
}

RC_GTEST_PROP(Sha256Property, AnySplitEqualsTheWhole,
              (const std::vector<uint8_t>& m, const std::vector<size_t>& cuts)) {
  Sha256 s;
  size_t at = 0;
  for (const size_t c : cuts) {
    const size_t len = m.empty() ? 0 : c % (m.size() - at + 1);
    s.update(m.data() + at, len);
    at += len;
  }
  s.update(m.data() + at, m.size() - at);
  RC_ASSERT(to_hex(s.finish()) == sha256_hex(m.data(), m.size()));
}

TEST(Sha256, DifferentMessagesDiffer) {
  // One flipped bit changes the digest (the hash is not a constant or a length function).
  std::vector<uint8_t> m = random_bytes("sha256/flip", 100);
  const std::string a = hex_of(m);
  m[37] ^= 0x10;
  EXPECT_NE(hex_of(m), a);
}

TEST(Sha256, UseAfterFinishIsAnError) {
  Sha256 s;
  (void)s.finish();
  const uint8_t b = 0;
  EXPECT_THROW(s.update(&b, 1), dsv41::Error);
  EXPECT_THROW((void)s.finish(), dsv41::Error);
}

// ---- files ----

// 1 MiB - 1, 1 MiB, 1 MiB + 17, 2 MiB + 64: the read loop's short last block, a file that ends
// exactly on a block (the next read returns 0 bytes), one byte block tail, two full blocks.
TEST_F(Sha256Files, FileEqualsTheHashOfItsBytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  for (const size_t n : {kMiB - 1, kMiB, kMiB + 17, 2 * kMiB + 64}) {
    SCOPED_TRACE("size " + std::to_string(n));
    const std::vector<uint8_t> bytes = random_bytes("sha256/file", n);
    const std::string path = write("f.bin", bytes);
    const std::string h = sha256_file_hex(path);
    expect_digest_shape(h);
    EXPECT_EQ(h, hex_of(bytes));
  }
}

// The oracle weights' digest equals their entry in golden/oracle/SHA256SUMS (sha256sum's list
// of the oracle copies, written when they were copied; golden/README.md).
TEST(Sha256, OracleWeightsMatchSha256Sums) {
  const std::string dir = DSV41_ORACLE_DIR;
  std::ifstream sums(dir + "/SHA256SUMS");
  ASSERT_TRUE(sums.good()) << dir << "/SHA256SUMS";
  std::string line, expected;
  while (std::getline(sums, line)) {
    std::istringstream fields(line);
    std::string digest, name;
    fields >> digest >> name;
    if (name == "weights.safetensors" || name == "*weights.safetensors") expected = digest;
  }
  ASSERT_FALSE(expected.empty()) << "no weights.safetensors entry in " << dir << "/SHA256SUMS";
  expect_digest_shape(expected);
  EXPECT_EQ(sha256_file_hex(dir + "/weights.safetensors"), expected);
}

TEST_F(Sha256Files, UnreadablePathsThrowNamingThePath) {
  const std::string missing = scratch() + "/no_such_weights.safetensors";
  try {
    (void)sha256_file_hex(missing);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // A directory opens but cannot be read.
  const std::string dir = scratch();
  try {
    (void)sha256_file_hex(dir);
    ADD_FAILURE() << "no error for a directory";
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41::scenarios
