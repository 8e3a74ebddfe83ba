// scenarios/conform/conform_cache_codes.cc: the quantizer-boundary check (conform_cache_codes.h).
#include "scenarios/conform/conform_cache_codes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "base/error.h"
#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/qdq.h"
#include "scenarios/judge/derived_bounds.h"
#include "scenarios/judge/judge.h"

namespace dsv41::scenarios::conform {
namespace {

using formats::CacheFormat;

// The FP4 formats' scale of a block amax, the scale byte's value, and a code's dequantised value.
uint8_t scale_byte(CacheFormat f, float amax) {
  return f == CacheFormat::kCompressedKvFp4 ? formats::compressed_kv_scale(amax) : formats::index_scale(amax);
}
float scale_value(CacheFormat f, uint8_t b) {
  return f == CacheFormat::kCompressedKvFp4 ? formats::e4m3_decode(b) : formats::e8m0_decode(b);
}
float dequant(CacheFormat f, uint8_t code, uint8_t scale) {
  return f == CacheFormat::kCompressedKvFp4 ? formats::dequant_fp4_e4m3(code, scale) : formats::dequant_fp4_e8m0(code, scale);
}
// q_s(x): the format's rounding of x under scale byte b (RNE to the E2M1 grid, saturated), dequantised.
float round_at(CacheFormat f, float x, uint8_t b) {
  const float s = scale_value(f, b);
  return dequant(f, formats::e2m1_encode(formats::clamp_f32(x / s, -6.0f, 6.0f)), b);
}

const char* kind_of(CacheFormat f) {
  return f == CacheFormat::kCompressedKvFp4 ? "compressed_kv" : f == CacheFormat::kIndexKeysFp4 ? "index_keys" : nullptr;
}

const reference::model::CacheView* find(const std::vector<reference::model::CacheView>& v, const std::string& kind, int layer) {
  for (const reference::model::CacheView& x : v) {
    if (x.kind == kind && x.layer == layer) return &x;
  }
  return nullptr;
}

// The excess of one entry (see the header), in units of the entry's max |x|; -1 when the entry is
// not checkable (non-finite, all zero).
double entry_excess(CacheFormat f, const float* x, const float* y, int dim, double chain) {
  const int block = formats::info(f).block;
  double xmax = 0;
  for (int i = 0; i < dim; ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return -1;
    xmax = std::max(xmax, static_cast<double>(std::fabs(x[i])));
  }
  if (!(xmax > 0)) return -1;
  const double B = chain * xmax;
  double worst = 0;
  for (int b0 = 0; b0 + block <= dim; b0 += block) {
    double amax = 0;
    for (int i = b0; i < b0 + block; ++i) amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
    const uint8_t lo = scale_byte(f, static_cast<float>(std::max(0.0, amax - B)));
    const uint8_t hi = scale_byte(f, static_cast<float>(amax + B));
    double best = std::numeric_limits<double>::infinity();
    for (int sb = lo; sb <= hi; ++sb) {  // positive scales: byte order is value order
      double e = 0;
      for (int i = b0; i < b0 + block; ++i) {
        const double a = round_at(f, static_cast<float>(x[i] - B), static_cast<uint8_t>(sb));
        const double z = round_at(f, static_cast<float>(x[i] + B), static_cast<uint8_t>(sb));
        const double v = y[i];
        e = std::max(e, v < a ? a - v : v > z ? v - z : 0.0);
      }
      best = std::min(best, e);
    }
    worst = std::max(worst, best);
  }
  return worst / xmax;
}

}  // namespace

std::vector<reports::MetricRow> cache_code_rows(const reference::ModelConfig& c, const std::vector<CacheWrite>& writes,
                                                const std::vector<reference::model::CacheView>& own,
                                                const std::vector<reference::model::CacheView>& port, int64_t step,
                                                int64_t position) {
  // Per (kind, layer): the worst entry over the step's writes (later writes of an entry win).
  std::vector<reports::MetricRow> rows;
  const auto row_for = [&](const std::string& component, int layer) -> reports::MetricRow& {
    for (reports::MetricRow& r : rows) {
      if (r.component == component && r.layer == layer) return r;
    }
    reports::MetricRow r;
    r.step = step;
    r.position = position;
    r.layer = layer;
    r.component = component;
    r.metric = kCodeExcessMetric;
    r.value = 0;
    rows.push_back(r);
    return rows.back();
  };
  for (const CacheWrite& w : writes) {
    const char* kind = kind_of(w.format);
    if (kind == nullptr || w.rows.rank() != 2) continue;
    const reference::model::CacheView* a = find(own, kind, w.layer);
    const reference::model::CacheView* b = find(port, kind, w.layer);
    const int dim = static_cast<int>(w.rows.dim(1));
    if (a == nullptr || b == nullptr || a->format != w.format || b->format != w.format || a->dim != dim || b->dim != dim) {
      continue;
    }
    const std::string component = std::string("cache.") + kind;
    const std::optional<judge::DerivedBound> chain = judge::derived_cache_chain_bound(c, component);
    if (!chain) continue;
    for (size_t r = 0; r < w.entries.size(); ++r) {
      const int64_t e = w.entries[r];
      if (e < 0 || e >= a->entries || e >= b->entries) continue;
      const std::vector<float> x(w.rows.data().begin() + static_cast<int64_t>(r) * dim,
                                 w.rows.data().begin() + static_cast<int64_t>(r + 1) * dim);
      // The reference's own bytes of the entry must be the quantisation of the recorded row: else the
      // entry numbering is not the one this check assumes, and the entry is skipped.
      const std::vector<uint8_t> packed = formats::pack_rows(w.format, x, 1, dim);
      const auto own_at = a->bytes.begin() + e * a->entry_bytes;
      if (static_cast<int64_t>(packed.size()) != a->entry_bytes || !std::equal(packed.begin(), packed.end(), own_at)) continue;
      const std::vector<uint8_t> port_bytes(b->bytes.begin() + e * b->entry_bytes, b->bytes.begin() + (e + 1) * b->entry_bytes);
      std::vector<float> y;
      try {
        y = formats::unpack_rows(w.format, port_bytes, 1, dim);
      } catch (const Error&) {
        continue;  // an entry that does not decode: valid_entries_frac fails and says which
      }
      const double ex = entry_excess(w.format, x.data(), y.data(), dim, chain->bound);
      reports::MetricRow& row = row_for(component, w.layer);
      row.value = std::max(row.value, ex);
    }
  }
  return rows;
}

reports::Tolerance code_excess_tolerance(const reference::ModelConfig& c, const std::string& component) {
  const std::optional<judge::DerivedBound> chain = judge::derived_cache_chain_bound(c, component);
  DSV41_CHECK(chain.has_value(), "code_excess: '", component, "' is not a cache with a derived chain");
  std::ostringstream note;
  note << "analytic (docs/conform.md \"Cache codes\"): every code of an entry written this step is the format's rounding, "
          "under a scale the chain allows, of a value within "
       << chain->bound << " x the entry's max of the reference's own pre-quantisation value (" << chain->origin
       << "); a flip near a rounding boundary is admissible, a code off where the value is far from one is not";
  return judge::make_tolerance(0.0, false, "analytic", note.str());
}

}  // namespace dsv41::scenarios::conform
