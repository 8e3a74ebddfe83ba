// reference/model/state_diff.h
//
// Where two model states first differ, bit for bit, in everything that is state: what a later
// step reads, or what a session keeps. A rollback (reference/model/speculative.h), a resumed session or
// a second backend is exact when its state equals the reference's here. Compared, in this order:
//
//   precision, pos, the number of layers; per layer l:
//     window_kv       window, head_dim, format; every slot's position (-1: empty); the packed
//                     bytes of the occupied slots (an empty slot's bytes are never read: stale)
//     compressor      present or not, ratio, dim, next_pos; the kv and score rows (fp32 bytes) of
//                     the pending slots 0 .. pending() - 1 only (the other slots are stale: the
//                     next group overwrites them before it pools)
//     compressed_kv,  present or not, format, owner layer, ratio, dim, capacity, position offset,
//     index_keys      size (entries written); the bytes of entries [0, size) (later entries of
//                     the storage are stale: a rewrite dropped them)
//   the Engram history (pad id, first position, every id), the recent raw tokens (every slot);
//   per DSpark block i (config n_mtp_layers > 0): its dspark_window_kv ring, as window_kv.
//
// The answer is "" when the states are equal, else one sentence naming the first difference: the
// layer, the cache, the slot / entry / row (with its position) and the byte offset in it with both
// byte values (for integer members: both values), e.g.
//   "layer 2 compressor: pending kv row 0 (position 96) differs at byte offset 12 of 512: 0x3c vs 0xbd"
// Host storage only (a dsv41::Error for a state whose caches live in a device's memory: download
// them first).
//
// Example:
//   ModelState rolled_back = ..., one_at_a_time = ...;
//   EXPECT_EQ(first_state_difference(rolled_back, one_at_a_time), "");
#pragma once

#include <string>

#include "reference/model/kv_cache.h"

namespace dsv41::reference::model {

std::string first_state_difference(const ModelState& a, const ModelState& b);

}  // namespace dsv41::reference::model
