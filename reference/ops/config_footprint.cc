// reference/ops/config_footprint.cc: a config's derived sizes (reference/ops/config_footprint.h).
// The tensor list mirrors checkpoint::expected_tensors (reference/checkpoint/weights.cc); the test
// ConfigFootprint.MatchesTheTensorList keeps the two equal.
#include "reference/ops/config_footprint.h"

#include <initializer_list>
#include <utility>
#include <unordered_set>

#include "base/error.h"
#include "base/input_file.h"

namespace dsv41::reference {
namespace {

// Sums tensors' bytes and counts, every product and sum overflow-checked.
class Sum {
 public:
  explicit Sum(std::string what) : what_(std::move(what)) {}
  // One tensor of `bits` per value and this shape.
  void add(uint64_t bits, std::initializer_list<int64_t> shape) {
    uint64_t numel = 1;
    for (int64_t s : shape) numel = input::checked_mul(numel, static_cast<uint64_t>(s < 0 ? 0 : s), what_);
    bytes_ = input::checked_add(bytes_, input::checked_mul(numel, bits, what_) / 8, what_);
    count_ = input::checked_add(count_, 1, what_);
  }
  // An fp8 linear: E4M3 [out, in] + E8M0 scale [ceil(out/32), ceil(in/32)].
  void fp8(int64_t out, int64_t in) {
    add(8, {out, in});
    add(8, {(out + 31) / 32, (in + 31) / 32});
  }
  // An fp4 expert linear: F4 [out, in] + E8M0 scale [out, in/32].
  void fp4(int64_t out, int64_t in) {
    add(4, {out, in});
    add(8, {out, in / 32});
  }
  // `times` copies of what `one` adds (experts: one pass, not one per expert).
  template <typename F>
  void repeat(uint64_t times, F one) {
    Sum s(what_);
    one(s);
    bytes_ = input::checked_add(bytes_, input::checked_mul(s.bytes_, times, what_), what_);
    count_ = input::checked_add(count_, input::checked_mul(s.count_, times, what_), what_);
  }
  uint64_t bytes() const { return bytes_; }
  uint64_t count() const { return count_; }

 private:
  std::string what_;
  uint64_t bytes_ = 0, count_ = 0;
};

}  // namespace

ConfigFootprint config_footprint(const ModelConfig& c, const std::string& source) {
  Sum w(source + ": derived weight bytes");
  const int64_t dim = c.dim, H = c.n_heads, D = c.head_dim, G = c.o_groups > 0 ? c.o_groups : 1, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc;
  w.add(16, {c.vocab_size, dim});  // embed
  w.add(16, {dim});                // norm
  w.add(32, {c.vocab_size, dim});  // head (F32)
  const std::unordered_set<int> kv(c.kv_source_layers.begin(), c.kv_source_layers.end());
  const std::unordered_set<int> index(c.index_source_layers.begin(), c.index_source_layers.end());
  std::unordered_set<int> engram_layers;
  for (size_t i = 0; i < c.engram_layer_ids.size() && i < c.engram_num_embeddings.size(); ++i) {
    engram_layers.insert(c.engram_layer_ids[i]);
  }
  Sum state(source + ": derived state bytes");
  for (int l = 0; l < c.total_layers(); ++l) {
    const bool backbone = l < c.n_layers;
    const int ratio = static_cast<size_t>(l) < c.compress_ratios.size() ? c.compress_ratios[static_cast<size_t>(l)] : 0;
    w.add(16, {dim});
    w.add(16, {dim});
    for (int s = 0; s < 2; ++s) {
      w.add(32, {mix, hc * dim});
      w.add(32, {mix});
      w.add(32, {3});
    }
    w.add(32, {H});
    w.fp8(c.q_lora_rank, dim);
    w.add(16, {c.q_lora_rank});
    w.fp8(H * D, c.q_lora_rank);
    w.fp8(D, dim);
    w.add(16, {D});
    w.add(16, {G * c.o_lora_rank, H * D / G});
    w.fp8(dim, G * c.o_lora_rank);
    const bool kv_source = backbone && kv.count(l) > 0;
    const bool index_source = backbone && index.count(l) > 0;
    if (kv_source) {
      w.add(ratio > 1 ? 32 : 16, {D, dim});
      if (ratio > 1) w.add(32, {D, dim});
      w.add(16, {D});
    }
    if (index_source) {
      w.fp8(int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank);
      w.add(16, {c.index_n_heads, dim});
      if (kv_source) {
        w.add(16, {c.index_head_dim, D});
        w.add(16, {c.index_head_dim});
      }
    }
    const int64_t E = backbone || c.dspark_n_routed_experts == 0 ? c.n_routed_experts : c.dspark_n_routed_experts;
    w.add(16, {E, dim});
    w.add(32, {E});
    w.repeat(static_cast<uint64_t>(E), [&](Sum& e) {
      e.fp4(c.moe_inter_dim, dim);
      e.fp4(dim, c.moe_inter_dim);
      e.fp4(c.moe_inter_dim, dim);
    });
    for (int s = 0; s < 3; ++s) w.fp8(s == 1 ? dim : c.moe_inter_dim, s == 1 ? c.moe_inter_dim : dim);
    if (backbone && engram_layers.count(l)) {
      size_t ei = 0;
      while (c.engram_layer_ids[ei] != l) ++ei;
      const int64_t rows = c.engram_num_embeddings[ei];
      const int64_t cols = int64_t{c.engram_max_ngram_size - 1} * c.engram_n_heads;
      w.add(8, {rows, c.engram_head_dim});
      w.add(8, {rows, c.engram_head_dim / 32});
      w.fp8((hc + 1) * dim, cols * c.engram_head_dim);
      w.add(16, {hc, dim});
      w.add(16, {hc, dim});
    }
    if (!backbone && l == c.n_layers) {
      w.fp8(dim, dim * static_cast<int64_t>(c.dspark_target_layer_ids.size()));
      w.add(16, {dim});
    }
    if (!backbone && l == c.total_layers() - 1) {
      w.add(16, {dim});
      w.add(16, {c.vocab_size, c.dspark_markov_rank});
      w.add(32, {c.vocab_size, c.dspark_markov_rank});
      w.add(32, {1, dim + c.dspark_markov_rank});
    }
    // One sequence's caches, at least: the window ring (fp8) of every layer, and the compressed KV
    // and index-key caches (fp4) of a kv source.
    state.add(8, {c.window_size, D});
    if (kv_source && ratio > 0) state.add(4, {c.max_seq_len / ratio, D + c.index_head_dim});
  }
  return {w.count(), w.bytes(), state.bytes()};
}

void check_fits_machine(const ModelConfig& c, const std::string& source) {
  const ConfigFootprint f = config_footprint(c, source);
  const uint64_t need = input::checked_add(f.weight_bytes, f.state_bytes, source + ": derived bytes");
  input::check_memory(need, source + ": its weights (" + std::to_string(f.weight_bytes) + " bytes, " +
                                input::bytes_text(f.weight_bytes) + ") and the caches of one sequence (at least " +
                                std::to_string(f.state_bytes) + " bytes)");
}

}  // namespace dsv41::reference
