// bench/bench_device.h
//
// Device helpers of dsv41_kernels_bench (bench/kernels_bench.cc), no CUDA types: random inputs
// made on the device (so the GiB-sized shapes need no host copies) and CUDA-event timing with
// cold L2 (every timed launch reads a rotating input copy and, before it, the L2 is overwritten by a
// 256 MiB memset that is not timed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsv41::bench {

// x[i] = bf16(m_row * u): u uniform in (-2, 2), log2(m_row) uniform integer in [lo, hi) per row of
// `dim` values (fp32 storage). Deterministic in (seed, i).
void fill_bf16(float* x, int64_t n, int64_t dim, uint64_t seed, int lo, int hi);
// x[i] uniform in [lo, lo + span) (fp32 values, not rounded).
void fill_f32(float* x, int64_t n, uint64_t seed, float lo, float span);
// x[i] uniform integer in [0, bound).
void fill_i64(int64_t* x, int64_t n, uint64_t seed, int64_t bound);
// x[i] = v.
void fill_i64_const(int64_t* x, int64_t n, int64_t v);
// x[i] = random byte in [lo, hi] (inclusive), never equal to `avoid_mask_bits` patterns: a byte b
// with (b & 0x7F) == 0x7F becomes b - 1 when `no_e4m3_nan` (E4M3 NaN codes are left out).
void fill_u8(uint8_t* x, int64_t n, uint64_t seed, int lo, int hi, bool no_e4m3_nan);

// Times `launch(copy)` with CUDA events (copy = which rotating input copy to use, in
// 0 .. copies - 1): `warmup` untimed launches, then `reps` timed ones, each after an L2 flush.
// Returns the times in milliseconds, sorted.
std::vector<double> time_ms(int warmup, int reps, int copies, const std::function<void(int)>& launch);

// Wall-clock milliseconds of one launch (synchronized), for choosing the repetitions.
double once_ms(const std::function<void()>& launch);

std::size_t free_device_bytes();
std::string cuda_runtime_version();

}  // namespace dsv41::bench
