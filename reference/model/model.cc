#include "reference/model/model.h"

#include <algorithm>

#include "reference/model/forward.h"

namespace dsv41::reference::model {

using formats::CacheFormat;

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

Model::~Model() {
  try {
    ops_->release(weights_, rope_);
  } catch (...) {  // a destructor does not throw; the ops' mirrors are only a cache
  }
}

Model::Model(ModelConfig config, checkpoint::ModelWeights weights, std::vector<int64_t> token_map, const seam::Ops& ops)
    : config_(std::move(config)), ops_(&ops), weights_(std::move(weights)), token_map_(std::move(token_map)) {
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
  for (int l = 0; l < c.total_layers(); ++l) rope_.push_back(RopeTable::for_layer(c, l));
  dspark_target_.assign(static_cast<size_t>(c.n_layers), false);
  if (c.n_mtp_layers > 0) {
    DSV41_CHECK(static_cast<int>(weights_.blocks.size()) == c.total_layers(), "DSpark: ", weights_.blocks.size(),
                " blocks of weights for ", c.total_layers(), " layers");
    for (int l : c.dspark_target_layer_ids) dspark_target_[static_cast<size_t>(l)] = true;
  }
  if (!c.engram_layer_ids.empty()) {
    engram_ = EngramLayout::build(c);
    engram_pad_ = engram_pad_id(token_map_, c.engram_pad_id);
  }
  ops_->prepare(weights_, rope_);
}

ModelState Model::new_state() const {
  const ModelConfig& c = config_;
  ModelState s(engram_pad_);
  s.precision = precision_;
  s.recent_tokens.assign(static_cast<size_t>(recent_token_count(c)), -1);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerInfo& info = schedule_[static_cast<size_t>(l)];
    LayerState ls;
    ls.window_kv = WindowKvRing(c.window_size, c.head_dim, stored_format(precision_, CacheFormat::kWindowKvFp8));
    ls.window_kv.bytes = ops_->upload(std::move(ls.window_kv.bytes));
    if (info.role == LayerRole::kFull) {
      const int64_t capacity = c.max_seq_len / info.ratio;
      if (info.ratio > 1) {
        ls.compressor.emplace(info.ratio, c.head_dim);
        ls.compressor->kv = ops_->upload(std::move(ls.compressor->kv));
        ls.compressor->score = ops_->upload(std::move(ls.compressor->score));
      }
      ls.compressed_kv.emplace("compressed KV cache", stored_format(precision_, CacheFormat::kCompressedKvFp4), l,
                               info.ratio, c.head_dim, capacity);
      ls.index_keys.emplace("index-key cache", stored_format(precision_, CacheFormat::kIndexKeysFp4), l, info.ratio,
                            c.index_head_dim, capacity);
      ls.compressed_kv->place(*ops_);
      ls.index_keys->place(*ops_);
    }
    s.layers.push_back(std::move(ls));
  }
  for (int i = 0; i < c.n_mtp_layers; ++i) {
    WindowKvRing ring(c.window_size, c.head_dim, stored_format(precision_, CacheFormat::kWindowKvFp8));
    ring.bytes = ops_->upload(std::move(ring.bytes));
    s.dspark_window_kv.push_back(std::move(ring));
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
  for (LayerState& ls : state.layers) ls.window_kv.clear();
  for (WindowKvRing& ring : state.dspark_window_kv) ring.clear();  // rebuilt from the tail as well
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

std::vector<CacheView> Model::cache_views(const ModelState& state) const {
  return model::cache_views(state, *ops_);
}

namespace {

// Moves a step's records to the host (the only download of a step without hooks) and keeps of each
// candidate mask the reachable part (position < reach: the pinned block may extend past a query's
// reach, and how far depends on where the step ends, not on the selection).
void finish_record(const seam::Ops& ops, StepSelections& sel, StepRecord& rec) {
  for (auto& [l, t] : sel.topk) rec.topk.emplace(l, ops.download(std::move(t)));
  for (auto& [l, t] : sel.candidates) {
    Tensor<uint8_t> mask = ops.download(std::move(t));  // [T, N]
    const std::vector<int64_t>& reach = sel.reach.at(l);
    DSV41_CHECK(mask.rank() == 2 && static_cast<int64_t>(reach.size()) == mask.dim(0), "candidate mask of layer ",
                l, ": ", shape_string(mask.shape()), " for ", reach.size(), " rows of reach");
    for (int64_t r = 0; r < mask.dim(0); ++r) {
      const int64_t from = std::clamp<int64_t>(reach[static_cast<size_t>(r)], 0, mask.dim(1));
      std::fill(mask.row(r) + from, mask.row(r) + mask.dim(1), uint8_t{0});
    }
    rec.candidates.emplace(l, std::move(mask));
  }
  for (auto& [l, t] : sel.engram_ids) rec.engram_ids.emplace(l, ops.download(std::move(t)));
  for (auto& [l, t] : sel.experts) rec.experts.emplace(l, ops.download(std::move(t)));
}

}  // namespace

StepRecord Model::forward_chunk(ModelState& state, const std::vector<int64_t>& tokens,
                                const StepOptions& options) const {
  const ModelConfig& c = config_;
  const seam::Ops& ops = *ops_;
  const int64_t T = static_cast<int64_t>(tokens.size()), hc = c.hc_mult;
  const int64_t start = state.pos;
  check_precision(state);
  DSV41_CHECK(T >= 1, "a forward step needs at least one token");
  DSV41_CHECK(start + T <= c.max_seq_len, "positions ", start, "..", start + T - 1,
              " exceed max_seq_len ", c.max_seq_len);
  for (int64_t t = 0; t < T; ++t) {
    DSV41_CHECK(tokens[static_cast<size_t>(t)] >= 0 && tokens[static_cast<size_t>(t)] < c.vocab_size,
                "token ", t, " = ", tokens[static_cast<size_t>(t)], " is outside the vocab [0, ", c.vocab_size, ")");
  }
  DSV41_CHECK(options.decoder_replay_rows >= 0, "decoder_replay_rows must be >= 0");
  if (options.decoder_replay_rows > 0) {
    DSV41_CHECK(c.candidate_source_layer >= 0, "decoder replay needs a candidate source layer");
    for (int kv : c.kv_source_layers) {
      DSV41_CHECK(kv <= c.candidate_source_layer, "decoder replay: kv source ", kv,
                  " after the candidate source would write its cache from a tail only");
    }
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
  // Engram history: the compressed ids of the new tokens (host metadata, from the token ids).
  if (!c.engram_layer_ids.empty()) state.engram.write(start, engram_compress_tokens(token_map_, tokens));

  static const ForwardHooks kNoHooks;
  const ForwardHooks& hooks = options.hooks_off ? kNoHooks : hooks_;
  const Observer observe(ops, hooks);
  StepSelections sel;
  Tensor<float> stream = ops.embed(tokens, weights_.embed, hc);  // [T, hc, dim] bf16
  observe(Component::kEmbed, -1, stream);
  Tensor<float> pre = ops.hc_identity_pre(T, hc);  // [T, hc] fp32: the pre the next sublayer applies
  SharedAttention shared;
  StepContext step{{ops, c, observe}, weights_, rope_, state, shared, sel, AttentionStepMode{}};
  step.mode.window_floor = options.window_floor;
  step.mode.local_only = options.local_only;
  std::vector<Tensor<float>> dspark_parts;  // hc_mean of each DSpark target layer's input, layer order
  // The rows still running: all of them, or only a tail after the candidate source (decoder
  // replay). cur_start / cur_T are their first position and count.
  int64_t cur_start = start, cur_T = T;

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerInfo& info = schedule_[static_cast<size_t>(l)];
    const checkpoint::BlockWeights& bw = weights_.blocks[static_cast<size_t>(l)];
    observe(Component::kInStream, l, stream);
    observe(Component::kInPre, l, pre);
    if (bw.has_engram) {
      Tensor<int64_t> ids = ops.engram_hash_ids(engram_, engram_.layer_index(l), state.engram, cur_start, cur_T);
      const Tensor<float> kv = ops.linear(ops.engram_lookup(bw.engram, c.engram_head_dim, ids), bw.engram.wkv);
      stream = ops.engram_gate_residual(stream, kv, bw.engram, c.norm_eps);
      sel.engram_ids.insert_or_assign(l, std::move(ids));
      observe(Component::kEngramOut, l, stream);
    }
    // DSpark reads the input of its target layers (after the Engram), not their output.
    if (c.n_mtp_layers > 0 && dspark_target_[static_cast<size_t>(l)]) dspark_parts.push_back(ops.hc_mean(stream));
    const int64_t block_start = cur_start;
    sel.experts.insert_or_assign(
        l, block_forward(step, kBackboneBlock, l, bw,
                         [&](const Tensor<float>& x) { return attention_sublayer(step, info, x, block_start); },
                         stream, pre));
    if (l == c.candidate_source_layer && options.decoder_replay_rows > 0 && cur_T > options.decoder_replay_rows) {
      const int64_t keep = options.decoder_replay_rows, drop = cur_T - keep;
      stream = ops.slice_rows(stream, drop, keep);
      pre = ops.slice_rows(pre, drop, keep);
      // What the candidate source published is re-addressed to the tail: its rows (the top-k
      // holds compressed positions: each consumer adds its own window rows).
      if (shared.candidates) shared.candidates->mask = ops.slice_rows(shared.candidates->mask, drop, keep);
      if (shared.topk) shared.topk->idxs = ops.slice_rows(shared.topk->idxs, drop, keep);
      cur_start += drop;
      cur_T = keep;
      step.mode.window_floor = std::max(step.mode.window_floor, cur_start);
    }
  }

  // Head: collapse with the last FFN's pre, norm, fp32 head (the last position; every position
  // with set_full_logits).
  const bool every_row = full_logits_ || options.all_logits;
  const int64_t first = every_row ? 0 : cur_T - 1;
  Tensor<float> h = ops.rms_norm(
      ops.hc_pre(ops.slice_rows(stream, first, cur_T - first), ops.slice_rows(pre, first, cur_T - first)),
      weights_.norm, c.norm_eps);
  observe(Component::kFinalNormOut, -1, h);
  Tensor<float> logits = ops.linear_fp32(h, weights_.head);  // [cur_T - first, vocab] fp32
  observe(Component::kLogits, -1, logits);
  // DSpark: every position of the step into the DSpark rings.
  if (c.n_mtp_layers > 0) dspark_write(state, std::move(dspark_parts), cur_start, cur_T, observe);

  // The step's record, on the host.
  if (!options.logits_only) finish_record(ops, sel, rec);
  logits = ops.download(std::move(logits));
  rec.logits.assign(logits.row(cur_T - first - 1), logits.row(cur_T - first - 1) + c.vocab_size);
  if (every_row) rec.all_logits = std::move(logits);
  state.pos = start + T;
  return rec;
}

}  // namespace dsv41::reference::model
