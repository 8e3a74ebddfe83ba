// cuda/kernels_bf16.h
//
// bf16-storage variants of the bandwidth-bound launchers of cuda/kernels.h (library dsv41_cuda):
// the same kernels and the same fp32 arithmetic, templated on the storage of the bf16 tensors
// (cuda/bf16_storage.cuh). cuda/kernels.h's launchers take bf16 values in fp32 storage (what the
// cuda/ backend keeps); these take bf16 bit patterns (uint16_t, 2 bytes per value: the production
// format and the bytes of the performance.md roofline). Each gives the bf16 values of its fp32
// twin, bit for bit (tests/cuda/mhc_test, engram_test; bench/kernels_bench.cc checks the timed
// variant against the reference op). Plain C++, no CUDA types; default stream; throws
// dsv41::Error on a failed launch or a shape the variant does not take. The KV packer's variant
// is gpu::pack_rows_bf16 in cuda/device.h.
#pragma once

#include <cstdint>

namespace dsv41::gpu {

// hc_post of cuda/kernels.h on bf16 storage: f [T, dim], residual [T, hc, dim], y [T, hc, dim] bf16
// bits; post [T, hc], comb [T, hc, hc] fp32. Needs hc 1 or 4, dim % 8 == 0, 16-byte aligned
// f / residual / y.
void hc_post_bf16(const uint16_t* f, const uint16_t* residual, const float* post, const float* comb, int64_t T,
                  int64_t hc, int64_t dim, uint16_t* y);

// engram_lookup of cuda/kernels.h with a bf16-storage output: out [T, cols * head_dim] bf16 bits.
// Needs head_dim % 32 == 0 and 8-byte aligned codes, 16-byte aligned out.
void engram_lookup_bf16(const uint8_t* codes, const uint8_t* scales, int64_t head_dim, const int64_t* ids, int64_t T,
                        int64_t cols, uint16_t* out);

}  // namespace dsv41::gpu
