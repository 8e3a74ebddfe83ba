// reference/ops/engram.cc: Engram layout, n-gram hash ids, fp8 table lookup and the gated residual
// (see engram.h for the semantics and where each step rounds).
#include "reference/ops/engram.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/mhc.h"
#include "reference/ops/numerics.h"
#include "reference/ops/pcg64.h"
#include "reference/ops/rmsnorm.h"

namespace dsv41::reference {
namespace {

__extension__ using Uint128 = unsigned __int128;

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<Uint128>(a) * b % m);
}

uint64_t pow_mod(uint64_t base, uint64_t exp, uint64_t m) {
  uint64_t result = 1 % m;
  base %= m;
  for (; exp > 0; exp >>= 1) {
    if (exp & 1u) result = mul_mod(result, base, m);
    base = mul_mod(base, base, m);
  }
  return result;
}

}  // namespace

// ---- 1. layout ----

bool is_prime_u64(uint64_t n) {
  constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases) {
    if (n % p == 0) return n == p;
  }
  // n - 1 = d * 2^r with d odd.
  uint64_t d = n - 1;
  int r = 0;
  while ((d & 1u) == 0) {
    d >>= 1;
    ++r;
  }
  for (uint64_t a : kBases) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < r && composite; ++i) {
      x = mul_mod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;  // a witnesses that n is composite
  }
  return true;
}

int64_t next_unused_prime(int64_t after, const std::set<int64_t>& used) {
  DSV41_CHECK(after >= 0 && after < std::numeric_limits<int64_t>::max() / 2,
              "next_unused_prime: start ", after, " out of range");
  int64_t candidate = after + 1;
  while (!is_prime_u64(static_cast<uint64_t>(candidate)) || used.count(candidate) != 0) ++candidate;
  return candidate;
}

std::vector<int64_t> engram_hash_multipliers(int layer_id, int max_ngram_size,
                                             int64_t compressed_vocab) {
  DSV41_CHECK(layer_id >= 0, "engram layer id must be >= 0, got ", layer_id);
  DSV41_CHECK(max_ngram_size >= 1, "engram_max_ngram_size must be >= 1, got ", max_ngram_size);
  DSV41_CHECK(compressed_vocab >= 1, "engram compressed vocab must be >= 1, got ",
              compressed_vocab);
  const int64_t bound =
      std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2);
  Pcg64 gen = Pcg64::from_seed(kEngramSeedStride * static_cast<uint64_t>(layer_id));
  std::vector<int64_t> m = generator_integers_i64(gen, 0, bound, max_ngram_size);
  for (int64_t& v : m) v = v * 2 + 1;  // v < bound <= INT64_MAX / 2: no overflow
  return m;
}

int EngramLayout::layer_index(int layer_id) const {
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    if (layer_ids[i] == layer_id) return static_cast<int>(i);
  }
  DSV41_FAIL("engram: layer ", layer_id, " is not an engram layer");
}

EngramLayout EngramLayout::build(const ModelConfig& c) {
  EngramLayout l;
  l.layer_ids = c.engram_layer_ids;
  l.max_ngram_size = c.engram_max_ngram_size;
  l.n_heads = c.engram_n_heads;
  l.head_dim = c.engram_head_dim;
  l.compressed_vocab = c.engram_compressed_vocab_size;
  if (l.layer_ids.empty()) return l;
  DSV41_CHECK(l.max_ngram_size >= 2 && l.n_heads >= 1,
              "engram: need max_ngram_size >= 2 and n_heads >= 1, got ", l.max_ngram_size, ", ",
              l.n_heads);
  DSV41_CHECK(c.engram_num_embeddings.size() == l.layer_ids.size(),
              "engram: ", c.engram_num_embeddings.size(), " table sizes for ", l.layer_ids.size(),
              " engram layers");
  std::set<int64_t> used;  // global over layers and orders
  for (size_t li = 0; li < l.layer_ids.size(); ++li) {
    std::vector<int64_t> primes, offsets;
    int64_t total = 0;
    for (int order = 2; order <= l.max_ngram_size; ++order) {
      int64_t current = c.engram_vocab_size - 1;
      for (int h = 0; h < l.n_heads; ++h) {
        current = next_unused_prime(current, used);
        used.insert(current);
        primes.push_back(current);
        offsets.push_back(total);
        total += current;
      }
    }
    const int64_t want = c.engram_num_embeddings[li];
    if (total != want) {
      DSV41_FAIL("engram layer ", l.layer_ids[li], ": the table needs ", total,
                 " rows (sum of its bucket primes) but engram_num_embeddings[", li, "] is ", want);
    }
    l.primes.push_back(std::move(primes));
    l.offsets.push_back(std::move(offsets));
    l.rows.push_back(total);
    l.multipliers.push_back(
        engram_hash_multipliers(l.layer_ids[li], l.max_ngram_size, l.compressed_vocab));
  }
  return l;
}

// ---- 2. hash ids ----

std::vector<int64_t> engram_compress_tokens(const std::vector<int64_t>& token_map,
                                            const std::vector<int64_t>& tokens,
                                            const std::vector<uint8_t>& live) {
  DSV41_CHECK(live.empty() || live.size() == tokens.size(), "engram: live mask of ", live.size(),
              " entries for ", tokens.size(), " tokens");
  std::vector<int64_t> out(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t tok = tokens[t];
    DSV41_CHECK(tok >= 0 && tok < static_cast<int64_t>(token_map.size()), "engram: token ", tok,
                " at position ", t, " outside the token map of ", token_map.size(), " entries");
    out[t] = (!live.empty() && live[t] == 0) ? kEngramDead : token_map[static_cast<size_t>(tok)];
  }
  return out;
}

int64_t engram_pad_id(const std::vector<int64_t>& token_map, int pad_token) {
  DSV41_CHECK(pad_token >= 0 && pad_token < static_cast<int64_t>(token_map.size()),
              "engram: pad token ", pad_token, " outside the token map of ", token_map.size(),
              " entries");
  return token_map[static_cast<size_t>(pad_token)];
}

EngramHistory::EngramHistory(int64_t pad_id) : pad_id_(pad_id) {
  DSV41_CHECK(pad_id >= 0, "engram: pad id must be a compressed id >= 0, got ", pad_id);
}

void EngramHistory::write(int64_t start_pos, const std::vector<int64_t>& compressed_ids) {
  DSV41_CHECK(start_pos >= 0 && start_pos <= size(), "engram history: write at position ",
              start_pos, " would leave a gap (history holds ", size(), " positions)");
  DSV41_CHECK(start_pos >= first_, "engram history: write at position ", start_pos,
              " before the restored tail, which starts at position ", first_,
              " (the hash of a position reads the max_ngram - 1 ids before it)");
  for (size_t i = 0; i < compressed_ids.size(); ++i) {
    DSV41_CHECK(compressed_ids[i] >= 0 || compressed_ids[i] == kEngramDead,
                "engram history: invalid compressed id ", compressed_ids[i], " for position ",
                start_pos + static_cast<int64_t>(i));
  }
  ids_.resize(static_cast<size_t>(start_pos - first_));
  ids_.insert(ids_.end(), compressed_ids.begin(), compressed_ids.end());
}

void EngramHistory::restore(int64_t first_position, const std::vector<int64_t>& compressed_ids) {
  DSV41_CHECK(first_position >= 0, "engram history: restore at position ", first_position);
  for (size_t i = 0; i < compressed_ids.size(); ++i) {
    DSV41_CHECK(compressed_ids[i] >= 0 || compressed_ids[i] == kEngramDead,
                "engram history: invalid compressed id ", compressed_ids[i], " for position ",
                first_position + static_cast<int64_t>(i));
  }
  first_ = first_position;
  ids_ = compressed_ids;
}

int64_t EngramHistory::at(int64_t position) const {
  DSV41_CHECK(position >= first_ && position < size(), "engram history: position ", position,
              " is not held (the history holds positions ", first_, " .. ", size() - 1,
              first_ > 0 ? "; a restored session keeps only the last max_ngram - 1 ids" : "", ")");
  return ids_[static_cast<size_t>(position - first_)];
}

Tensor<int64_t> engram_hash_ids(const EngramLayout& layout, int layer_index,
                                const EngramHistory& history, int64_t start_pos, int64_t count) {
  DSV41_CHECK(layer_index >= 0 && layer_index < layout.n_layers(), "engram: layer index ",
              layer_index, " out of range [0, ", layout.n_layers(), ")");
  DSV41_CHECK(start_pos >= 0 && count >= 0 && start_pos + count <= history.size(),
              "engram: positions [", start_pos, ", ", start_pos + count,
              ") are not all in the history (", history.size(), " positions)");
  const int n = layout.max_ngram_size;
  const int heads = layout.n_heads;
  const std::vector<int64_t>& mult = layout.multipliers[static_cast<size_t>(layer_index)];
  const std::vector<int64_t>& primes = layout.primes[static_cast<size_t>(layer_index)];
  const std::vector<int64_t>& offsets = layout.offsets[static_cast<size_t>(layer_index)];
  const int64_t pad = history.pad_id();
  DSV41_CHECK(pad < layout.compressed_vocab, "engram: pad id ", pad,
              " outside the compressed vocab of ", layout.compressed_vocab);

  Tensor<int64_t> ids({count, layout.n_cols()}, "engram_hash_ids");
  std::vector<int64_t> prod(static_cast<size_t>(n));
  for (int64_t t = 0; t < count; ++t) {
    const int64_t p = start_pos + t;
    // tok[s] = id at p - s until the look-back leaves the sequence or meets a DEAD position.
    bool blocked = false;
    for (int s = 0; s < n; ++s) {
      int64_t tok = pad;
      if (!blocked && p - s >= 0) {
        const int64_t src = history.at(p - s);
        if (src == kEngramDead) {
          blocked = true;
        } else {
          DSV41_CHECK(src < layout.compressed_vocab, "engram: compressed id ", src, " at position ",
                      p - s, " outside the compressed vocab of ", layout.compressed_vocab);
          tok = src;
        }
      } else {
        blocked = true;
      }
      // < 2^63 by the multiplier bound (tok < compressed_vocab).
      prod[static_cast<size_t>(s)] = tok * mult[static_cast<size_t>(s)];
    }
    // Rolling XOR: after adding prod[order-1] it is the hash of the n-gram of that order.
    int64_t roll = prod[0];
    for (int order = 2; order <= n; ++order) {
      roll ^= prod[static_cast<size_t>(order - 1)];
      for (int h = 0; h < heads; ++h) {
        const size_t col = static_cast<size_t>((order - 2) * heads + h);
        ids.at(t, col) = roll % primes[col] + offsets[col];  // roll >= 0
      }
    }
  }
  return ids;
}

// ---- 3. lookup ----

EngramTableRef engram_table(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                            int64_t rows, int head_dim) {
  DSV41_CHECK(rows > 0 && head_dim > 0 && head_dim % 32 == 0, "engram table: rows ", rows,
              ", head_dim ", head_dim, " (need rows > 0, head_dim a positive multiple of 32)");
  DSV41_CHECK(static_cast<int64_t>(codes.size()) == rows * head_dim, "engram table: ", codes.size(),
              " codes for [", rows, ", ", head_dim, "]");
  DSV41_CHECK(static_cast<int64_t>(scales.size()) == rows * (head_dim / 32),
              "engram table: ", scales.size(), " scales for [", rows, ", ", head_dim / 32, "]");
  return EngramTableRef{codes.data(), scales.data(), rows, head_dim};
}

Tensor<float> engram_lookup(const EngramTableRef& table, const Tensor<int64_t>& ids) {
  DSV41_CHECK(table.codes != nullptr && table.scales != nullptr, "engram lookup: empty table");
  DSV41_CHECK(ids.rank() == 2, "engram lookup: ids must be [T, n_cols], got rank ", ids.rank());
  const int64_t tokens = ids.dim(0);
  const int64_t cols = ids.dim(1);
  const int64_t hd = table.head_dim;
  Tensor<float> out({tokens, cols * hd}, "engram_rows");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = ids.at(t, c);
      DSV41_CHECK(id >= 0 && id < table.rows, "engram lookup: id ", id, " at token ", t,
                  ", column ", c, " outside the table of ", table.rows, " rows");
      const uint8_t* code = table.codes + id * hd;
      const uint8_t* scale = table.scales + id * (hd / 32);
      float* dst = out.row(t) + c * hd;
      for (int64_t d = 0; d < hd; ++d) {
        const float v = formats::e4m3_decode(code[d]) * formats::e8m0_decode(scale[d / 32]);
        dst[d] = round_to_bf16(v);
      }
    }
  }
  return out;
}

// ---- 4. gate + residual ----

namespace {

struct GateShape {
  int64_t tokens, hc, dim;
};

GateShape check_gate_args(const Tensor<float>& x, const Tensor<float>& kv,
                          const std::vector<float>& q_weight, const std::vector<float>& k_weight,
                          const std::vector<uint8_t>& live) {
  DSV41_CHECK(x.rank() == 3, "engram gate: x must be [T, hc, dim], got rank ", x.rank());
  const GateShape s{x.dim(0), x.dim(1), x.dim(2)};
  DSV41_CHECK(kv.rank() == 2 && kv.dim(0) == s.tokens && kv.dim(1) == (s.hc + 1) * s.dim,
              "engram gate: kv must be [", s.tokens, ", ", (s.hc + 1) * s.dim, "], got ",
              shape_string(kv.shape()));
  DSV41_CHECK(static_cast<int64_t>(q_weight.size()) == s.hc * s.dim &&
                  static_cast<int64_t>(k_weight.size()) == s.hc * s.dim,
              "engram gate: q_weight/k_weight must hold hc*dim = ", s.hc * s.dim, " values, got ",
              q_weight.size(), "/", k_weight.size());
  DSV41_CHECK(live.empty() || static_cast<int64_t>(live.size()) == s.tokens,
              "engram gate: live mask of ", live.size(), " entries for ", s.tokens, " tokens");
  return s;
}

}  // namespace

Tensor<float> engram_gates(const Tensor<float>& x, const Tensor<float>& kv,
                           const std::vector<float>& q_weight, const std::vector<float>& k_weight,
                           double eps, const std::vector<uint8_t>& live) {
  const GateShape s = check_gate_args(x, kv, q_weight, k_weight, live);
  const float eps_f = static_cast<float>(eps);
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(s.dim), -0.5));
  const float dim_f = static_cast<float>(s.dim);
  Tensor<float> gates({s.tokens, s.hc}, "engram_gates");
  parallel_for(s.tokens, [&](int64_t t) {
    std::vector<float> sq_h(static_cast<size_t>(s.dim)), sq_k(sq_h.size()), prod(sq_h.size());
    for (int64_t c = 0; c < s.hc; ++c) {
      const float* h = x.row(t, c);
      const float* key = kv.row(t) + c * s.dim;
      const float* qw = q_weight.data() + c * s.dim;
      const float* kw = k_weight.data() + c * s.dim;
      for (int64_t d = 0; d < s.dim; ++d) {
        const size_t i = static_cast<size_t>(d);
        sq_h[i] = h[d] * h[d];
        sq_k[i] = key[d] * key[d];
        const float w = qw[d] * kw[d];
        prod[i] = (h[d] * w) * key[d];
      }
      const float r_h = 1.0f / std::sqrt(torch_sum_f32(sq_h.data(), s.dim) / dim_f + eps_f);
      const float r_k = 1.0f / std::sqrt(torch_sum_f32(sq_k.data(), s.dim) / dim_f + eps_f);
      const float rstd = r_h * r_k;
      const float dot = (torch_sum_f32(prod.data(), s.dim) * rstd) * inv_sqrt_dim;
      const float mag = std::sqrt(std::max(std::fabs(dot), kEngramGateClamp));
      const bool is_live = live.empty() || live[static_cast<size_t>(t)] != 0;
      gates.at(t, c) = is_live ? torch_sigmoid_f32(std::copysign(mag, dot)) : 0.0f;
    }
  });
  return gates;
}

Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv,
                                   const std::vector<float>& q_weight,
                                   const std::vector<float>& k_weight, double eps,
                                   const std::vector<uint8_t>& live) {
  const Tensor<float> gates = engram_gates(x, kv, q_weight, k_weight, eps, live);
  const int64_t tokens = x.dim(0), hc = x.dim(1), dim = x.dim(2);
  Tensor<float> out({tokens, hc, dim}, "engram_out");
  for (int64_t t = 0; t < tokens; ++t) {
    const float* value = kv.row(t) + hc * dim;
    for (int64_t c = 0; c < hc; ++c) {
      const float g = gates.at(t, c);
      const float* h = x.row(t, c);
      float* o = out.row(t, c);
      for (int64_t d = 0; d < dim; ++d) o[d] = round_to_bf16(h[d] + g * value[d]);
    }
  }
  return out;
}

}  // namespace dsv41::reference
