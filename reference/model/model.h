// reference/model/model.h
//
// The DeepSeek-V4.1-Flash backbone forward, as the official Transformer.forward runs it:
// embed -> hc_mult copies -> for each layer [Engram] -> Block (mHC + attention + MoE) -> hc_pre ->
// norm -> fp32 head. Two entry points, the official envelope:
//   prefill(state, tokens)  tokens at positions 0 .. T-1 (start_pos 0), state must be fresh
//   decode(state, token)    one token at position state.pos
// Both return the logits of the last position and record every selection a port must agree on.
//
// The model is the orchestration, written once: chunks, caches, ownership, published selections,
// bounded replay and hooks. It reaches every component through its Ops (reference/seam/ops.h): the
// CPU reference by default, or another backend's implementation of the same table
// (docs/architecture.md). It never reads a tensor's values itself.
//
// State (ModelState, reference/model/kv_cache.h) holds what the official code keeps in module buffers:
// per layer the window_kv ring (packed FP8 entries), per kv source the compressed_kv and
// index_keys caches (packed FP4) and the compressor's partial group, the Engram n-gram history,
// and the raw tokens of the last positions (what encoder replay reads after a global-only
// resume). Shared objects carry their owner layer and ratio; a consumer that expects another
// owner gets a dsv41::Error.
//
// Beyond the official envelope, forward_chunk runs any number of tokens at any position with the
// same bits as one prefill (docs/sessions.md defines it).
//
// DSpark (config n_mtp_layers > 0; docs/dspark.md): every forward step also writes, for each of
// its positions, main_x = main_norm(main_proj(main_hidden)) into each DSpark block's window_kv
// ring (ModelState::dspark_window_kv; the official forward_spec's ring writes), so any chunking
// gives the same ring bits. draft(state, last_token, sampling) then runs the official
// forward_spec decode branch, reading the state only: the block [last_token, noise...]
// at positions state.pos .. state.pos + block - 1, the DSpark blocks, the head, the Markov chain
// and the confidence head. It never changes the state.
//
// Cache precision (reference/ops/cache_precision.h): by default the caches hold the official packed
// formats. set_cache_precision(CachePrecision::kBf16) makes a deliberately perturbed reference for
// precision ablations: no FP4/FP8 QDQ anywhere, caches of raw bf16 (docs/attention.md, "Cache
// precision ablation"). A state records its precision; a model refuses a state of the other one.
// cache_views() reads every cache's stored bytes, uniformly for both precisions.
//
// Example:
//   Model m(config, ModelWeights::load(path, config), token_map);
//   ModelState s = m.new_state();
//   StepRecord r0 = m.prefill(s, prompt);
//   StepRecord r1 = m.decode(s, next_token);
//   DraftResult d = m.draft(s, argmax(r1.logits), DraftSampling{});   // tokens at s.pos + 1 ..
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "reference/ops/cache_precision.h"
#include "reference/ops/config.h"
#include "reference/ops/engram.h"
#include "reference/model/hooks.h"
#include "reference/model/kv_cache.h"
#include "reference/seam/ops.h"
#include "reference/ops/rope.h"
#include "reference/ops/tensor.h"
#include "reference/checkpoint/weights.h"

namespace dsv41::reference::model {

class Observer;  // reference/model/forward.h

// What one forward call records, per step (positions [start_pos, start_pos + T)).
struct StepRecord {
  int64_t start_pos = 0;
  int64_t tokens = 0;
  std::vector<float> logits;                       // [vocab] fp32, last position
  Tensor<float> all_logits;                        // [T, vocab] fp32 (only with set_full_logits)
  std::map<int, Tensor<int32_t>> topk;             // index-source layer -> [T, k] compressed
                                                   //   positions ascending, -1 padding (no offset)
  std::map<int, Tensor<uint8_t>> candidates;       // candidate source -> [T, N] mask
  std::map<int, Tensor<int64_t>> engram_ids;       // engram layer -> [T, cols]
  std::map<int, Tensor<int32_t>> experts;          // layer -> [T, k] routed experts
};


// How Model::draft samples (reference/ops/sampling.h). The same seed replays a draft exactly.
struct DraftSampling {
  double temperature = 0.0;  // 0: argmax (lowest index on ties); > 0: the official Gumbel-max sample
  uint64_t seed = 0;         // one std::mt19937_64(seed) per draft call, slot 0's draws first
};

// What Model::draft returns. B = dspark_block_size; the draft block's row i sits at position
// `position` + i (row 0 holds last_token) and predicts the token at `position` + i + 1. In the
// official output: draft_ids = [last_token, tokens...], draft_logits = logits, confidence.
struct DraftResult {
  int64_t position = 0;            // state.pos: the position of last_token (block row 0)
  int64_t last_token = 0;          // the token the draft continues (draft_ids[0])
  std::vector<int64_t> tokens;     // [B] drafts; tokens[i] at position + 1 + i (draft_ids[1 + i])
  Tensor<float> logits;            // [B, vocab] fp32, row i incl. its Markov bias; tokens[i] drawn from it
  Tensor<float> probs;             // [B, vocab] fp32 the distribution tokens[i] was drawn from
                                   //   (sampling_probs(row i, T): one-hot of the argmax at T = 0)
  std::vector<float> confidence;   // [B] confidence-head logits: sigmoid = P(tokens[i] accepted |
                                   //   tokens[0 .. i-1] accepted)
};

// How a step may depart from the plain forward: the bounded-replay approximations of
// docs/sessions.md. The default is the plain forward.
struct StepOptions {
  // Windows never read positions below this (bounded replay truncates them at the replay start).
  int64_t window_floor = 0;
  // Encoder replay: the global state already covers these positions; recompute only the SWA
  // rings (no compressor step, no global-cache writes).
  bool local_only = false;
  // Decoder replay (> 0): layers after the candidate source run only on the last
  // decoder_replay_rows rows of the step, windows truncated at that tail's start; the layers up
  // to the candidate source run on every row and write the exact global state.
  int64_t decoder_replay_rows = 0;
  // The logits of every position of this step (StepRecord::all_logits), as set_full_logits does
  // for every step: a speculative verify step needs them.
  bool all_logits = false;
  // A step no hook sees (set_hooks is ignored): what a backend runs internally, e.g. the replay
  // that rolls a speculative verify step back (reference/model/speculative.h).
  bool hooks_off = false;
  // A step whose selections nobody reads (a sampled replay's side A between its checked steps):
  // its record keeps the logits only; topk, candidates, Engram ids and experts are left where they
  // are (a device backend does not move the [T, N] candidate mask, 4 GB at 2^20 keys, to the host).
  bool logits_only = false;
};

class Model {
 public:
  // token_map: [vocab] compressed id of every vocab entry (Engram); see default_token_map.
  // ops: the components it runs (reference/seam/ops.h); they must outlive the model.
  Model(ModelConfig config, checkpoint::ModelWeights weights, std::vector<int64_t> token_map, const seam::Ops& ops = seam::reference_ops());
  // Tells the ops to forget what prepare() mirrored (Ops::release). A copy's weights sit at
  // addresses the ops never prepared: correct on every backend, but a device backend uploads them
  // per call (build a Model from the weights instead where speed matters).
  ~Model();
  Model(Model&&) = default;
  Model(const Model&) = default;
  Model& operator=(Model&&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const seam::Ops& ops() const { return *ops_; }
  const std::vector<int64_t>& token_map() const { return token_map_; }  // [vocab] Engram compressed ids
  const checkpoint::ModelWeights& weights() const { return weights_; }

  // The precision of the caches of the states this model makes and accepts (default kPacked,
  // the official path). kBf16 is the precision ablation (reference/ops/cache_precision.h).
  void set_cache_precision(CachePrecision p) { precision_ = p; }
  CachePrecision cache_precision() const { return precision_; }

  // A fresh state (position 0) whose caches are in cache_precision(). forward_chunk and
  // replay_local_state refuse (dsv41::Error) a state of another precision.
  ModelState new_state() const;

  StepRecord prefill(ModelState& state, const std::vector<int64_t>& tokens) const;
  StepRecord decode(ModelState& state, int64_t token) const;
  // A batch of sequences of equal length, as the official forward takes one ([B, T] tokens):
  // its rows never interact, so row b is exactly prefill / decode of states[b] alone.
  std::vector<StepRecord> prefill_batch(std::vector<ModelState>& states,
                                        const std::vector<std::vector<int64_t>>& tokens) const;
  std::vector<StepRecord> decode_batch(std::vector<ModelState>& states, const std::vector<int64_t>& tokens) const;

  // The general step (docs/sessions.md): any number of tokens at position state.pos. prefill and
  // decode are its official special cases; any chunking of a sequence gives the same bits.
  StepRecord forward_chunk(ModelState& state, const std::vector<int64_t>& tokens,
                           const StepOptions& options = {}) const;

  // The DSpark draft after state.pos (above; docs/dspark.md): last_token is the token at
  // position state.pos (the one sampled from the last step's logits, not yet run). Needs a state
  // whose DSpark rings hold the main positions up to state.pos - 1 (a forward step wrote them),
  // else a dsv41::Error (a fresh state, a state from another model, a ring not rolled back with
  // its state). Const: the state is not changed. Hooks see the dspark_* components.
  DraftResult draft(const ModelState& state, int64_t last_token, const DraftSampling& sampling = {}) const;

  // Encoder replay after a global-only resume (docs/sessions.md): recomputes every layer's SWA
  // ring from `tail`, the tokens at positions state.pos - tail.size() .. state.pos - 1, with
  // windows truncated at the first of them; reuses the global state as it is. state.pos is
  // unchanged. The rings are approximate by design (bounded replay).
  void replay_local_state(ModelState& state, const std::vector<int64_t>& tail) const;

  // Also compute the logits of every position of a step (StepRecord::all_logits).
  void set_full_logits(bool on) { full_logits_ = on; }

  // Hooks that see and may replace intermediates and selections (reference/model/hooks.h).
  void set_hooks(ForwardHooks hooks) { hooks_ = std::move(hooks); }

  // Every cache of `state` as stored bytes (kv_cache.h cache_views, through this model's ops).
  std::vector<CacheView> cache_views(const ModelState& state) const;

 private:
  // A dsv41::Error unless state.precision == precision_.
  void check_precision(const ModelState& state) const;
  // DSpark (reference/model/model_dspark.cc): the rings' rows of the `rows` positions from first_pos,
  // from the target layers' hc means (each [>= rows, dim]: the last rows are this step's).
  void dspark_write(ModelState& state, std::vector<Tensor<float>> parts, int64_t first_pos, int64_t rows,
                    const Observer& observe) const;

  ModelConfig config_;
  const seam::Ops* ops_;
  checkpoint::ModelWeights weights_;
  std::vector<int64_t> token_map_;
  std::vector<LayerInfo> schedule_;
  std::vector<RopeTable> rope_;  // [total_layers], by the layer's kind (window / compressed)
  std::vector<bool> dspark_target_;  // [n_layers] the layer's input feeds main_hidden
  EngramLayout engram_;
  int64_t engram_pad_ = 0;
  ForwardHooks hooks_;
  bool full_logits_ = false;
  CachePrecision precision_ = CachePrecision::kPacked;
};

// The raw tokens an encoder replay at any position needs: window_size (the replayed tail) +
// engram_max_ngram_size - 1 (the n-grams of its first positions reach back that far; 0 without
// Engram layers).
int64_t recent_token_count(const ModelConfig& c);

// floor(id * compressed_vocab / vocab): the map of the oracle's stub tokenizer for the tiny
// config (token 2k and 2k+1 share id k). The real model needs its tokenizer's map (--token-map).
std::vector<int64_t> default_token_map(const ModelConfig& c);

}  // namespace dsv41::reference::model
