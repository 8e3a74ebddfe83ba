// bench/synthetic_state.h: a model state at context C built directly, without a C-token prefill
// (issue 32, item 5: the decode-cost curve, bench/decode_curve.cc).
//
// What a decode step at position C reads is sized by C: every kv source's compressed_kv and
// index_keys caches hold C / ratio entries, every window_kv ring (and DSpark ring) is full, the
// Engram history covers positions 0 .. C-1. A one-token step costs what it costs after a real
// C-token prefill, because its cost depends on the cache sizes, not on their contents. Prefilling
// 2^20 tokens takes minutes on the device (hours on the CPU), so this state is written instead:
//
//   tokens          C seeded random ids: the Engram history (engram_compress_tokens, as a forward
//                   step writes it) and ModelState::recent_tokens (the last positions)
//   compressed_kv,  C / ratio entries per kv source, written through PackedCache::write (the ops'
//   index_keys      write_entries: the formats' own packers quantize the rows, on the backend
//                   that holds the cache) from seeded random bf16 rows: finite, decodable entries
//   window_kv and   positions C - window .. C - 1, rows QDQ'd with Ops::qdq then written with
//   DSpark rings    WindowKvRing::write, as the forward writes them
//   compressors     next_pos = C with no pending token (C is a multiple of every ratio), as after
//                   a prefill of C tokens
//   pos             C
//
// The values are random, so the step's selections and logits mean nothing: only its cost does.
// Every row is drawn from one std::mt19937_64(seed) in a fixed order (caches by layer, then the
// rings), so the same seed gives the same state on every backend.
//
// Example:
//   check_synthetic_context(model.config(), 4096, /*steps=*/16);   // before any work
//   ModelState s = synthetic_state(model, 4096, /*seed=*/0);
//   StepRecord r = model.decode(s, token);                           // position 4096
#pragma once

#include <cstdint>
#include <string>

#include "reference/model/model.h"
#include "reference/ops/config.h"

namespace dsv41::bench {

// The least common multiple of the config's compress ratios (1 without compressed layers): a
// synthetic context must be a multiple of it (no compressor holds a partial group).
int64_t context_multiple(const reference::ModelConfig& c);

// A dsv41::Error naming the context and the rule it breaks unless a synthetic state at `context`
// followed by `steps` one-token steps fits `c`: context >= recent_token_count(c) (the window_kv
// rings and the recent tokens full), a multiple of context_multiple(c), and
// context + steps <= max_seq_len.
void check_synthetic_context(const reference::ModelConfig& c, int64_t context, int64_t steps);

// The state at position `context` (above), in the model's ops' memory (a device backend: on the
// device). check_synthetic_context is called first.
reference::model::ModelState synthetic_state(const reference::model::Model& model, int64_t context, uint64_t seed);

// What a state holds, in bytes.
struct StateBytes {
  int64_t allocated = 0;  // every cache, ring and compressor tensor as allocated (capacity: max_seq_len / ratio)
  int64_t held = 0;       // the valid part: written cache entries and ring slots, pending compressor slots
  int64_t host_metadata = 0;  // always on the host: Engram history, recent tokens, ring positions
};
StateBytes state_bytes(const reference::model::ModelState& state);

// Entries per cache for the test and the bench's check: compressed_kv and index_keys of each kv
// source hold context / ratio entries.
int64_t expected_entries(int64_t context, int ratio);

}  // namespace dsv41::bench
