// cuda/kv_pack.h: the fp32-storage entry of cuda/kv_pack.cu for gpu::pack_rows (cuda/kv_quant.cu).
// Host C++, no CUDA types.
#pragma once

#include <cstdint>

#include "formats/cache_format.h"

namespace dsv41::gpu {

// Packs like gpu::pack_rows when f is kWindowKvFp8 or kCompressedKvFp4 and returns true; returns
// false (nothing launched) for the other formats. x: [rows, dim] fp32, 16-byte aligned.
bool pack_rows_fast(formats::CacheFormat f, const float* x, int64_t rows, int dim, uint8_t* out, uint8_t* finite,
                    void* stream);

}  // namespace dsv41::gpu
