// bench/synthetic_state.cc: a model state at context C without a prefill (bench/synthetic_state.h).
#include "bench/synthetic_state.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/engram.h"
#include "reference/seam/ops.h"

namespace dsv41::bench {

namespace {

using reference::Tensor;
using reference::model::ModelState;
using reference::model::PackedCache;
using reference::model::WindowKvRing;

// Rows written per call: [kChunk, dim] fp32 on the host at a time (32 MiB at dim 128).
constexpr int64_t kChunk = 65536;

// [n, dim] random values rounded to bf16 (the caches' rows are bf16 tensors), uniform in [-2, 2):
// the scale of a normed latent. Drawn from `rng` row by row.
Tensor<float> random_rows(std::mt19937_64& rng, int64_t n, int64_t dim, const char* name) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Tensor<float> rows({n, dim}, name);
  for (float& v : rows.data()) v = formats::round_to_bf16(u(rng));
  return rows;
}

// Entries [0, count) of `cache` from random rows, through the ops' own write (and packer).
void fill_cache(const reference::seam::Ops& ops, PackedCache& cache, int64_t count, std::mt19937_64& rng) {
  DSV41_CHECK(count <= cache.capacity(), cache.label(), " of layer ", cache.owner_layer(), ": ", count,
              " synthetic entries exceed its capacity ", cache.capacity(), " (max_seq_len / ratio)");
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t n = std::min(kChunk, count - first);
    cache.write(ops, first, ops.upload(random_rows(rng, n, cache.dim(), "synthetic_cache_rows")));  // [n, dim] bf16
  }
}

// The ring holds positions context - window .. context - 1, QDQ'd as the forward does before writing.
void fill_ring(const reference::seam::Ops& ops, WindowKvRing& ring, int64_t context, std::mt19937_64& rng) {
  const Tensor<float> rows = ops.qdq(ring.format, ops.upload(random_rows(rng, ring.window, ring.head_dim,
                                                                         "synthetic_window_rows")));  // [window, head_dim]
  ring.write(ops, context - ring.window, rows);
}

template <typename T>
int64_t tensor_bytes(const Tensor<T>& t) {
  return t.numel() * static_cast<int64_t>(sizeof(T));
}

int64_t ring_held(const WindowKvRing& ring) {
  const auto filled = std::count_if(ring.positions.begin(), ring.positions.end(), [](int64_t p) { return p >= 0; });
  return static_cast<int64_t>(filled) * ring.entry_bytes();
}

}  // namespace

int64_t context_multiple(const reference::ModelConfig& c) {
  int64_t m = 1;
  for (int r : c.compress_ratios) {
    if (r > 0) m = std::lcm(m, int64_t{r});
  }
  return m;
}

int64_t expected_entries(int64_t context, int ratio) {
  DSV41_CHECK(ratio >= 1, "expected_entries: ratio ", ratio);
  return context / ratio;
}

void check_synthetic_context(const reference::ModelConfig& c, int64_t context, int64_t steps) {
  const int64_t least = reference::model::recent_token_count(c), multiple = context_multiple(c);
  DSV41_CHECK(context >= least, "context ", context, ": a synthetic state needs at least ", least,
              " positions (window_size ", c.window_size, " + the Engram n-gram reach: the rings and recent tokens full)");
  DSV41_CHECK(context % multiple == 0, "context ", context, " is not a multiple of ", multiple,
              " (the least common multiple of compress_ratios: no compressor may hold a partial group)");
  DSV41_CHECK(steps >= 0 && context + steps <= c.max_seq_len, "context ", context, " + ", steps,
              " decode steps exceed max_seq_len ", c.max_seq_len);
}

ModelState synthetic_state(const reference::model::Model& model, int64_t context, uint64_t seed) {
  const reference::ModelConfig& c = model.config();
  const reference::seam::Ops& ops = model.ops();
  check_synthetic_context(c, context, 0);
  std::mt19937_64 rng(seed);

  ModelState s = model.new_state();
  // Tokens: the Engram history of every position, and the recent raw tokens.
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  std::vector<int64_t> tokens(static_cast<size_t>(context));  // [context] ids
  for (int64_t& t : tokens) t = token(rng);
  if (!c.engram_layer_ids.empty()) s.engram.write(0, reference::engram_compress_tokens(model.token_map(), tokens));
  const int64_t kept = static_cast<int64_t>(s.recent_tokens.size());
  for (int64_t p = context - kept; p < context; ++p) {
    s.recent_tokens[static_cast<size_t>(p % kept)] = tokens[static_cast<size_t>(p)];
  }
  // Global caches of every kv source, then the compressors' position.
  for (reference::model::LayerState& ls : s.layers) {
    if (ls.compressed_kv) fill_cache(ops, *ls.compressed_kv, expected_entries(context, ls.compressed_kv->ratio()), rng);
    if (ls.index_keys) fill_cache(ops, *ls.index_keys, expected_entries(context, ls.index_keys->ratio()), rng);
    if (ls.compressor) ls.compressor->next_pos = context;  // pending() == 0: context % ratio == 0
  }
  // Local state: every window_kv ring, then the DSpark rings.
  for (reference::model::LayerState& ls : s.layers) fill_ring(ops, ls.window_kv, context, rng);
  for (WindowKvRing& ring : s.dspark_window_kv) fill_ring(ops, ring, context, rng);
  s.pos = context;
  return s;
}

StateBytes state_bytes(const ModelState& state) {
  StateBytes b;
  auto ring = [&](const WindowKvRing& r) {
    b.allocated += tensor_bytes(r.bytes);
    b.held += ring_held(r);
    b.host_metadata += static_cast<int64_t>(r.positions.size() * sizeof(int64_t));
  };
  for (const reference::model::LayerState& ls : state.layers) {
    ring(ls.window_kv);
    for (const auto* cache : {&ls.compressed_kv, &ls.index_keys}) {
      if (!*cache) continue;
      b.allocated += tensor_bytes((*cache)->storage());
      b.held += (*cache)->size() * (*cache)->entry_bytes();
    }
    if (ls.compressor) {
      b.allocated += tensor_bytes(ls.compressor->kv) + tensor_bytes(ls.compressor->score);
      b.held += 2 * ls.compressor->pending() * ls.compressor->dim * static_cast<int64_t>(sizeof(float));
    }
  }
  for (const WindowKvRing& r : state.dspark_window_kv) ring(r);
  b.host_metadata += static_cast<int64_t>((state.engram.ids().size() + state.recent_tokens.size()) * sizeof(int64_t));
  return b;
}

}  // namespace dsv41::bench
