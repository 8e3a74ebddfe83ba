// Packs and unpacks one row of each cache format through the installed headers and library, and
// checks the byte accounting against docs/formats.md's formulas (exit 0 when all hold).
#include <cmath>
#include <cstdio>
#include <vector>

#include "formats/cache_format.h"

int main() {
  using dsv41::formats::CacheFormat;
  const int dim = 64;
  std::vector<float> x(dim);
  for (int i = 0; i < dim; ++i) x[i] = static_cast<float>((i % 7) - 3) * 0.25f;  // exact in every format
  const struct { CacheFormat f; int bytes; } cases[] = {
      {CacheFormat::kCompressedKvFp4, dim / 2 + dim / 16}, {CacheFormat::kIndexKeysFp4, dim / 2 + dim / 32},
      {CacheFormat::kWindowKvFp8, dim + dim / 32}, {CacheFormat::kBf16, 2 * dim}};
  int bad = 0;
  for (const auto& c : cases) {
    const std::vector<uint8_t> packed = dsv41::formats::pack_rows(c.f, x, 1, dim);
    const std::vector<float> back = dsv41::formats::unpack_rows(c.f, packed, 1, dim);
    int wrong = 0;
    for (int i = 0; i < dim; ++i) wrong += back[i] != x[i];
    const bool ok = static_cast<int>(packed.size()) == c.bytes && wrong == 0;
    std::printf("%-24s %4zu bytes (expected %d), %d of %d values changed: %s\n", dsv41::formats::info(c.f).name,
                packed.size(), c.bytes, wrong, dim, ok ? "ok" : "WRONG");
    bad += !ok;
  }
  return bad == 0 ? 0 : 1;
}
