// reference/ops/engram.h
//
// Engram (official engram.py + the Engram module of model.py): an n-gram hash lookup added into
// the residual stream before the block of each engram layer, gated by how well it matches the
// stream. The model assembly runs it in four steps; the projection in between is not here:
//
//   1. layout      EngramLayout::build(config): per engram layer the hash multipliers (numpy
//                  PCG64, reference/ops/pcg64.h), the prime bucket sizes and the column offsets.
//   2. hash ids    EngramHistory (compressed ids of every position so far) + engram_hash_ids():
//                  [T, n_cols] int64 table rows of the n-grams ending at each new position.
//   3. lookup      engram_lookup(table, ids): the fp8 table rows, dequantized -> [T, n_cols *
//                  head_dim] bf16.
//      (model)     kv = linear(rows, wkv): [T, (hc + 1) * dim] bf16  (reference/ops/linear.h)
//   4. gate        engram_gate_residual(x, kv, q_weight, k_weight, eps): [T, hc, dim] bf16.
//
// Layout (n_cols = (max_ngram - 1) * n_heads; column c = (order - 2) * n_heads + head):
//   primes:  for each engram layer, for each order 2..max_ngram: cur = engram_vocab_size - 1;
//            for each head: cur = the smallest prime > cur not used before (the used set is
//            global over layers and orders). So the primes are successive primes above the
//            vocab size, in (layer, order, head) order.
//   offsets: running sum of the layer's primes over its columns; table rows = sum of its primes,
//            which must equal engram_num_embeddings (else EngramLayout::build throws).
//   multipliers[layer][s] (s = 0..max_ngram-1) = 2 * v + 1 with v from
//            numpy.random.default_rng(10007 * layer_id).integers(0, B, max_ngram, int64),
//            B = max(1, (INT64_MAX // compressed_vocab) // 2): odd, and tok * mult < 2^63.
//
// Hash (per position p, all int64, exact):
//   tok[s] = compressed id at p - s, s = 0..max_ngram-1; once p - s < 0 or a DEAD position is
//            met, that slot and every older one hold the pad id (token_map[engram_pad_id]);
//   prod[s] = tok[s] * mult[s]; roll = prod[0]; for order n = 2..max_ngram: roll ^= prod[n-1],
//   id[(n-2)*n_heads + h] = roll % prime[n-2][h] + offset[(n-2)*n_heads + h]  (roll >= 0).
//
// Stability contract: ids are the same bits on every platform and run (integer arithmetic; no
// std::hash). Numerics of lookup and gate: see the functions. Bit-exact against the oracle:
// layout, multipliers, hash ids (prefill and decode) and the gated output (engram_test.cc).
//
// Example:
//   EngramLayout layout = EngramLayout::build(config);
//   EngramHistory history(engram_pad_id(token_map, config.engram_pad_id));
//   history.write(0, engram_compress_tokens(token_map, tokens));
//   Tensor<int64_t> ids = engram_hash_ids(layout, layout.layer_index(1), history, 0, T);
//   Tensor<float> rows = engram_lookup(table, ids);
//   Tensor<float> out = engram_gate_residual(x, linear(rows, wkv), q_w, k_w, config.norm_eps);
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/linear.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

// Compressed id of a position that takes no part in an n-gram (an image span): NgramHashState.DEAD.
inline constexpr int64_t kEngramDead = -1;
// The per-layer numpy seed is kEngramSeedStride * layer_id.
inline constexpr uint64_t kEngramSeedStride = 10007;
// The gate's lower clamp of |dot| before the square root (Engram.clamp_value).
inline constexpr float kEngramGateClamp = 1e-6f;

// One engram layer's weights (checkpoint prefix "layers.<L>.engram.").
struct EngramWeights {
  Tensor<uint8_t> table;        // "embed.weight": [rows, head_dim] E4M3 codes
  Tensor<uint8_t> table_scale;  // "embed.scale": [rows, head_dim/32] E8M0 codes
  LinearWeight wkv;             // "wkv": F8 [(hc+1)*dim, n_cols*head_dim]
  Tensor<float> q_weight, k_weight;  // "q_weight", "k_weight": [hc, dim] bf16
};

// ---- 1. layout ----

// Deterministic primality for every 64-bit n (Miller-Rabin with the first 12 prime bases, exact
// below 3.3e24 > 2^64).
bool is_prime_u64(uint64_t n);

// The smallest prime > after that is not in `used` (engram.py find_next_prime).
int64_t next_unused_prime(int64_t after, const std::set<int64_t>& used);

// [max_ngram_size] odd multipliers of one engram layer (numpy default_rng(10007 * layer_id)).
std::vector<int64_t> engram_hash_multipliers(int layer_id, int max_ngram_size,
                                             int64_t compressed_vocab);

struct EngramLayout {
  std::vector<int> layer_ids;  // [n_layers] engram layer ids, config order
  int max_ngram_size = 0;
  int n_heads = 0;
  int head_dim = 0;
  int64_t compressed_vocab = 0;
  std::vector<std::vector<int64_t>> primes;       // [n_layers][n_cols] bucket modulus per column
  std::vector<std::vector<int64_t>> offsets;      // [n_layers][n_cols] first table row per column
  std::vector<std::vector<int64_t>> multipliers;  // [n_layers][max_ngram_size]
  std::vector<int64_t> rows;                      // [n_layers] table rows = sum of primes

  int n_cols() const { return (max_ngram_size - 1) * n_heads; }
  int n_layers() const { return static_cast<int>(layer_ids.size()); }
  // Position of layer_id in layer_ids; throws if it is not an engram layer.
  int layer_index(int layer_id) const;

  // The layout of `c` (empty when c has no engram layers). Throws if a layer's sum of primes is
  // not its engram_num_embeddings, naming the layer and both numbers.
  static EngramLayout build(const ModelConfig& c);
};

// ---- 2. hash ids ----

// Compressed ids of tokens: token_map[token], or kEngramDead where live[t] == 0 (live empty: all
// live). Throws on a token outside token_map.
std::vector<int64_t> engram_compress_tokens(const std::vector<int64_t>& token_map,
                                            const std::vector<int64_t>& tokens,
                                            const std::vector<uint8_t>& live = {});

// The pad compressed id: token_map[pad_token] (pad_token = config.engram_pad_id).
int64_t engram_pad_id(const std::vector<int64_t>& token_map, int pad_token);

// The compressed ids of positions 0 .. size()-1 of one sequence (the official NgramHashState
// cache), carried across prefill chunks and decode steps. A restored history (a resumed session)
// holds only a tail, positions first_position() .. size()-1; reading before it is an error.
class EngramHistory {
 public:
  explicit EngramHistory(int64_t pad_id);

  // Stores ids for positions [start_pos, start_pos + ids.size()); any history at or after
  // start_pos is replaced (positions beyond the new end are dropped: no later hash reads them
  // before they are written again). first_position() <= start_pos <= size(); each id is >= 0
  // or kEngramDead.
  void write(int64_t start_pos, const std::vector<int64_t>& compressed_ids);

  // Replaces the history with the tail `compressed_ids` of positions [first_position,
  // first_position + ids.size()) (a saved session keeps the last max_ngram - 1 ids: the hash of
  // a later position never reads further back). Each id is >= 0 or kEngramDead.
  void restore(int64_t first_position, const std::vector<int64_t>& compressed_ids);

  int64_t size() const { return first_ + static_cast<int64_t>(ids_.size()); }  // positions so far
  int64_t first_position() const { return first_; }  // 0 unless restored
  int64_t pad_id() const { return pad_id_; }
  // The id of `position`, in [first_position(), size()); else a dsv41::Error.
  int64_t at(int64_t position) const;
  // Ids of positions first_position() .. size()-1 (every position unless restored).
  const std::vector<int64_t>& ids() const { return ids_; }

 private:
  int64_t pad_id_;
  int64_t first_ = 0;
  std::vector<int64_t> ids_;
};

// Hash ids of positions [start_pos, start_pos + count) for engram layer `layer_index`
// (layout.layer_ids[layer_index]); those positions must be in the history.
// -> [count, n_cols] int64 table rows, columns (order 2: heads 0.., order 3: .., ...).
Tensor<int64_t> engram_hash_ids(const EngramLayout& layout, int layer_index,
                                const EngramHistory& history, int64_t start_pos, int64_t count);

// ---- 3. lookup ----

// One layer's fp8 table (ParallelEngramEmbedding, world size 1), borrowed.
struct EngramTableRef {
  const uint8_t* codes = nullptr;   // [rows, head_dim] E4M3 codes
  const uint8_t* scales = nullptr;  // [rows, head_dim / 32] E8M0 codes, one per 32 of a row
  int64_t rows = 0;
  int head_dim = 0;
};
// From raw code vectors (weights.h EngramWeights); throws on sizes that do not match.
EngramTableRef engram_table(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                            int64_t rows, int head_dim);

// out[t, c*head_dim + d] = bf16(fp32(e4m3(code[id, d])) * fp32(e8m0(scale[id, d/32]))):
// the product in fp32 (exact unless it leaves the normal fp32 range), then one rounding to bf16.
// ids: [T, n_cols] int64, each in [0, rows) -> [T, n_cols * head_dim] bf16.
Tensor<float> engram_lookup(const EngramTableRef& table, const Tensor<int64_t>& ids);

// ---- 4. gate + residual ----

// The gate per (token, copy), fp32 (x, key, q/k weights are bf16 values, everything else fp32,
// no FMA; sums in torch's CPU order, reference/ops/rmsnorm.h torch_sum_f32):
//   w[d]   = q_weight[c, d] * k_weight[c, d]
//   rstd   = (1 / sqrt(sum(h^2)/dim + eps)) * (1 / sqrt(sum(key^2)/dim + eps))
//   dot    = ((sum_d (h[d] * w[d]) * key[d]) * rstd) * fp32(dim^-0.5)
//   gate   = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)), sigmoid = torch_sigmoid_f32 (mhc.h)
//   gate   = 0 where live[t] == 0
// with h = x[t, c, :] and key = kv[t, c*dim : (c+1)*dim]; eps = (float)norm_eps.
// x: [T, hc, dim] bf16, kv: [T, (hc+1)*dim] bf16, q_weight/k_weight: [hc*dim] bf16 -> [T, hc] fp32.
Tensor<float> engram_gates(const Tensor<float>& x, const Tensor<float>& kv,
                           const std::vector<float>& q_weight, const std::vector<float>& k_weight,
                           double eps, const std::vector<uint8_t>& live = {});

// out[t, c, d] = bf16(h[d] + gate[t, c] * value[d]) (fp32 product, fp32 sum, one rounding), with
// value = kv[t, hc*dim : (hc+1)*dim].
// x: [T, hc, dim] bf16, kv: [T, (hc+1)*dim] bf16 -> [T, hc, dim] bf16.
Tensor<float> engram_gate_residual(const Tensor<float>& x, const Tensor<float>& kv,
                                   const std::vector<float>& q_weight,
                                   const std::vector<float>& k_weight, double eps,
                                   const std::vector<uint8_t>& live = {});

}  // namespace dsv41::reference
