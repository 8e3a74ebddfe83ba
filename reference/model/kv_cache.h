// reference/model/kv_cache.h
//
// The model's state: the caches, the compressor's partial group, and what a session keeps between
// steps. One name per cache (reference/ops/kv_quant.h has the formats and the official buffer names):
//
//   window_kv      WindowKvRing, every layer: window_size slots of packed FP8 entries,
//                  slot = position % window_size, with the position each slot holds (-1: empty)
//   compressed_kv  PackedCache of each kv source (Full layers): entry e = compressed position
//                  position_offset + e (the group [(offset + e) * ratio, ... + ratio)), after RoPE
//                  at the group's first token, FP4 E2M1 + E4M3/16
//   index_keys     PackedCache of each kv source: the indexer's keys of the same groups, after
//                  RoPE, FP4 E2M1 + E8M0/32
//   compressor     CompressorState of each ratio > 1 kv source: the pending partial group (fp32)
// Under the precision ablation (reference/ops/cache_precision.h) every cache stores raw bf16
// (formats::CacheFormat::kBf16) instead; nothing else changes.
//
// Storage lives where the model's ops keep tensors (reference/seam/ops.h): every byte is written by
// Ops::write_entries and read by Ops::read_entries / the consumers (sparse_attn, index_scores),
// so a device backend keeps its caches on the device. Host-side metadata (owner, ratio, size,
// slot positions) stays here. Host readers (session files, cache_views) need host storage, which
// the reference has.
//
// Ownership is explicit: shared caches carry their owner layer and ratio, and a consumer names
// the owner it expects (a Reuse layer reads its kv source's caches); a mismatch is a dsv41::Error.
//
// Example:
//   PackedCache kv("compressed KV cache", CacheFormat::kCompressedKvFp4, /*owner=*/2, /*ratio=*/2,
//                  /*dim=*/512, /*capacity=*/4096 / 2);
//   kv.write(ops, 0, roped_latents);                      // entries 0 .. n-1
//   CacheRows rows = kv.rows(/*owner=*/2, /*ratio=*/2, n); // what sparse_attn reads
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "reference/ops/cache_precision.h"
#include "reference/ops/compressor.h"
#include "reference/ops/engram.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference::seam {
class Ops;
}  // namespace dsv41::reference::seam

namespace dsv41::reference::model {

// One packed cache of a kv source (compressed_kv or index_keys): capacity entries of one format.
class PackedCache {
 public:
  // `label` names the cache in errors ("compressed KV cache", "index-key cache").
  PackedCache(std::string label, formats::CacheFormat format, int owner_layer, int ratio, int64_t dim,
              int64_t capacity, int64_t position_offset = 0);

  const std::string& label() const { return label_; }
  formats::CacheFormat format() const { return format_; }
  int owner_layer() const { return owner_layer_; }
  int ratio() const { return ratio_; }
  int64_t dim() const { return dim_; }
  int64_t capacity() const { return capacity_; }
  int64_t position_offset() const { return position_offset_; }
  int64_t size() const { return size_; }  // entries written: [0, size) are valid
  int64_t entry_bytes() const { return entry_bytes_; }
  const Tensor<uint8_t>& storage() const { return storage_; }  // [capacity, entry_bytes]

  // Moves the storage into the ops' memory (Model::new_state does it once).
  void place(const seam::Ops& ops);
  // Moves it back to host memory (a device backend saving a session, scenarios/runner/backend.cc).
  void fetch(const seam::Ops& ops);

  // Quantizes (kBf16: stores as is) and stores rows as entries first_entry .. first_entry + n - 1.
  // rows: [n, dim] bf16 (post-RoPE, pre-QDQ). first_entry <= size() (appends, or rewrites a tail:
  // entries after the written range are dropped); fits in capacity.
  void write(const seam::Ops& ops, int64_t first_entry, const Tensor<float>& rows);

  // The first `count` entries (<= size()) for a consumer that expects this owner and ratio.
  CacheRows rows(int expected_owner, int expected_ratio, int64_t count) const;
  // Those entries dequantized (kBf16: as written) -> [count, dim] bf16.
  Tensor<float> read(const seam::Ops& ops, int expected_owner, int expected_ratio, int64_t count) const;

  // The stored bytes of entry e (< size()); host storage only.
  const uint8_t* entry(int64_t e) const;

  // Replaces the contents with `count` stored entries (bytes: [count, entry_bytes()], e.g. from a
  // saved session), after checking each one: every scale byte must be one the quantizer writes
  // (kCompressedKvFp4: E4M3 in [compressed_kv_scale(0), compressed_kv_scale(FLT_MAX)];
  // kIndexKeysFp4: E8M0 in [index_scale(0), index_scale(FLT_MAX)]), else a dsv41::Error naming
  // the entry and block; kBf16 entries must hold no NaN/Inf. count <= capacity. Host storage only.
  void restore(const uint8_t* bytes, int64_t count);

 private:
  std::string label_;
  formats::CacheFormat format_;
  int owner_layer_;
  int ratio_;
  int64_t dim_;
  int64_t capacity_;
  int64_t position_offset_;
  int64_t entry_bytes_;
  int64_t size_ = 0;
  Tensor<uint8_t> storage_;
};

// One layer's window_kv ring.
struct WindowKvRing {
  int window = 0;
  int64_t head_dim = 0;
  formats::CacheFormat format = formats::CacheFormat::kWindowKvFp8;  // or kBf16 (ablation)
  Tensor<uint8_t> bytes;            // [window, entry_bytes()]
  std::vector<int64_t> positions;   // [window] the position each slot holds, -1: empty

  WindowKvRing() = default;
  WindowKvRing(int window, int64_t head_dim, formats::CacheFormat format);
  int64_t entry_bytes() const { return formats::entry_bytes(format, static_cast<int>(head_dim)); }

  // Stores rows as the entries of positions first_position .. first_position + n - 1 (slot =
  // position % window; n <= window). rows: [n, head_dim] bf16 (kWindowKvFp8: already FP8 QDQ
  // values, stored packed; kBf16: stored as is).
  void write(const seam::Ops& ops, int64_t first_position, const Tensor<float>& rows);
  // Positions first .. first + count - 1 -> [count, head_dim] bf16; every one must be in the ring
  // (else a dsv41::Error: e.g. a resumed session without its window_kv).
  Tensor<float> read_positions(const seam::Ops& ops, int64_t first, int64_t count) const;
  // Every slot -> [window, head_dim] bf16 (zeros in empty slots). Host values (downloaded).
  Tensor<float> read_all(const seam::Ops& ops) const;
  // Slots 0 .. count - 1 in SLOT order -> [count, head_dim] bf16, in the ops' memory (the DSpark
  // attention reads its ring this way, as the official code does); every one must be filled.
  Tensor<float> read_slots(const seam::Ops& ops, int64_t count) const;
  // Forgets every position (bounded replay rebuilds the ring).
  void clear();
};

// The compressor's pending partial group of a ratio > 1 kv source (the official kv_state /
// score_state buffers).
struct CompressorState {
  CompressorState(int ratio, int64_t dim);

  int ratio;
  int64_t dim;
  Tensor<float> kv;      // [ratio, dim] fp32 wkv rows, slot = position % ratio (init 0)
  Tensor<float> score;   // [ratio, dim] fp32 wgate rows, same slots (init -inf)
  int64_t next_pos = 0;  // the position the next token must have (tokens arrive in order)

  // Tokens of the incomplete group waiting in slots [0, pending()).
  int pending() const { return static_cast<int>(next_pos % ratio); }
};

// The compressor step on `state` (reference/ops/compressor.h): tokens start_pos .. start_pos + T - 1,
// which must continue the state (start_pos == state.next_pos). kv, score: [T, dim] fp32.
CompressedLatents compress(const seam::Ops& ops, CompressorState& state, const Tensor<float>& kv, const Tensor<float>& score,
                           int64_t start_pos);

struct LayerState {
  WindowKvRing window_kv;
  std::optional<CompressorState> compressor;  // ratio > 1 kv sources
  std::optional<PackedCache> compressed_kv;   // kv sources
  std::optional<PackedCache> index_keys;      // kv sources that are index sources
};

// Copyable: a copy is an independent snapshot of a session (what a scenario runner keeps).
struct ModelState {
  int64_t pos = 0;  // tokens consumed so far
  CachePrecision precision = CachePrecision::kPacked;  // of every cache below (Model::new_state)
  std::vector<LayerState> layers;  // [n_layers]
  EngramHistory engram;
  // [recent_token_count(config)] the raw token id of position p at slot p % size, for the last
  // positions (-1: not written yet). What encoder replay reads after a global-only resume.
  std::vector<int64_t> recent_tokens;
  // DSpark (config n_mtp_layers > 0; docs/dspark.md): [n_mtp_layers] the window_kv ring of each
  // DSpark block: kv_norm(wkv(main_x)) of every main position, RoPE'd at that position, in the
  // window_kv format (kWindowKvFp8, or kBf16 under the precision ablation), slot = pos % window.
  // Forward steps write every position they run; a draft only reads them. Empty without DSpark.
  std::vector<WindowKvRing> dspark_window_kv;
  explicit ModelState(int64_t engram_pad) : engram(engram_pad) {}
};

// The stored bytes of one cache, for a reader that compares two runs' caches after a step
// (a scenario runner) without knowing the precision.
struct CacheView {
  std::string kind;             // "window_kv", "compressed_kv", "index_keys" (cache_views),
                                // "compressor" (compressor_views), "dspark_window_kv" (dspark_views)
  int layer = -1;               // the ring's layer, or the caches' owner (kv source) layer
  formats::CacheFormat format = formats::CacheFormat::kBf16;  // how `bytes` decode (unpack_rows)
  int64_t dim = 0;              // values per entry (head_dim, or index_head_dim)
  int64_t entry_bytes = 0;      // bytes per entry in `format`
  int64_t entries = 0;          // entries in `bytes`
  std::vector<uint8_t> bytes;   // [entries, entry_bytes] as stored (packed, or bf16 little-endian)
  // [entries] the position of each entry: the token position (window_kv), the compressed position
  // (compressed_kv, index_keys: position_offset + e).
  std::vector<int64_t> positions;
};

// Every cache of `state`, in layer order: first the window_kv ring of every layer (its occupied
// slots only, in ASCENDING POSITION order, not slot order: empty slots are left out, so the view
// does not depend on bytes no step reads), then per kv source its compressed_kv and index_keys
// caches (entries [0, size()) in entry order). Bytes are copies, downloaded through `ops`.
std::vector<CacheView> cache_views(const ModelState& state, const seam::Ops& ops);

// The compressors' pending groups as views of kind "compressor" (one per ratio > 1 layer, in layer
// order): entry = one pending slot, its fp32 kv row then its fp32 score row (little-endian,
// entry_bytes = 8 * dim), positions = the slot's token position. Only the pending slots are state
// (the others are stale); what a rollback or a resume must restore beyond the caches.
std::vector<CacheView> compressor_views(const ModelState& state, const seam::Ops& ops);

// The DSpark blocks' rings (ModelState::dspark_window_kv) as views of kind "dspark_window_kv", one
// per block i with layer n_layers + i, laid out as the window_kv views (occupied slots by
// ascending position). What a speculative rollback and a full resume must restore for the next
// draft (docs/dspark.md).
std::vector<CacheView> dspark_views(const ModelState& state, const seam::Ops& ops);

}  // namespace dsv41::reference::model
