// reference/session/session_restore.cc
//
// Loading a session: every section's entries checked and copied into a fresh state of the model;
// a global-only resume rebuilds the window_kv and DSpark rings by encoder replay (docs/sessions.md).
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/base.h"
#include "formats/qdq.h"
#include "reference/session/session_internal.h"

namespace dsv41::reference::session {


namespace {

// A ring section (kWindowKv, kDSparkRing) into `ring`: every slot must hold the position
// ring_position() says, an empty slot all zeros, a filled one FP8 values that are not NaN codes
// and E8M0 scales fp8_scale writes.
void restore_ring(model::WindowKvRing& ring, const ModelConfig& c, const SessionSectionInfo& sec, const uint8_t* p,
                  int64_t pos) {
  const int64_t eb = sec.entry_bytes - 8, d = c.head_dim;
  const uint8_t lo = formats::fp8_scale(0.0f), hi = formats::fp8_scale(std::numeric_limits<float>::max());
  for (int64_t slot = 0; slot < sec.count; ++slot) {
    const uint8_t* at = p + slot * sec.entry_bytes;
    const int64_t position = get_i64(at), want = ring_position(pos, ring.window, slot);
    if (position != want) {
      DSV41_FAIL("slot ", slot, " holds position ", position, ", but at position ", pos, " slot ", slot, " holds ",
                 want, " (slot = position % window_size ", ring.window,
                 ", the latest window_size positions; -1: never written)");
    }
    const uint8_t* entry = at + 8;
    for (int64_t i = 0; i < eb; ++i) {
      const uint8_t b = entry[i];
      const bool scale = i >= d;
      if (position < 0 ? b != 0 : (scale ? (b < lo || b > hi) : (b & 0x7Fu) == 0x7Fu)) {  // E4M3 NaN codes
        DSV41_FAIL("slot ", slot, " (position ", position, ") byte ", i, " is ", hex8(b), ": ",
                   position < 0 ? "an empty slot holds zeros"
                   : scale      ? "not an E8M0 scale the quantizer writes [" + hex8(lo) + ", " + hex8(hi) + "]"
                                : std::string("an E4M3 NaN code (the quantizer saturates)"));
      }
    }
    std::copy(entry, entry + eb, ring.bytes.row(slot));
    ring.positions[static_cast<size_t>(slot)] = position;
  }
}

// Fills the part of `state` that section `sec` holds, checking the entries (throws plain
// dsv41::Errors; the caller adds the file and section).
void restore_section(model::ModelState& state, const ModelConfig& c, const SessionSectionInfo& sec, const uint8_t* p) {
  const int64_t pos = state.pos;
  // The layer's state for the per-layer kinds (a DSpark ring's layer n_layers + i has none; the
  // header check matched every layer against the config's layout).
  model::LayerState* ls = sec.layer >= 0 && sec.layer < c.n_layers ? &state.layers[static_cast<size_t>(sec.layer)] : nullptr;
  switch (sec.kind) {
    case SessionSection::kCompressedKv:
      ls->compressed_kv->restore(p, sec.count);
      break;
    case SessionSection::kIndexKeys:
      ls->index_keys->restore(p, sec.count);
      break;
    case SessionSection::kCompressorPending: {
      model::CompressorState& cs = *ls->compressor;
      cs.next_pos = pos;
      for (int64_t slot = 0; slot < sec.count; ++slot) {
        const uint8_t* row = p + slot * sec.entry_bytes;
        for (int64_t j = 0; j < 2 * cs.dim; ++j) {
          const uint32_t bits = get_u32(row + 4 * j);
          const float v = f32_from_bits(bits);
          if (!std::isfinite(v)) {
            DSV41_FAIL("slot ", slot, ": ", j < cs.dim ? "kv" : "score", " channel ", j % cs.dim,
                       " is not finite (bits ", hex32(bits), "); a pending slot holds finite fp32 projections");
          }
          (j < cs.dim ? cs.kv : cs.score).at(slot, j % cs.dim) = v;
        }
      }
      break;
    }
    case SessionSection::kEngramTail: {
      if (c.engram_layer_ids.empty()) break;
      std::vector<int64_t> ids(static_cast<size_t>(sec.count));
      for (int64_t i = 0; i < sec.count; ++i) {
        const int64_t id = get_i64(p + 8 * i);
        if (id != kEngramDead && (id < 0 || id >= c.engram_compressed_vocab_size)) {
          DSV41_FAIL("position ", sec.first_position + i, " holds compressed id ", id,
                     ", outside [0, engram_compressed_vocab_size ", c.engram_compressed_vocab_size,
                     ") and not DEAD (-1)");
        }
        ids[static_cast<size_t>(i)] = id;
      }
      state.engram.restore(sec.first_position, ids);
      break;
    }
    case SessionSection::kTokenTail: {
      const int64_t kept = static_cast<int64_t>(state.recent_tokens.size());
      for (int64_t i = 0; i < sec.count; ++i) {
        const int64_t q = sec.first_position + i, token = get_i64(p + 8 * i);
        if (token < 0 || token >= c.vocab_size) {
          DSV41_FAIL("position ", q, " holds token id ", token, ", outside the vocab [0, ", c.vocab_size, ")");
        }
        state.recent_tokens[static_cast<size_t>(q % kept)] = token;
      }
      break;
    }
    case SessionSection::kWindowKv:
      restore_ring(ls->window_kv, c, sec, p, pos);
      break;
    case SessionSection::kDSparkRing:
      restore_ring(state.dspark_window_kv[static_cast<size_t>(sec.layer - c.n_layers)], c, sec, p, pos);
      break;
  }
}

// The raw tokens of the last min(pos, kept) positions, from the token tail.
std::vector<int64_t> token_tail(const model::ModelState& state, int64_t* first) {
  const int64_t pos = state.pos, kept = static_cast<int64_t>(state.recent_tokens.size());
  *first = pos - std::min(pos, kept);
  std::vector<int64_t> tail;
  for (int64_t q = *first; q < pos; ++q) tail.push_back(state.recent_tokens[static_cast<size_t>(q % kept)]);
  return tail;
}

// Refuses a session whose stored Engram tail disagrees with its token tail compressed through
// the model's token map (an edited tail with recomputed CRCs, or another token map); `how` names
// the resume. Checks the positions both tails cover.
void check_engram_tail(const model::ModelState& state, const ModelConfig& c, const model::Model& model, const std::string& file,
                       const char* how) {
  if (c.engram_layer_ids.empty() || state.pos == 0) return;
  int64_t first = 0;
  const std::vector<int64_t> tail = token_tail(state, &first);
  const std::vector<int64_t> ids = engram_compress_tokens(model.token_map(), tail);
  for (int64_t q = std::max(first, state.engram.first_position()); q < state.pos; ++q) {
    const int64_t stored = state.engram.at(q), want = ids[static_cast<size_t>(q - first)];
    if (stored != want) {
      refuse(file, how, ": the Engram tail holds compressed id ", stored, " at position ", q, ", but its token ",
             tail[static_cast<size_t>(q - first)], " maps to ", want,
             " (was the session saved with another token map, or edited?)");
    }
  }
}

// A global-only resume (docs/sessions.md, encoder replay) of a loaded state: the SWA and DSpark
// rings (the file's, if it had any) are discarded; the Engram history is rebuilt from the token tail, compressed
// through the model's token map (it must agree with the stored Engram tail); then the last
// min(pos, window_size) tokens are replayed with windows truncated at the first of them.
// Returns the number of tokens replayed.
int64_t replay_rings(model::ModelState& state, const ModelConfig& c, const model::Model& model, const std::string& file) {
  const int64_t pos = state.pos;
  const auto empty = [](model::WindowKvRing& ring) {
    std::fill(ring.bytes.data().begin(), ring.bytes.data().end(), uint8_t{0});
    ring.clear();
  };
  for (model::LayerState& ls : state.layers) empty(ls.window_kv);
  for (model::WindowKvRing& ring : state.dspark_window_kv) empty(ring);
  if (pos == 0) return 0;
  int64_t first = 0;
  const std::vector<int64_t> tail = token_tail(state, &first);  // raw tokens of positions first .. pos - 1
  if (!c.engram_layer_ids.empty()) {
    check_engram_tail(state, c, model, file, "global-only resume");
    state.engram.restore(first, engram_compress_tokens(model.token_map(), tail));
  }
  const int64_t n = std::min<int64_t>(pos, c.window_size);
  try {
    model.replay_local_state(state, std::vector<int64_t>(tail.end() - n, tail.end()));
  } catch (const Error& e) {
    refuse(file, "global-only resume: encoder replay of the last ", n, " tokens failed: ", e.what());
  }
  return n;
}

}  // namespace

LoadedSession load_session_bytes(const std::vector<uint8_t>& bytes, const std::string& file, const ModelConfig& c,
                                 const model::Model& model, ResumeMode mode) {
  if (model.cache_precision() != CachePrecision::kPacked) {
    refuse(file, "the model is set to ", name(model.cache_precision()),
           " caches (the cache precision ablation); session files hold the official packed formats only");
  }
  SessionHeader h = parse_session_header(bytes, file, c);
  DSV41_CHECK(config_hash(model.config()) == h.config_hash, "load_session: the model was built from config ",
              config_hash(model.config()), ", not from the config given (", h.config_hash, ")");
  LoadedSession out{model.new_state(), h.has_swa, mode, 0, SessionHeader{}};
  out.state.pos = h.pos;
  for (size_t i = 0; i < h.sections.size(); ++i) {
    const SessionSectionInfo& s = h.sections[i];
    try {
      restore_section(out.state, c, s, bytes.data() + s.offset);
    } catch (const Error& e) {
      refuse(file, describe(s, i, h.sections.size()), ": ", e.what());
    }
  }
  if (mode == ResumeMode::kGlobalOnly) {
    out.replayed_tokens = replay_rings(out.state, c, model, file);
  } else {
    check_engram_tail(out.state, c, model, file, "full resume");
  }
  out.header = std::move(h);
  return out;
}

}  // namespace dsv41::reference::session
