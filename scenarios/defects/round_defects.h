// scenarios/defects/round_defects.h
//
// Defects planted in a speculative round or a DSpark draft: what a port gets wrong in speculative
// decoding (docs/dspark.md), for the verifier's self-test (mutant:<defect>:S<step>,
// scenarios/defects/mutants.h). They live here, outside the reference: a round defect is a set of
// the reference's RoundHooks (reference/model/speculative.h), a draft defect an ops wrapper
// (reference/seam/forwarding_ops.h) armed for one draft.
//
// Example:
//   bool fired = false;
//   reference::model::SpeculativeOptions o;
//   o.hooks = round_defect_hooks(RoundDefect::kAcceptOneMore, config, &fired);
//   speculative_round(model, state, current, proposal, o, rng);   // fired: a rejected draft was kept
#pragma once

#include <cstdint>

#include "reference/model/speculative.h"
#include "reference/seam/forwarding_ops.h"

namespace dsv41::scenarios::defects {

enum class RoundDefect {
  kNone,
  kCompressorNotRolledBack,  // after a partial accept, the compressor's partial groups stay as verified
  kAcceptOneMore,            // one draft more than the rule accepts (when a draft was rejected)
  kDSparkRingNotRolledBack,  // after a partial accept, the DSpark rings keep the verify step's rows
                             // in the rejected positions' slots (their position bookkeeping is rolled
                             // back, their bytes are not): the next draft reads rejected drafts
  kDraftRopeAtBlockStart,    // the draft's rows 1+ use row 0's RoPE position (DraftRopeAtBlockStartOps;
                             // fires in the draft, not in the round)
};

// The round hooks that plant `defect` (none for kNone and kDraftRopeAtBlockStart). *fired becomes
// true when the defect changed something: kAcceptOneMore kept a rejected draft;
// kCompressorNotRolledBack left a pending compressor slot as the verify step wrote it (the verify
// step crossed a compressor group boundary after the kept tokens); kDSparkRingNotRolledBack left
// an occupied ring slot with a rejected position's bytes (the slot held an earlier position).
reference::model::RoundHooks round_defect_hooks(RoundDefect defect, const reference::ModelConfig& config, bool* fired);

// The draft defect kDraftRopeAtBlockStart: while armed, every rope_rows call rotates all of its
// rows at the first row's position (pos_stride 0). A draft's only RoPE is its DSpark attention's
// (q, its own K/V rows, the output's inverse), so a model running on these ops, armed for one
// Model::draft, rotates every block row at row 0's position: "draft position 1+ uses position 0's
// RoPE". Unarmed it is the inner ops exactly.
class DraftRopeAtBlockStartOps : public reference::seam::ForwardingOps {
 public:
  explicit DraftRopeAtBlockStartOps(const reference::seam::Ops& inner)
      : ForwardingOps(inner, inner.name()) {}  // the same name: reports show the backend's spec
  void arm(bool on) const { armed_ = on; }
  void rope_rows(T32& x, int64_t heads, const reference::RopeTable& rope, int64_t first_pos, int64_t pos_stride,
                 bool inverse) const override {
    ForwardingOps::rope_rows(x, heads, rope, first_pos, armed_ ? 0 : pos_stride, inverse);
  }

 private:
  mutable bool armed_ = false;
};

}  // namespace dsv41::scenarios::defects
