#include "scenarios/defects/mutants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/base.h"
#include "base/error.h"
#include "reference/ops/numerics.h"

namespace dsv41::scenarios::defects {
namespace {

using reference::Tensor;

int64_t parse_number(const std::string& text, const std::string& spec, const char* what) {
  DSV41_CHECK(!text.empty(), "mutant '", spec, "': ", what, " is empty");
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSV41_CHECK(used == text.size(), "mutant '", spec, "': ", what, " '", text, "' is not an integer");
  return v;
}

bool matches(const Mutation& m, reference::model::Component what, int layer, int64_t step) {
  return !m.is_round() && m.id == what && m.layer == layer && m.step == step;
}

// The defect of a float value: its exponent one higher (the value doubled, exact in both storage
// types); a zero becomes the smallest normal.
float doubled(float x) {
  if (x == 0.0f) return f32_from_bits(0x00800000u);  // 2^-126: a bf16 and an fp32 value
  return x * 2.0f;
}

}  // namespace

Mutation parse_mutation(const std::string& spec) {
  // <defect>:S<step> (speculative decoding)
  static const std::pair<const char*, RoundDefect> kRound[] = {
      {"rollback_compressor", RoundDefect::kCompressorNotRolledBack},
      {"accept_one_more", RoundDefect::kAcceptOneMore},
      {"rollback_dspark", RoundDefect::kDSparkRingNotRolledBack},
      {"draft_rope_pos0", RoundDefect::kDraftRopeAtBlockStart},
  };
  for (const auto& [defect, kind] : kRound) {
    const std::string prefix = std::string(defect) + ":";
    if (spec.rfind(prefix, 0) != 0) continue;
    const std::string s = spec.substr(prefix.size());
    DSV41_CHECK(!s.empty() && s[0] == 'S', "mutant '", spec, "': expected ", defect, ":S<step> (a speculative ",
                "defect applies to every layer), got '", s, "'");
    Mutation m;
    m.component = defect;
    m.id = reference::model::Component::kAccept;
    m.round = kind;
    m.layer = -1;
    m.step = parse_number(s.substr(1), spec, "the step");
    DSV41_CHECK(m.step >= 0, "mutant '", spec, "': step ", m.step, " < 0");
    return m;
  }
  // <component>:L<layer>:S<step>[:x<factor>]
  const size_t sx = spec.rfind(':');
  if (sx != std::string::npos && sx + 1 < spec.size() && spec[sx + 1] == 'x') {
    Mutation m = parse_mutation(spec.substr(0, sx));
    const std::string f = spec.substr(sx + 2);
    size_t used = 0;
    double factor = 0;
    try {
      factor = std::stod(f, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSV41_CHECK(!f.empty() && used == f.size() && std::isfinite(factor) && factor > 0 && factor != 1,
                "mutant '", spec, "': the row factor must be written x<number>, a positive number other than 1, got 'x", f,
                "'");
    DSV41_CHECK(!m.is_round() && reference::model::component_info(m.id).kind == reference::model::ComponentKind::kTensor,
                "mutant '", spec, "': a row factor applies to a float component only, not '", m.component, "'");
    m.row_scale = factor;
    return m;
  }
  // <component>:L<layer>:S<step>
  const size_t s2 = spec.rfind(':');
  const size_t s1 = s2 == std::string::npos || s2 == 0 ? std::string::npos : spec.rfind(':', s2 - 1);
  DSV41_CHECK(s1 != std::string::npos && s1 > 0,
              "mutant '", spec, "': expected <component>:L<layer>:S<step>, e.g. attn_out:L3:S2");
  Mutation m;
  m.component = spec.substr(0, s1);
  const std::string l = spec.substr(s1 + 1, s2 - s1 - 1), s = spec.substr(s2 + 1);
  DSV41_CHECK(!l.empty() && l[0] == 'L', "mutant '", spec, "': the layer must be written L<n>, got '", l, "'");
  DSV41_CHECK(!s.empty() && s[0] == 'S', "mutant '", spec, "': the step must be written S<n>, got '", s, "'");
  m.layer = static_cast<int>(parse_number(l.substr(1), spec, "the layer"));
  m.step = parse_number(s.substr(1), spec, "the step");
  DSV41_CHECK(m.layer >= -1, "mutant '", spec, "': layer ", m.layer, " < -1");
  DSV41_CHECK(m.step >= 0, "mutant '", spec, "': step ", m.step, " < 0");
  const std::optional<reference::model::Component> id = reference::model::component_from_name(m.component);
  DSV41_CHECK(id && reference::model::component_info(*id).kind != reference::model::ComponentKind::kIds &&
                  *id != reference::model::Component::kLogits && *id != reference::model::Component::kCacheDSparkWindowKv,
              "mutant '", spec, "': '", m.component, "' is not a component a defect can be planted in (a tensor hook of "
              "reference/model/hooks.h, topk, experts, candidates, cache.window_kv, cache.compressed_kv, cache.index_keys; or a "
              "speculative defect: rollback_compressor:S<n>, rollback_dspark:S<n>, accept_one_more:S<n>, draft_rope_pos0:S<n>)");
  m.id = *id;
  return m;
}

bool mutate_tensor(const Mutation& m, reference::model::Component what, int layer, int64_t step, Tensor<float>& v) {
  if (!matches(m, what, layer, step) || v.numel() == 0) return false;
  if (m.row_scale != 0) {
    const int64_t row = v.dim(v.rank() - 1);
    float* r = v.data().data() + (v.numel() - row);
    bool bf16 = true;
    for (int64_t i = 0; i < row; ++i) bf16 = bf16 && (!std::isfinite(r[i]) || reference::round_to_bf16(r[i]) == r[i]);
    for (int64_t i = 0; i < row; ++i) {
      if (!std::isfinite(r[i])) continue;
      const float y = static_cast<float>(static_cast<double>(r[i]) * m.row_scale);
      r[i] = bf16 ? reference::round_to_bf16(y) : y;
    }
    return true;
  }
  const int64_t last_row = v.dim(0) - 1;
  float& x = v.data()[static_cast<size_t>(last_row * (v.numel() / v.dim(0)))];
  if (!std::isfinite(x)) return false;  // e.g. an unreachable -inf index score: nothing to change
  x = doubled(x);
  return true;
}

bool mutate_index(const Mutation& m, reference::model::Component what, int layer, int64_t step, Tensor<int32_t>& v,
                  int64_t n_choices) {
  if (!matches(m, what, layer, step) || v.numel() == 0) return false;
  int32_t* row = v.row(v.dim(0) - 1);
  const int64_t k = v.dim(1);
  std::set<int32_t> chosen;
  int64_t at = -1;
  for (int64_t j = 0; j < k; ++j) {
    if (row[j] < 0) continue;
    chosen.insert(row[j]);
    if (at < 0 || row[j] > row[at]) at = j;
  }
  if (at < 0) return false;
  for (int32_t cand = 0; cand < n_choices; ++cand) {
    if (chosen.count(cand) == 0) {
      row[at] = cand;
      if (what == reference::model::Component::kTopk) std::sort(row, row + k, [](int32_t a, int32_t b) {  // ascending, -1 last
        return (a < 0 ? INT32_MAX : a) < (b < 0 ? INT32_MAX : b);
      });
      return true;
    }
  }
  return false;
}

bool mutate_mask(const Mutation& m, reference::model::Component what, int layer, int64_t step, Tensor<uint8_t>& v,
                 int block_size) {
  if (!matches(m, what, layer, step) || v.numel() == 0 || block_size <= 0) return false;
  uint8_t* row = v.row(v.dim(0) - 1);
  const int64_t n = v.dim(1), nblocks = (n + block_size - 1) / block_size;
  int64_t newest = -1;
  for (int64_t b = 0; b < nblocks; ++b) {
    for (int64_t j = b * block_size; j < std::min(n, (b + 1) * block_size); ++j) {
      if (row[j]) newest = b;
    }
  }
  for (int64_t b = 0; b < newest; ++b) {
    bool kept = false;
    for (int64_t j = b * block_size; j < std::min(n, (b + 1) * block_size); ++j) kept = kept || row[j];
    if (kept) {
      for (int64_t j = b * block_size; j < std::min(n, (b + 1) * block_size); ++j) row[j] = 0;
      return true;
    }
  }
  return false;
}

reference::model::ForwardHooks mutated_hooks(const Mutation& m, const reference::model::ForwardHooks& inner,
                                      const reference::ModelConfig& c, int64_t start, int64_t T, int64_t step,
                                      bool* fired) {
  reference::model::ForwardHooks h;
  h.tensor = [inner, m, step, fired](reference::model::Component what, int layer, Tensor<float>& v) {
    *fired = mutate_tensor(m, what, layer, step, v) || *fired;
    if (inner.tensor) inner.tensor(what, layer, v);
  };
  h.index = [inner, m, step, &c, start, T, fired](reference::model::Component what, int layer, Tensor<int32_t>& v) {
    int64_t choices = c.n_routed_experts;
    if (what == reference::model::Component::kTopk) {
      const int ratio = c.compress_ratios[static_cast<size_t>(layer)];
      choices = ratio > 0 ? (start + T) / ratio : 0;
    } else if (what == reference::model::Component::kDSparkExperts && c.dspark_n_routed_experts > 0) {
      choices = c.dspark_n_routed_experts;
    } else if (what == reference::model::Component::kDSparkToken) {
      choices = c.vocab_size;
    }
    *fired = mutate_index(m, what, layer, step, v, choices) || *fired;
    if (inner.index) inner.index(what, layer, v);
  };
  h.mask = [inner, m, step, &c, fired](reference::model::Component what, int layer, Tensor<uint8_t>& v) {
    *fired = mutate_mask(m, what, layer, step, v, c.candidate_block_size) || *fired;
    if (inner.mask) inner.mask(what, layer, v);
  };
  return h;
}

bool mutate_cache(const Mutation& m, int64_t step, reference::model::ModelState& state) {
  if (!m.is_cache() || m.step != step) return false;
  DSV41_CHECK(m.layer >= 0 && m.layer < static_cast<int>(state.layers.size()), "mutant ", m.component,
              ": layer ", m.layer, " is not a layer of this model");
  reference::model::LayerState& ls = state.layers[static_cast<size_t>(m.layer)];
  if (m.id == reference::model::Component::kCacheWindowKv) {
    // The newest position's slot.
    const std::vector<int64_t>& positions = ls.window_kv.positions;
    int64_t slot = -1;
    for (size_t s = 0; s < positions.size(); ++s) {
      if (positions[s] >= 0 && (slot < 0 || positions[s] > positions[static_cast<size_t>(slot)])) {
        slot = static_cast<int64_t>(s);
      }
    }
    if (slot < 0) return false;
    ls.window_kv.bytes.row(slot)[0] ^= 1u;
    return true;
  }
  const auto flip_newest = [](auto& cache) {
    const int64_t n = cache.size(), eb = cache.entry_bytes();
    if (n == 0) return false;
    std::vector<uint8_t> bytes(static_cast<size_t>(n * eb));
    for (int64_t e = 0; e < n; ++e) std::memcpy(bytes.data() + e * eb, cache.entry(e), static_cast<size_t>(eb));
    bytes[static_cast<size_t>((n - 1) * eb)] ^= 1u;  // the first byte of the newest entry: FP4 codes
    cache.restore(bytes.data(), n);
    return true;
  };
  if (m.id == reference::model::Component::kCacheCompressor) {
    DSV41_CHECK(ls.compressor.has_value(), "mutant cache.compressor: layer ", m.layer, " has no compressor");
    if (ls.compressor->pending() == 0) return false;
    // The newest pending slot's first kv value: its lowest mantissa bit.
    float& x = ls.compressor->kv.row(ls.compressor->pending() - 1)[0];
    x = f32_from_bits(f32_bits(x) ^ 1u);
    return true;
  }
  if (m.id == reference::model::Component::kCacheCompressedKv) {
    DSV41_CHECK(ls.compressed_kv.has_value(), "mutant cache.compressed_kv: layer ", m.layer, " is not a kv source");
    return flip_newest(*ls.compressed_kv);
  }
  DSV41_CHECK(ls.index_keys.has_value(), "mutant cache.index_keys: layer ", m.layer, " has no index-key cache");
  return flip_newest(*ls.index_keys);
}

}  // namespace dsv41::scenarios::defects
