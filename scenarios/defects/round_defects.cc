#include "scenarios/defects/round_defects.h"

#include <cstring>
#include <optional>
#include <utility>

#include "reference/ops/sampling.h"

namespace dsv41::scenarios::defects {
namespace {

using reference::model::ModelState;

// kCompressorNotRolledBack: the verified compressor slots stay (the next position is rolled back).
bool keep_verified_compressors(ModelState& state, const ModelState& verified) {
  bool changed = false;
  for (size_t l = 0; l < state.layers.size(); ++l) {
    std::optional<reference::model::CompressorState>& kept = state.layers[l].compressor;
    if (!kept) continue;
    reference::model::CompressorState stale = *verified.layers[l].compressor;  // the verified slots stay
    stale.next_pos = kept->next_pos;
    for (int slot = 0; slot < kept->pending(); ++slot) {
      const size_t bytes = static_cast<size_t>(kept->dim) * sizeof(float);
      changed = changed || std::memcmp(kept->kv.row(slot), stale.kv.row(slot), bytes) != 0 ||
                std::memcmp(kept->score.row(slot), stale.score.row(slot), bytes) != 0;
    }
    kept = std::move(stale);
  }
  return changed;
}

// kDSparkRingNotRolledBack: the rings' bytes stay as verified, their positions rolled back.
bool keep_verified_ring_bytes(ModelState& state, const ModelState& verified) {
  bool changed = false;
  for (size_t i = 0; i < state.dspark_window_kv.size(); ++i) {
    reference::model::WindowKvRing& kept = state.dspark_window_kv[i];
    const reference::model::WindowKvRing& stale = verified.dspark_window_kv[i];
    const size_t bytes = static_cast<size_t>(kept.entry_bytes());
    for (int s = 0; s < kept.window; ++s) {  // an empty slot is never read: no change there
      changed = changed || (kept.positions[static_cast<size_t>(s)] >= 0 &&
                            std::memcmp(kept.bytes.row(s), stale.bytes.row(s), bytes) != 0);
    }
    kept.bytes = stale.bytes;  // the positions stay rolled back: only the bytes are stale
  }
  return changed;
}

}  // namespace

reference::model::RoundHooks round_defect_hooks(RoundDefect defect, const reference::ModelConfig& config, bool* fired) {
  reference::model::RoundHooks h;
  switch (defect) {
    case RoundDefect::kAcceptOneMore:
      h.decided = [vocab = config.vocab_size, fired](reference::model::Verification& v, int64_t k) {
        if (v.decision.accepted >= k) return;
        ++v.decision.accepted;  // the first rejected draft is kept
        v.decision.next_token = reference::argmax_token(v.step.all_logits.row(v.decision.accepted), vocab);
        *fired = true;
      };
      break;
    case RoundDefect::kCompressorNotRolledBack:
      h.rolled_back = [fired](ModelState& kept, const ModelState& verified) {
        if (keep_verified_compressors(kept, verified)) *fired = true;
      };
      break;
    case RoundDefect::kDSparkRingNotRolledBack:
      h.rolled_back = [fired](ModelState& kept, const ModelState& verified) {
        if (keep_verified_ring_bytes(kept, verified)) *fired = true;
      };
      break;
    case RoundDefect::kNone:
    case RoundDefect::kDraftRopeAtBlockStart:
      break;
  }
  return h;
}

}  // namespace dsv41::scenarios::defects
