// reference/ops/pcg64.h
//
// numpy's default random generator, reproduced bit for bit: the Engram hash multipliers of the
// official code are `numpy.random.default_rng(10007 * layer_id).integers(0, B, size, int64)`, so
// the only way to hash like the released model without numpy is to run the same algorithm.
//
//   SeedSequence   numpy.random.SeedSequence(entropy) for a non-negative integer entropy, no
//                  spawn key, pool size 4 (numpy's defaults): the entropy becomes little-endian
//                  uint32 words, is hashed into a 4-word pool (hashmix/mix), and generate_state()
//                  draws words out of the pool with a second hash.
//   Pcg64          numpy.random.PCG64: the PCG XSL-RR 128/64 generator (128-bit LCG with the
//                  multiplier 0x2360ED051FC65DA4_4385DF649FCCF645, output = rotr64(hi ^ lo,
//                  state >> 122) of the state AFTER the step), seeded from generate_state(4,
//                  uint64) = {initstate hi, initstate lo, initseq hi, initseq lo}. next_u32()
//                  is numpy's next_uint32: the low half of a fresh 64-bit output, then (next call)
//                  its buffered high half.
//   generator_integers_i64
//                  numpy.random.Generator.integers(low, high, size, dtype=np.int64,
//                  endpoint=False) with numpy's default unmasked (Lemire) rejection method,
//                  including numpy's 32-bit path for ranges < 2^32 (served by next_u32()).
//
// Contract: the same bits on every platform and run (integer arithmetic only). Verified against
// numpy 1.24 (tests/reference/ops/pcg64_test.cc) and the oracle's multipliers. Not thread-safe (a
// generator is a sequential state machine).
//
// Example:
//   Pcg64 g = Pcg64::from_seed(10007);                            // default_rng(10007)
//   std::vector<int64_t> v = generator_integers_i64(g, 0, 1000, 4);  // .integers(0, 1000, 4)
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dsv41::reference {

// numpy.random.SeedSequence(entropy) (pool_size 4, no spawn key).
class SeedSequence {
 public:
  static constexpr int kPoolSize = 4;

  explicit SeedSequence(uint64_t entropy);

  // The mixed entropy pool (numpy's SeedSequence.pool).
  const std::array<uint32_t, kPoolSize>& pool() const { return pool_; }

  // generate_state(n_words, np.uint32).
  std::vector<uint32_t> generate_state_u32(int n_words) const;
  // generate_state(n_words, np.uint64): 2 * n_words uint32 words paired little-endian
  // (word 2k is the low half of value k).
  std::vector<uint64_t> generate_state_u64(int n_words) const;

 private:
  std::array<uint32_t, kPoolSize> pool_{};
};

// numpy.random.PCG64.
class Pcg64 {
 public:
  // PCG64(SeedSequence(entropy)), i.e. what numpy.random.default_rng(entropy) wraps.
  static Pcg64 from_seed(uint64_t entropy);
  static Pcg64 from_seed_sequence(const SeedSequence& seq);
  // pcg64_set_seed: state = 0, inc = (initseq << 1) | 1, step, state += initstate, step.
  // Each 128-bit value is given as (high 64 bits, low 64 bits).
  Pcg64(uint64_t initstate_hi, uint64_t initstate_lo, uint64_t initseq_hi, uint64_t initseq_lo);

  // One step of the LCG, then the XSL-RR output of the new state.
  uint64_t next_u64();
  // numpy's next_uint32: returns the buffered high half of the previous 64-bit output if there
  // is one, else draws a 64-bit output, returns its low half and buffers the high half.
  uint32_t next_u32();

  // The generator state (numpy's bit_generator.state["state"]), as (hi, lo) halves.
  uint64_t state_hi() const { return state_hi_; }
  uint64_t state_lo() const { return state_lo_; }
  uint64_t inc_hi() const { return inc_hi_; }
  uint64_t inc_lo() const { return inc_lo_; }
  bool has_u32() const { return has_u32_; }

 private:
  void step();

  uint64_t state_hi_ = 0, state_lo_ = 0;
  uint64_t inc_hi_ = 0, inc_lo_ = 1;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

// numpy Generator.integers(low, high, size=count, dtype=np.int64) (endpoint=False): `count`
// values in [low, high), each low + a bounded draw over rng = high - low - 1:
//   rng == 0                 low, no draw;
//   rng <  0xFFFFFFFF        Lemire on next_u32(): m = u32 * (rng+1) (64-bit), reject while the
//                            low 32 bits < (2^32 - (rng+1)) % (rng+1);
//   rng == 0xFFFFFFFF        next_u32();
//   otherwise                Lemire on next_u64() with a 128-bit product and threshold
//                            (2^64 - (rng+1)) % (rng+1).
// Throws dsv41::Error if low >= high or count < 0.
std::vector<int64_t> generator_integers_i64(Pcg64& gen, int64_t low, int64_t high, int64_t count);

}  // namespace dsv41::reference
