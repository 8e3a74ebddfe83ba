// reference/ops/kv_quant.h
//
// The cache formats as ops: quantize-dequantize a tensor through a format, and write / read
// packed entries of a cache's storage (formats/cache_format.h holds the formats themselves). The
// three caches and their formats (one name each, in code, hooks, reports and docs):
//
//   cache           official buffer       format (formats::CacheFormat)  quantized when
//   window_kv       window_kv_cache       kWindowKvFp8 (E4M3 + E8M0/32)  after RoPE, every token
//   compressed_kv   compress_kv_cache     kCompressedKvFp4 (E2M1+E4M3/16) after RoPE at the group's
//                                                                          first token
//   index_keys      indexer k_cache       kIndexKeysFp4 (E2M1 + E8M0/32) after RoPE; the indexer's
//                                                                          queries use the format too
// and kBf16 (raw bf16, no QDQ) for every cache under the precision ablation
// (reference/ops/cache_precision.h): qdq(kBf16, x) is x.
//
// Storage: a cache's entries are one Tensor<uint8_t> [capacity, entry_bytes(format, dim)] that
// only these ops (and a backend's own versions of them) write. Ops read caches through
// CacheRows: "the first `count` entries of this storage, in this format".
//
// Exactness: bit-exact by construction (formats/ is the definition; the official quantizers
// match it bit for bit, tests/formats). A NaN or Inf value is an error naming the tensor and row.
//
// Example:
//   Tensor<float> kv = qdq(CacheFormat::kWindowKvFp8, roped_kv);      // what the ring returns
//   write_entries(storage, CacheFormat::kWindowKvFp8, {5, 6}, kv);     // rows 0, 1 -> entries 5, 6
//   Tensor<float> back = read_entries(CacheRows{CacheFormat::kWindowKvFp8, 512, 7, &storage}, {5, 6});
#pragma once

#include <cstdint>
#include <vector>

#include "formats/cache_format.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

// The first `count` entries of a cache's storage (what an op reads), in `format`, `dim` values
// per entry. bytes: [capacity >= count, entry_bytes(format, dim)].
struct CacheRows {
  formats::CacheFormat format = formats::CacheFormat::kBf16;
  int64_t dim = 0;
  int64_t count = 0;
  const Tensor<uint8_t>* bytes = nullptr;
};

// The values a cache of `format` returns for x: unpack(pack(x)) per row of the last dimension
// (kBf16: x itself). x: [..., dim] bf16 -> same shape, bf16 values.
Tensor<float> qdq(formats::CacheFormat format, const Tensor<float>& x);

// Packs row i of `rows` into entry entries[i] of `storage` (its other entries are untouched).
// storage: [capacity, entry_bytes(format, dim)], rows: [n, dim] bf16, entries: [n], each in
// [0, capacity).
void write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format, const std::vector<int64_t>& entries,
                   const Tensor<float>& rows);

// Entries `entries` (each < cache.count) dequantized -> [n, dim] bf16 values (exactly what the
// official bf16 cache holds).
Tensor<float> read_entries(const CacheRows& cache, const std::vector<int64_t>& entries);

// All `cache.count` entries, in order -> [count, dim] bf16.
Tensor<float> read_all_entries(const CacheRows& cache);

}  // namespace dsv41::reference
