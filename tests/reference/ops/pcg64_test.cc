// reference/ops/pcg64: numpy's SeedSequence, PCG64 and Generator.integers(int64), bit for bit.
//
// Expected values: printed by numpy 1.24.2 (Debian bookworm's python3-numpy, an implementation
// independent of this file) with the one-liners quoted next to each table, e.g.
//   python3 -c "from numpy.random import SeedSequence as S; print([hex(x) for x in S(10007).pool])"
// The Engram multipliers of the oracle (engram_test.cc) are a second, end-to-end check.
#include "reference/ops/pcg64.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "base/error.h"

namespace dsv41::reference {
namespace {

struct SeedCase {
  uint64_t entropy;
  std::array<uint32_t, 4> pool;   // SeedSequence(e).pool
  std::array<uint64_t, 4> state;  // SeedSequence(e).generate_state(4, np.uint64)
  std::array<uint32_t, 3> words;  // SeedSequence(e).generate_state(3, np.uint32)
};

// Entropies: 0 (the single word 0), the Engram seeds of layers 1 and 14 (one word), a two-word
// integer and 2^64-1 (two words, both all ones).
const SeedCase kSeedCases[] = {
    {0,
     {0xfe40eb07, 0x4f363a36, 0x4eb2009d, 0xc89a7aa7},
     {0xdb2cd7e7b0f478be, 0xabf4641a2c71ba49, 0x20c6ed6d9d7b8d41, 0x2c4099de223c39d4},
     {0xb0f478be, 0xdb2cd7e7, 0x2c71ba49}},
    {10007,
     {0xf1a1018d, 0xa7c60c02, 0xfd15d50a, 0x03b81232},
     {0x77d32a348ad70d07, 0x993ed609b84a4fa5, 0xd5f972dec8698e49, 0x7d79ebaebcf148de},
     {0x8ad70d07, 0x77d32a34, 0xb84a4fa5}},
    {140098,
     {0x7097f09f, 0xc71373b7, 0x148492af, 0x9681c6c4},
     {0xdb5869feeeccf2be, 0xad465727d9cf3645, 0x5155d26378b6bab4, 0x9f9e49df66ff1c85},
     {0xeeccf2be, 0xdb5869fe, 0xd9cf3645}},
    {1099511640121,  // 2^40 + 12345
     {0xde77fde9, 0xef8d7408, 0x70f78ef5, 0x18ec91aa},
     {0xb3645411ceea45fe, 0x7a13d65c96aff0ff, 0x089f970a9b604084, 0x6a3a513560725972},
     {0xceea45fe, 0xb3645411, 0x96aff0ff}},
    {18446744073709551615ull,
     {0xfaf3ecf4, 0xfa0f8930, 0xe9f89a67, 0x0e23d1f9},
     {0xaebca151928cad0d, 0x119c30448638dc7a, 0x1bbb155659e642a7, 0xa76b11e3e8c4a8f6},
     {0x928cad0d, 0xaebca151, 0x8638dc7a}},
};

TEST(Pcg64SeedSequence, PoolAndGeneratedStateMatchNumpy) {
  for (const SeedCase& c : kSeedCases) {
    SCOPED_TRACE(testing::Message() << "entropy " << c.entropy);
    const SeedSequence s(c.entropy);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(s.pool()[i], c.pool[i]) << "pool word " << i;
    const std::vector<uint64_t> st = s.generate_state_u64(4);
    ASSERT_EQ(st.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(st[i], c.state[i]) << "u64 word " << i;
    const std::vector<uint32_t> w = s.generate_state_u32(3);
    ASSERT_EQ(w.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(w[i], c.words[i]) << "u32 word " << i;
  }
}

// PCG64(10007).state: {'state': 0x3b34af76..., 'inc': 0xabf2e5bd...} after seeding.
TEST(Pcg64Generator, SeededStateMatchesNumpy) {
  const Pcg64 g = Pcg64::from_seed(10007);
  EXPECT_EQ(g.state_hi(), 0x3b34af7676e8ddd5ull);
  EXPECT_EQ(g.state_lo(), 0x556a026c98a77d27ull);
  EXPECT_EQ(g.inc_hi(), 0xabf2e5bd90d31c92ull);
  EXPECT_EQ(g.inc_lo(), 0xfaf3d75d79e291bdull);
  EXPECT_FALSE(g.has_u32());
}

// PCG64(seed).random_raw(n).
TEST(Pcg64Generator, RawOutputsMatchNumpy) {
  struct RawCase {
    uint64_t seed;
    std::vector<uint64_t> raw;
  };
  const RawCase cases[] = {
      {10007,
       {0xd2c3f84026661e33, 0x0d4fb6969eb57435, 0x62e6e1c58c3bd72b, 0xcb7dd1a94ca96343,
        0x6de577284ec99078}},
      {0, {0xa30febcfd9c2825f, 0x4510bdf882d9d721, 0x0a7d3da94ecde8b8}},
      {42, {0xc621fbcd16d92688, 0x705a5661a791ffc1, 0xdbcd12c26eda1624}},
  };
  for (const RawCase& c : cases) {
    Pcg64 g = Pcg64::from_seed(c.seed);
    for (size_t i = 0; i < c.raw.size(); ++i) {
      EXPECT_EQ(g.next_u64(), c.raw[i]) << "seed " << c.seed << " output " << i;
    }
  }
}

// next_u32 serves the low half of a 64-bit output, then its buffered high half:
// Generator(PCG64(42)).integers(0, 2**32, 5, np.int64) (the rng == 0xFFFFFFFF path).
TEST(Pcg64Generator, Next32IsLowThenHighHalf) {
  Pcg64 g = Pcg64::from_seed(42);
  const std::vector<int64_t> got = generator_integers_i64(g, 0, int64_t{1} << 32, 5);
  const std::vector<int64_t> want = {383329928, 3324115917, 2811363265, 1884968545, 1859786276};
  EXPECT_EQ(got, want);
  EXPECT_EQ(static_cast<uint64_t>(want[0]) | static_cast<uint64_t>(want[1]) << 32,
            0xc621fbcd16d92688ull);  // = the first raw output
  EXPECT_TRUE(g.has_u32());          // 5 halves drawn: the 6th is buffered
}

// One generator through every path in sequence, so the buffered half carries over between calls:
//   g = Generator(PCG64(42))
//   g.integers(0, 1000, 5)            32-bit Lemire        [89 773 654 438 433]
//   g.integers(0, 10**15, 2)          64-bit Lemire        [697368029059363 94177347887649]
//   g.integers(-5, 7, 3)              32-bit, offset       [5 1 6]
//   g.integers(5, 6, 2)               rng 0: no draw       [5 5]
//   g.integers(-2**63, 2**63-1, 2)    64-bit Lemire, rng 2^64-2
//   g.integers(-2**63, 2**63-1, 2, endpoint=True)  full range = raw next_u64: the state after
//                                     the 64-bit Lemire draws continues as numpy's
TEST(Pcg64Integers, EveryPathMatchesNumpyInSequence) {
  Pcg64 g = Pcg64::from_seed(42);
  EXPECT_EQ(generator_integers_i64(g, 0, 1000, 5), (std::vector<int64_t>{89, 773, 654, 438, 433}));
  EXPECT_EQ(generator_integers_i64(g, 0, 1000000000000000, 2),
            (std::vector<int64_t>{697368029059363, 94177347887649}));
  EXPECT_EQ(generator_integers_i64(g, -5, 7, 3), (std::vector<int64_t>{5, 1, 6}));
  EXPECT_EQ(generator_integers_i64(g, 5, 6, 2), (std::vector<int64_t>{5, 5}));
  constexpr int64_t kMin = INT64_MIN;
  constexpr int64_t kMax = INT64_MAX;
  EXPECT_EQ(generator_integers_i64(g, kMin, kMax, 2),
            (std::vector<int64_t>{4817177250100823152, 5276955028067489599}));
  // endpoint=True over the whole int64 range is kMin + next_u64() in numpy.
  Pcg64 copy = g;
  const uint64_t r0 = copy.next_u64();
  const uint64_t r1 = copy.next_u64();
  EXPECT_EQ(static_cast<int64_t>(static_cast<uint64_t>(kMin) + r0), -6860092642535747309);
  EXPECT_EQ(static_cast<int64_t>(static_cast<uint64_t>(kMin) + r1), -915217906097603218);
}

TEST(Pcg64Integers, RejectsEmptyRangeAndNegativeSize) {
  Pcg64 g = Pcg64::from_seed(1);
  EXPECT_THROW(generator_integers_i64(g, 3, 3, 1), Error);
  EXPECT_THROW(generator_integers_i64(g, 0, 10, -1), Error);
  EXPECT_TRUE(generator_integers_i64(g, 0, 10, 0).empty());
}

// Lemire's method is unbiased and in range: a small range over many draws hits every value and
// never leaves [low, high).
TEST(Pcg64Integers, SmallRangeStaysInRangeAndCoversIt) {
  Pcg64 g = Pcg64::from_seed(7);
  const std::vector<int64_t> v = generator_integers_i64(g, -3, 4, 7000);
  std::array<int, 7> hits{};
  for (int64_t x : v) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++hits[static_cast<size_t>(x + 3)];
  }
  for (int h : hits) EXPECT_GT(h, 800);  // 1000 expected each; 800 is > 6 sigma below
}

}  // namespace
}  // namespace dsv41::reference
