#include "reference/model.h"

#include <algorithm>

#include "formats/packed.h"
#include "reference/attention_layer.h"
#include "reference/linear.h"
#include "reference/mhc.h"
#include "reference/moe.h"
#include "reference/rmsnorm.h"

namespace dsv41::reference {

// ------------------------------------------------------------------------------- SWA ring

int64_t SwaRing::entry_bytes() const { return formats::entry_bytes(format(), static_cast<int>(head_dim)); }

namespace {

// One slot's entry: kPacked formats::pack_swa_kv (FP8), kBf16 formats::pack_bf16. false on a
// value the format cannot hold (NaN/Inf, or a bf16 overflow).
bool pack_swa_entry(CachePrecision p, const float* row, int d, uint8_t* out) {
  return p == CachePrecision::kBf16 ? formats::pack_bf16(row, d, out) : formats::pack_swa_kv(row, d, out);
}

void unpack_swa_entry(CachePrecision p, const uint8_t* in, int d, float* out) {
  if (p == CachePrecision::kBf16) {
    formats::unpack_bf16(in, d, out);
  } else {
    formats::unpack_swa_kv(in, d, out);
  }
}

}  // namespace

void SwaRing::write(int64_t position, const float* kv_row) {
  const int64_t eb = entry_bytes();
  const int64_t slot = position % window;
  DSV41_CHECK(pack_swa_entry(precision, kv_row, static_cast<int>(head_dim), bytes.data() + slot * eb),
              "SWA ring: window KV at position ", position, " holds NaN/Inf");
  positions[static_cast<size_t>(slot)] = position;
}

Tensor<float> SwaRing::read_all() const {
  const int64_t eb = entry_bytes();
  Tensor<float> out({window, head_dim}, "window_kv_ring");
  for (int s = 0; s < window; ++s) {
    if (positions[static_cast<size_t>(s)] < 0) continue;  // never read: its index is -1
    unpack_swa_entry(precision, bytes.data() + s * eb, static_cast<int>(head_dim), out.row(s));
  }
  return out;
}

Tensor<float> SwaRing::read_positions(int64_t first, int64_t count) const {
  const int64_t eb = entry_bytes();
  DSV41_CHECK(count >= 0 && count <= window, "SWA ring: cannot read ", count, " positions from a ring of ", window);
  Tensor<float> out({count, head_dim}, "window_kv_ring");
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = first + i, slot = p % window;
    DSV41_CHECK(p >= 0 && positions[static_cast<size_t>(slot)] == p, "SWA ring does not hold position ", p,
                " (slot ", slot, " holds ", positions[static_cast<size_t>(slot)], ")");
    unpack_swa_entry(precision, bytes.data() + slot * eb, static_cast<int>(head_dim), out.row(i));
  }
  return out;
}

std::vector<CacheView> cache_views(const ModelState& state) {
  std::vector<CacheView> out;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    const SwaRing& ring = state.layers[l].ring;
    CacheView v;
    v.kind = "swa";
    v.layer = static_cast<int>(l);
    v.format = ring.format();
    v.dim = ring.head_dim;
    v.entry_bytes = ring.entry_bytes();
    std::vector<int64_t> slots;  // occupied slots, by ascending position
    for (int s = 0; s < ring.window; ++s) {
      if (ring.positions[static_cast<size_t>(s)] >= 0) slots.push_back(s);
    }
    std::sort(slots.begin(), slots.end(), [&ring](int64_t a, int64_t b) {
      return ring.positions[static_cast<size_t>(a)] < ring.positions[static_cast<size_t>(b)];
    });
    for (int64_t s : slots) {
      const uint8_t* e = ring.bytes.data() + s * v.entry_bytes;
      v.bytes.insert(v.bytes.end(), e, e + v.entry_bytes);
      v.positions.push_back(ring.positions[static_cast<size_t>(s)]);
    }
    v.entries = static_cast<int64_t>(slots.size());
    out.push_back(std::move(v));
  }
  // The two packed caches share their interface (size, entry, entry_bytes, format, position_offset).
  const auto view_of = [](const char* kind, int layer, const auto& cache, int64_t dim) {
    CacheView v;
    v.kind = kind;
    v.layer = layer;
    v.format = cache.format();
    v.dim = dim;
    v.entry_bytes = cache.entry_bytes();
    v.entries = cache.size();
    for (int64_t e = 0; e < cache.size(); ++e) {
      v.bytes.insert(v.bytes.end(), cache.entry(e), cache.entry(e) + cache.entry_bytes());
      v.positions.push_back(cache.position_offset() + e);
    }
    return v;
  };
  for (size_t l = 0; l < state.layers.size(); ++l) {
    const LayerState& ls = state.layers[l];
    if (ls.kv_cache) out.push_back(view_of("compressed_kv", static_cast<int>(l), *ls.kv_cache, ls.kv_cache->head_dim()));
    if (ls.key_cache) {
      out.push_back(view_of("index_keys", static_cast<int>(l), *ls.key_cache, ls.key_cache->index_head_dim()));
    }
  }
  return out;
}

// ------------------------------------------------------------------------------- model

namespace {

// Rows [first, first + count) of a tensor along its first dimension.
template <typename T>
Tensor<T> slice_rows(const Tensor<T>& x, int64_t first, int64_t count) {
  DSV41_CHECK(first >= 0 && count >= 0 && first + count <= x.dim(0), "rows [", first, ", ", first + count,
              ") outside ", x.dim(0), " rows of '", x.name(), "'");
  std::vector<int64_t> shape = x.shape();
  const int64_t row = x.numel() / std::max<int64_t>(x.dim(0), 1);
  shape[0] = count;
  std::vector<T> data(x.data().begin() + first * row, x.data().begin() + (first + count) * row);
  return Tensor<T>(shape, std::move(data), x.name());
}

}  // namespace

int64_t recent_token_count(const ModelConfig& c) {
  return c.window_size + (c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1);
}

std::vector<int64_t> default_token_map(const ModelConfig& c) {
  std::vector<int64_t> map(static_cast<size_t>(c.vocab_size));
  for (int64_t id = 0; id < c.vocab_size; ++id) {
    map[static_cast<size_t>(id)] = id * c.engram_compressed_vocab_size / c.vocab_size;
  }
  return map;
}

Model::Model(ModelConfig config, ModelWeights weights, std::vector<int64_t> token_map)
    : config_(std::move(config)), weights_(std::move(weights)), token_map_(std::move(token_map)) {
  const ModelConfig& c = config_;
  DSV41_CHECK(static_cast<int64_t>(token_map_.size()) == c.vocab_size, "token map has ",
              token_map_.size(), " entries, the vocab has ", c.vocab_size);
  for (size_t i = 0; i < token_map_.size(); ++i) {
    DSV41_CHECK(c.engram_layer_ids.empty() || (token_map_[i] >= 0 && token_map_[i] < c.engram_compressed_vocab_size),
                "token map entry ", i, " = ", token_map_[i], " is outside [0, engram_compressed_vocab_size = ",
                c.engram_compressed_vocab_size, ")");
  }
  DSV41_CHECK(c.max_batch_size >= 1, "max_batch_size must be >= 1");
  schedule_ = layer_schedule(c);
  for (int l = 0; l < c.n_layers; ++l) rope_.push_back(RopeTable::for_layer(c, l));
  if (!c.engram_layer_ids.empty()) {
    engram_ = EngramLayout::build(c);
    engram_pad_ = engram_pad_id(token_map_, c.engram_pad_id);
  }
}

ModelState Model::new_state() const {
  const ModelConfig& c = config_;
  ModelState s(engram_pad_);
  s.precision = precision_;
  s.recent_tokens.assign(static_cast<size_t>(recent_token_count(c)), -1);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerInfo& info = schedule_[static_cast<size_t>(l)];
    LayerState ls;
    ls.ring.window = c.window_size;
    ls.ring.head_dim = c.head_dim;
    ls.ring.precision = precision_;
    ls.ring.bytes.assign(static_cast<size_t>(c.window_size * ls.ring.entry_bytes()), 0);
    ls.ring.positions.assign(static_cast<size_t>(c.window_size), -1);
    if (info.role == LayerRole::kFull) {
      const int64_t capacity = c.max_seq_len / info.ratio;
      if (info.ratio > 1) ls.compressor.emplace(info.ratio, c.head_dim);
      ls.kv_cache.emplace(l, info.ratio, c.head_dim, capacity, 0, precision_);
      ls.key_cache.emplace(l, info.ratio, c.index_head_dim, capacity, 0, precision_);
    }
    s.layers.push_back(std::move(ls));
  }
  return s;
}

StepRecord Model::prefill(ModelState& state, const std::vector<int64_t>& tokens) const {
  DSV41_CHECK(state.pos == 0, "prefill needs a fresh state (at position 0), this one is at ", state.pos);
  DSV41_CHECK(!tokens.empty(), "prefill needs at least one token");
  return forward_chunk(state, tokens);
}

std::vector<StepRecord> Model::prefill_batch(std::vector<ModelState>& states,
                                             const std::vector<std::vector<int64_t>>& tokens) const {
  DSV41_CHECK(!states.empty() && states.size() == tokens.size(), "prefill_batch: ", states.size(), " states for ",
              tokens.size(), " sequences");
  DSV41_CHECK(static_cast<int>(states.size()) <= config_.max_batch_size, "prefill_batch: batch of ", states.size(),
              " exceeds max_batch_size ", config_.max_batch_size);
  for (size_t b = 0; b < states.size(); ++b) {
    DSV41_CHECK(tokens[b].size() == tokens[0].size(), "prefill_batch: sequence ", b, " has ", tokens[b].size(),
                " tokens, sequence 0 has ", tokens[0].size(), " (the official batch needs equal lengths)");
  }
  std::vector<StepRecord> out;
  for (size_t b = 0; b < states.size(); ++b) out.push_back(prefill(states[b], tokens[b]));
  return out;
}

std::vector<StepRecord> Model::decode_batch(std::vector<ModelState>& states, const std::vector<int64_t>& tokens) const {
  DSV41_CHECK(!states.empty() && states.size() == tokens.size(), "decode_batch: ", states.size(), " states for ",
              tokens.size(), " tokens");
  for (size_t b = 0; b < states.size(); ++b) {
    DSV41_CHECK(states[b].pos == states[0].pos, "decode_batch: sequence ", b, " is at position ", states[b].pos,
                ", sequence 0 at ", states[0].pos);
  }
  std::vector<StepRecord> out;
  for (size_t b = 0; b < states.size(); ++b) out.push_back(decode(states[b], tokens[b]));
  return out;
}

StepRecord Model::decode(ModelState& state, int64_t token) const {
  DSV41_CHECK(state.pos > 0, "decode needs a prefilled state");
  return forward_chunk(state, {token});
}

void Model::check_precision(const ModelState& state) const {
  if (state.precision != precision_) {
    DSV41_FAIL("a ", name(state.precision), "-cache state given to a model set to ", name(precision_),
               " caches (Model::set_cache_precision); make the state with this model's new_state()");
  }
}

void Model::replay_local_state(ModelState& state, const std::vector<int64_t>& tail) const {
  check_precision(state);
  const int64_t n = static_cast<int64_t>(tail.size()), end = state.pos;
  DSV41_CHECK(n >= 1 && n <= end, "encoder replay of ", n, " tokens needs a state at position >= ", n,
              ", this one is at ", end);
  for (LayerState& ls : state.layers) std::fill(ls.ring.positions.begin(), ls.ring.positions.end(), -1);
  state.pos = end - n;
  StepOptions o;
  o.window_floor = end - n;
  o.local_only = true;
  try {
    forward_chunk(state, tail, o);
  } catch (...) {
    state.pos = end;
    throw;
  }
  DSV41_CHECK(state.pos == end, "encoder replay ended at ", state.pos, ", expected ", end);
}

StepRecord Model::forward_chunk(ModelState& state, const std::vector<int64_t>& tokens,
                                const StepOptions& options) const {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size()), dim = c.dim, hc = c.hc_mult;
  const int64_t start = state.pos;
  check_precision(state);
  DSV41_CHECK(T >= 1, "a forward step needs at least one token");
  DSV41_CHECK(start + T <= c.max_seq_len, "positions ", start, "..", start + T - 1,
              " exceed max_seq_len ", c.max_seq_len);
  for (int64_t t = 0; t < T; ++t) {
    DSV41_CHECK(tokens[static_cast<size_t>(t)] >= 0 && tokens[static_cast<size_t>(t)] < c.vocab_size,
                "token ", t, " = ", tokens[static_cast<size_t>(t)], " is outside the vocab [0, ", c.vocab_size, ")");
  }
  StepRecord rec;
  rec.start_pos = start;
  rec.tokens = T;

  // The raw tokens of the last positions (encoder replay reads them after a global-only resume).
  const int64_t kept = static_cast<int64_t>(state.recent_tokens.size());
  DSV41_CHECK(kept == recent_token_count(c), "the state keeps ", kept, " recent tokens, the config ",
              recent_token_count(c), " (a state comes from Model::new_state)");
  for (int64_t t = 0; t < T; ++t) {
    state.recent_tokens[static_cast<size_t>((start + t) % kept)] = tokens[static_cast<size_t>(t)];
  }

  // Engram history: the compressed ids of the new tokens.
  if (!c.engram_layer_ids.empty()) state.engram.write(start, engram_compress_tokens(token_map_, tokens));

  // Embedding, copied to hc streams. stream: [T, hc, dim] bf16.
  Tensor<float> stream({T, hc, dim}, "stream");
  for (int64_t t = 0; t < T; ++t) {
    const float* e = weights_.embed.data() + tokens[static_cast<size_t>(t)] * dim;
    for (int64_t i = 0; i < hc; ++i) std::copy(e, e + dim, stream.row(t, i));
  }
  const auto observe = [&](const char* what, int layer, Tensor<float>& v) { hooks_.on(what, layer, v); };
  const auto observe_mixes = [&](const std::string& prefix, int layer, HcMixes& m) {
    observe((prefix + "_pre").c_str(), layer, m.pre);
    observe((prefix + "_post").c_str(), layer, m.post);
    observe((prefix + "_comb").c_str(), layer, m.comb);
  };
  observe("embed", -1, stream);
  Tensor<float> pre = hc_identity_pre(T, hc);
  SharedAttention shared;
  // The rows still running: all of them, or only a tail after the candidate source (decoder
  // replay). cur_start / cur_T are their first position and count.
  int64_t cur_start = start, cur_T = T;
  AttentionStepMode mode;
  mode.window_floor = options.window_floor;
  mode.local_only = options.local_only;
  DSV41_CHECK(options.decoder_replay_rows >= 0, "decoder_replay_rows must be >= 0");
  if (options.decoder_replay_rows > 0) {
    DSV41_CHECK(c.candidate_source_layer >= 0, "decoder replay needs a candidate source layer");
    for (int kv : c.kv_source_layers) {
      DSV41_CHECK(kv <= c.candidate_source_layer, "decoder replay: kv source ", kv,
                  " after the candidate source would write its cache from a tail only");
    }
  }

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerInfo& info = schedule_[static_cast<size_t>(l)];
    const BlockWeights& bw = weights_.blocks[static_cast<size_t>(l)];
    observe("in_stream", l, stream);
    observe("in_pre", l, pre);
    if (bw.has_engram) {
      const int li = engram_.layer_index(l);
      Tensor<int64_t> ids = engram_hash_ids(engram_, li, state.engram, cur_start, cur_T);
      const EngramTableRef table =
          engram_table(bw.engram.table, bw.engram.table_scale, bw.engram.rows, c.engram_head_dim);
      const Tensor<float> kv = linear(engram_lookup(table, ids), bw.engram.wkv);
      stream = engram_gate_residual(stream, kv, bw.engram.q_weight, bw.engram.k_weight, c.norm_eps);
      rec.engram_ids.emplace(l, std::move(ids));
      observe("engram_out", l, stream);
    }
    // Attention sublayer: its mixes come from the stream before it; it applies the previous pre.
    HcMixes am = hc_mixes(stream, bw.hc_attn.fn, bw.hc_attn.scale, bw.hc_attn.base, c.norm_eps,
                          c.hc_sinkhorn_iters, c.hc_eps);
    observe_mixes("hc_attn", l, am);
    AttentionRecord arec;
    Tensor<float> a_in = rms_norm(hc_pre(stream, pre), bw.attn_norm, c.norm_eps);
    observe("attn_in", l, a_in);
    Tensor<float> a_out = attention_sublayer(a_in, cur_start, c, info, bw.attn,
                                             rope_[static_cast<size_t>(l)], state, shared, arec, &hooks_, mode);
    observe("attn_out", l, a_out);
    stream = hc_post(a_out, stream, am.post, am.comb);
    observe("attn_stream", l, stream);
    if (arec.topk) rec.topk.emplace(l, std::move(*arec.topk));
    if (arec.candidates) rec.candidates.emplace(l, std::move(*arec.candidates));
    // FFN sublayer: applies the attention's pre.
    HcMixes fm = hc_mixes(stream, bw.hc_ffn.fn, bw.hc_ffn.scale, bw.hc_ffn.base, c.norm_eps,
                          c.hc_sinkhorn_iters, c.hc_eps);
    observe_mixes("hc_ffn", l, fm);
    Tensor<float> f_in = rms_norm(hc_pre(stream, am.pre), bw.ffn_norm, c.norm_eps);
    observe("ffn_in", l, f_in);
    MoeOutput moe = moe_forward(f_in, bw.ffn, c, l, &hooks_);
    observe("ffn_out", l, moe.y);
    stream = hc_post(moe.y, stream, fm.post, fm.comb);
    observe("out_stream", l, stream);
    rec.experts.emplace(l, std::move(moe.routing.experts));
    pre = fm.pre;
    if (l == c.candidate_source_layer && options.decoder_replay_rows > 0 && cur_T > options.decoder_replay_rows) {
      const int64_t keep = options.decoder_replay_rows, drop = cur_T - keep;
      stream = slice_rows(stream, drop, keep);
      pre = slice_rows(pre, drop, keep);
      // What the candidate source published is re-addressed to the tail: its rows, and the
      // top-k offset (= window rows in front of the compressed rows: now the tail's own rows).
      if (shared.candidates) shared.candidates->mask = slice_rows(shared.candidates->mask, drop, keep);
      if (shared.topk) {
        Tensor<int32_t> idxs = slice_rows(shared.topk->idxs, drop, keep);
        for (int32_t& v : idxs.data()) v = v < 0 ? -1 : static_cast<int32_t>(v - shared.topk->offset + keep);
        shared.topk->idxs = std::move(idxs);
        shared.topk->offset = keep;
      }
      cur_start += drop;
      cur_T = keep;
      mode.window_floor = std::max(mode.window_floor, cur_start);
    }
  }

  // Head: collapse with the last FFN's pre, norm, fp32 head (the last position; every position
  // with set_full_logits).
  const int64_t first = full_logits_ ? 0 : cur_T - 1;
  Tensor<float> h = rms_norm(hc_pre(slice_rows(stream, first, cur_T - first), slice_rows(pre, first, cur_T - first)),
                             weights_.norm, c.norm_eps);
  observe("final_norm_out", -1, h);
  Tensor<float> logits = linear_fp32(h, weights_.head);  // [cur_T - first, vocab] fp32
  observe("logits", -1, logits);
  rec.logits.assign(logits.row(cur_T - first - 1), logits.row(cur_T - first - 1) + c.vocab_size);
  if (full_logits_) rec.all_logits = std::move(logits);
  state.pos = start + T;
  return rec;
}

}  // namespace dsv41::reference
