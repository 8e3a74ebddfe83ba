#include "reference/ops/kv_quant.h"

#include <algorithm>
#include <numeric>

#include "base/error.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {
namespace {

void check_cache(const CacheRows& cache, const char* what) {
  DSV41_CHECK(cache.bytes != nullptr, what, ": no cache storage");
  const int64_t eb = formats::entry_bytes(cache.format, static_cast<int>(cache.dim));
  DSV41_CHECK(cache.bytes->rank() == 2 && cache.bytes->dim(1) == eb && cache.count >= 0 &&
                  cache.count <= cache.bytes->dim(0),
              what, ": storage '", cache.bytes->name(), "' ", shape_string(cache.bytes->shape()), " for ", cache.count,
              " entries of ", eb, " bytes (", formats::info(cache.format).name, ", dim ", cache.dim, ")");
}

}  // namespace

Tensor<float> qdq(formats::CacheFormat format, const Tensor<float>& x) {
  DSV41_CHECK(x.rank() >= 1, "qdq: '", x.name(), "' is a scalar");
  if (format == formats::CacheFormat::kBf16) return x;  // the ablation: the cache keeps bf16 as is
  const int64_t d = x.dim(x.rank() - 1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  Tensor<float> out(x.shape(), x.name() + "_qdq");
  try {
    out.data() = formats::qdq_rows(format, x.data(), static_cast<int>(rows), static_cast<int>(d));
  } catch (const Error& e) {
    DSV41_FAIL("qdq of '", x.name(), "' through ", formats::info(format).name, ": ", e.what());
  }
  return out;
}

void write_entries(Tensor<uint8_t>& storage, formats::CacheFormat format, const std::vector<int64_t>& entries,
                   const Tensor<float>& rows) {
  DSV41_CHECK(rows.rank() == 2 && rows.dim(0) == static_cast<int64_t>(entries.size()), "write_entries: ",
              entries.size(), " entries for rows '", rows.name(), "' ", shape_string(rows.shape()));
  const int64_t n = rows.dim(0), d = rows.dim(1);
  const int64_t eb = formats::entry_bytes(format, static_cast<int>(d));
  DSV41_CHECK(storage.rank() == 2 && storage.dim(1) == eb, "write_entries: storage '", storage.name(), "' ",
              shape_string(storage.shape()), " does not hold ", formats::info(format).name, " entries of dim ", d);
  std::vector<uint8_t> packed;
  try {
    packed = formats::pack_rows(format, rows.data(), static_cast<int>(n), static_cast<int>(d));
  } catch (const Error& e) {
    DSV41_FAIL("write_entries into '", storage.name(), "': ", e.what());
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = entries[static_cast<size_t>(i)];
    DSV41_CHECK(e >= 0 && e < storage.dim(0), "write_entries: entry ", e, " outside [0, ", storage.dim(0),
                ") of '", storage.name(), "'");
    std::copy(packed.begin() + i * eb, packed.begin() + (i + 1) * eb, storage.row(e));
  }
}

Tensor<float> read_entries(const CacheRows& cache, const std::vector<int64_t>& entries) {
  check_cache(cache, "read_entries");
  const int64_t n = static_cast<int64_t>(entries.size());
  const int64_t eb = cache.bytes->dim(1);
  for (int64_t e : entries) {
    DSV41_CHECK(e >= 0 && e < cache.count, "read_entries: entry ", e, " outside the ", cache.count,
                " written entries of '", cache.bytes->name(), "'");
  }
  // Blocks of rows gathered and decoded side by side (a decode is exact: any split gives the same
  // values; sparse_attn and index_scores read whole caches, 2^20 entries at a million tokens).
  constexpr int64_t kBlock = 4096;
  std::vector<float> values(static_cast<size_t>(n * cache.dim));
  parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b) {
    const int64_t first = b * kBlock, rows = std::min(kBlock, n - first);
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * eb));
    for (int64_t i = 0; i < rows; ++i) {
      const uint8_t* src = cache.bytes->row(entries[static_cast<size_t>(first + i)]);
      std::copy(src, src + eb, bytes.begin() + i * eb);
    }
    const std::vector<float> v =
        formats::unpack_rows(cache.format, bytes, static_cast<int>(rows), static_cast<int>(cache.dim));
    std::copy(v.begin(), v.end(), values.begin() + first * cache.dim);
  });
  return Tensor<float>({n, cache.dim}, std::move(values), cache.bytes->name());
}

Tensor<float> read_all_entries(const CacheRows& cache) {
  std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(cache.count, 0)));
  std::iota(all.begin(), all.end(), int64_t{0});
  return read_entries(cache, all);
}

}  // namespace dsv41::reference
