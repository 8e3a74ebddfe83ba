// reference/ops/pcg64.cc: numpy's SeedSequence, PCG64 and Generator.integers(int64) (see pcg64.h).
#include "reference/ops/pcg64.h"

#include "base/error.h"

namespace dsv41::reference {
namespace {

// 128-bit unsigned arithmetic (GCC/Clang extension; __extension__ keeps -Wpedantic quiet).
__extension__ using Uint128 = unsigned __int128;

constexpr Uint128 make_u128(uint64_t hi, uint64_t lo) {
  return (static_cast<Uint128>(hi) << 64) | lo;
}
constexpr uint64_t hi64(Uint128 v) { return static_cast<uint64_t>(v >> 64); }
constexpr uint64_t lo64(Uint128 v) { return static_cast<uint64_t>(v); }

// ---- SeedSequence constants (numpy/random/bit_generator.pyx) ----
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;  // 4 * sizeof(uint32) / 2 bytes -> bits

// hashmix: hashes `value` with the running constant, which advances by kMultA on every call.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

// mix: combines two words (all arithmetic mod 2^32).
uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// ---- PCG64 (XSL-RR 128/64) ----
constexpr Uint128 kPcgMultiplier = make_u128(0x2360ED051FC65DA4ull, 0x4385DF649FCCF645ull);

}  // namespace

SeedSequence::SeedSequence(uint64_t entropy) {
  // The entropy integer as little-endian uint32 words; 0 is the single word 0.
  std::vector<uint32_t> words;
  if (entropy == 0) words.push_back(0);
  for (uint64_t n = entropy; n > 0; n >>= 32) words.push_back(static_cast<uint32_t>(n));

  uint32_t hash_const = kInitA;
  // Fill the pool: entropy words first, then hashes of 0.
  for (int i = 0; i < kPoolSize; ++i) {
    const uint32_t w = i < static_cast<int>(words.size()) ? words[static_cast<size_t>(i)] : 0u;
    pool_[static_cast<size_t>(i)] = hashmix(w, hash_const);
  }
  // Mix every pool word into every other one, sources in order.
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src == dst) continue;
      pool_[static_cast<size_t>(dst)] = mix(pool_[static_cast<size_t>(dst)],
                                            hashmix(pool_[static_cast<size_t>(src)], hash_const));
    }
  }
  // Entropy beyond the pool size is mixed into every pool word.
  for (size_t src = kPoolSize; src < words.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      pool_[static_cast<size_t>(dst)] =
          mix(pool_[static_cast<size_t>(dst)], hashmix(words[src], hash_const));
    }
  }
}

std::vector<uint32_t> SeedSequence::generate_state_u32(int n_words) const {
  DSV41_CHECK(n_words >= 0, "generate_state: negative word count ", n_words);
  std::vector<uint32_t> state(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool_[static_cast<size_t>(i % kPoolSize)];  // the pool, cycled
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    state[static_cast<size_t>(i)] = v;
  }
  return state;
}

std::vector<uint64_t> SeedSequence::generate_state_u64(int n_words) const {
  const std::vector<uint32_t> w = generate_state_u32(2 * n_words);
  std::vector<uint64_t> out(static_cast<size_t>(n_words));
  for (size_t k = 0; k < out.size(); ++k) {
    out[k] = static_cast<uint64_t>(w[2 * k]) | (static_cast<uint64_t>(w[2 * k + 1]) << 32);
  }
  return out;
}

Pcg64 Pcg64::from_seed(uint64_t entropy) { return from_seed_sequence(SeedSequence(entropy)); }

Pcg64 Pcg64::from_seed_sequence(const SeedSequence& seq) {
  const std::vector<uint64_t> s = seq.generate_state_u64(4);
  return Pcg64(s[0], s[1], s[2], s[3]);
}

Pcg64::Pcg64(uint64_t initstate_hi, uint64_t initstate_lo, uint64_t initseq_hi,
             uint64_t initseq_lo) {
  const Uint128 inc = (make_u128(initseq_hi, initseq_lo) << 1) | 1u;
  inc_hi_ = hi64(inc);
  inc_lo_ = lo64(inc);
  state_hi_ = state_lo_ = 0;
  step();
  const Uint128 s = make_u128(state_hi_, state_lo_) + make_u128(initstate_hi, initstate_lo);
  state_hi_ = hi64(s);
  state_lo_ = lo64(s);
  step();
}

void Pcg64::step() {
  const Uint128 s = make_u128(state_hi_, state_lo_) * kPcgMultiplier + make_u128(inc_hi_, inc_lo_);
  state_hi_ = hi64(s);
  state_lo_ = lo64(s);
}

uint64_t Pcg64::next_u64() {
  step();
  const uint64_t x = state_hi_ ^ state_lo_;                     // xor-shift-low: fold the halves
  const unsigned rot = static_cast<unsigned>(state_hi_ >> 58);  // state >> 122
  return (x >> rot) | (x << ((64u - rot) & 63u));               // rotate right
}

uint32_t Pcg64::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t next = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

namespace {

// numpy's buffered_bounded_lemire_uint32: a value in [0, rng], rng < 0xFFFFFFFF.
uint32_t bounded_lemire_u32(Pcg64& gen, uint32_t rng) {
  const uint32_t rng_excl = rng + 1u;
  uint64_t m = static_cast<uint64_t>(gen.next_u32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (0xFFFFFFFFu - rng) % rng_excl;  // 2^32 mod rng_excl
    while (leftover < threshold) {
      m = static_cast<uint64_t>(gen.next_u32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

// numpy's bounded_lemire_uint64: a value in [0, rng], 0xFFFFFFFF < rng <= 2^64 - 2 (the most
// an exclusive int64 range gives; numpy's full-range rng = 2^64 - 1 needs endpoint=True).
uint64_t bounded_lemire_u64(Pcg64& gen, uint64_t rng) {
  const uint64_t rng_excl = rng + 1u;
  Uint128 m = static_cast<Uint128>(gen.next_u64()) * rng_excl;
  uint64_t leftover = lo64(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (~uint64_t{0} - rng) % rng_excl;  // 2^64 mod rng_excl
    while (leftover < threshold) {
      m = static_cast<Uint128>(gen.next_u64()) * rng_excl;
      leftover = lo64(m);
    }
  }
  return hi64(m);
}

}  // namespace

std::vector<int64_t> generator_integers_i64(Pcg64& gen, int64_t low, int64_t high, int64_t count) {
  DSV41_CHECK(count >= 0, "Generator.integers: negative size ", count);
  DSV41_CHECK(low < high, "Generator.integers: empty range [", low, ", ", high, ")");
  const uint64_t off = static_cast<uint64_t>(low);
  const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - 1u;  // closed
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    uint64_t v;
    if (rng == 0) {
      v = 0;
    } else if (rng < 0xFFFFFFFFull) {
      v = bounded_lemire_u32(gen, static_cast<uint32_t>(rng));
    } else if (rng == 0xFFFFFFFFull) {
      v = gen.next_u32();
    } else {
      v = bounded_lemire_u64(gen, rng);
    }
    out[static_cast<size_t>(i)] = static_cast<int64_t>(off + v);  // two's complement wrap
  }
  return out;
}

}  // namespace dsv41::reference
