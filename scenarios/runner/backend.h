// scenarios/runner/backend.h
//
// Backend: what the scenario runner drives. A backend runs sessions of one model: a step of any
// number of tokens at the session's position (a prefill chunk, a one-token decode step, a verify
// step of several tokens), saves a session and restores it (full, or global state only), and shows
// every component's output of a step through ForwardHooks (reference/model/hooks.h: per layer stream,
// attention output, mHC coefficients, top-k, candidate mask, MoE experts, index scores, ...), which
// may also replace them (teacher forcing). After a step it shows its caches as raw bytes.
//
// Backends (make_backend; docs/scenarios.md lists them):
//   ref            the CPU reference (reference/model/model.h), official cache formats
//   ref-bf16kv     the reference with every cache kept in bf16 (no FP4/FP8 QDQ): a deliberately
//                  perturbed reference for precision ablations; approximate by design
//   mutant:<kind>:L<layer>:S<step>
//                  the reference with one planted defect (scenarios/defects/mutants.h): what the
//                  verifier's self-test and tests use to prove a divergence is caught and located
//   ref-order:<variant>[:<component>:L<layer>:S<step>[:x<factor>]]
//                  the reference over a correct reordered variant (scenarios/defects/reordered_ops.h:
//                  reversed, pairwise, blocked, fma, splitk, tiles): claims order-variant; with a
//                  mutation (mutants.h's spec after the variant), that variant with one planted defect
//   cuda-exact     the model over the CUDA ops table, every ported op bit-exact (claims bitexact)
//   cuda           the production CUDA path: production kernels in place of some exact ones
//                  (cuda/cuda_ops.h CudaMode::kProduction; claims order-variant)
//
// Example:
//   std::unique_ptr<Backend> b = make_backend("ref", resources);
//   std::unique_ptr<BackendSession> s = b->new_session();
//   reference::model::StepRecord r = b->step(*s, prompt, {}, {});
//   SavedState saved = b->save(*s, /*include_swa=*/false);
//   std::unique_ptr<BackendSession> resumed = b->restore(saved, reference::session::ResumeMode::kGlobalOnly);
#pragma once

#include <any>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reference/ops/cache_precision.h"
#include "reference/ops/config.h"
#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "reference/session/session_store.h"
#include "reference/model/speculative.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/judge/derived_bounds.h"

namespace dsv41::scenarios::runner {

// What a backend claims about itself relative to the reference: "bitexact" (it must give the
// reference's bits), "order-variant" (the reference's math in its own summation order, tensor
// cores, fused kernels: judged by tolerance, derived bounds, docs/conform.md) or "approximate"
// (it differs by design; measured only).
enum class Claim { kBitExact, kOrderVariant, kApproximate };

// The accumulation an order-variant backend's claim admits (scenarios/judge/derived_bounds.h
// "Accumulation"): kFp8TensorCore for `cuda` (its fp8 linears on wgmma) and `ref-order:trunc13[...]`
// (the CPU emulation of that block dot); kFp32 for every other backend.
judge::Accumulation backend_accumulation(const std::string& spec);

// One session of a backend (opaque to the runner).
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual int64_t pos() const = 0;  // tokens consumed
};

// A saved session. `bytes` is the backend's serialized form when it has one (the reference: a
// session file, docs/session-store.md); `snapshot` holds a state that has no file format (the
// bf16 ablation keeps its state in memory).
struct SavedState {
  int64_t pos = 0;
  bool has_swa = false;
  std::vector<uint8_t> bytes;
  std::any snapshot;
};

// What every backend of a run is built from.
struct BackendResources {
  reference::ModelConfig config;
  reference::checkpoint::ModelWeights weights;
  std::vector<int64_t> token_map;  // [vocab] Engram compressed ids
};

// The verify step of a speculative round, as the runner asks a side for it (docs/dspark.md): one
// step over [current, drafts] with every row's logits, the side's own accept decision
// (reference::model::accept_drafts with a SampleRng seeded by `seed`), then the rollback to the kept drafts.
struct VerifyRequest {
  int64_t current = -1;
  std::vector<int64_t> drafts;               // [k] the drafts verified
  std::vector<std::vector<double>> p_draft;  // [k][vocab] the draft distributions (sampling only)
  reference::SamplingParams sampling;        // temperature 0: greedy
  uint64_t seed = 0;                         // the accept rule's random stream
  std::optional<int64_t> keep;               // lockstep: keep this many drafts whatever the own decision
};
struct VerifyResult {
  reference::model::StepRecord step;      // the verify step: all_logits [k + 1, vocab]
  reference::model::Acceptance decision;  // the side's own decision
  int64_t kept = 0;                // drafts the session kept (decision.accepted unless `keep` was given)
};

// A device backend's memory (cuda/device.h device_memory_stats): process-wide, bytes.
struct DeviceMemory {
  int64_t peak_alloc_bytes = 0;  // high-water mark of device_alloc'd bytes since the last reset
  int64_t in_use_bytes = 0;      // device memory in use now, the driver's view (cudaMemGetInfo)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Claim claim() const = 0;
  virtual const reference::ModelConfig& config() const = 0;

  virtual std::unique_ptr<BackendSession> new_session() = 0;
  // Runs tokens at s.pos(). hooks (may be empty) see, and may replace, every component's output;
  // a backend calls them in the reference's order (reference/model/hooks.h) with the same shapes.
  // `step` counts the backend's steps of this session's run (a planted defect keys on it).
  virtual reference::model::StepRecord step(BackendSession& s, const std::vector<int64_t>& tokens,
                                     const reference::model::StepOptions& options,
                                     const reference::model::ForwardHooks& hooks, int64_t step) = 0;
  // A speculative round's verify step and rollback (VerifyRequest); s ends at its position + kept + 1.
  virtual VerifyResult verify(BackendSession& s, const VerifyRequest& request, const reference::model::ForwardHooks& hooks,
                              int64_t step) = 0;
  // A DSpark draft after s.pos() (reference::model::Model::draft: last_token at s.pos(), the drafts at the
  // positions after it); the session is not changed. hooks see, and may replace, the dspark_*
  // components. A backend without DSpark (config n_mtp_layers = 0) throws a dsv41::Error.
  virtual reference::model::DraftResult draft(BackendSession& s, int64_t last_token, const reference::model::DraftSampling& sampling,
                                       const reference::model::ForwardHooks& hooks, int64_t step) = 0;
  // An independent copy of a session (the runner's greedy lookahead drafts run on one).
  virtual std::unique_ptr<BackendSession> fork(const BackendSession& s) = 0;
  virtual SavedState save(const BackendSession& s, bool include_swa) = 0;
  // A session continuing from `saved`: kFull needs has_swa; kGlobalOnly rebuilds the SWA rings by
  // encoder replay (approximate by design, docs/sessions.md).
  virtual std::unique_ptr<BackendSession> restore(const SavedState& saved, reference::session::ResumeMode mode) = 0;
  // Every cache of the session as raw bytes, in a fixed order: reference::model::cache_views, then the
  // compressors' pending groups (compressor_views) and the DSpark rings (dspark_views).
  virtual std::vector<reference::model::CacheView> caches(const BackendSession& s) const = 0;
  // Why this backend's run proves less than it claims ("" when nothing is missing): a planted
  // defect that never applied (its step, layer or selection never came) makes a comparison
  // inconclusive, never a pass.
  virtual std::string missing_evidence() const { return ""; }
  // A device backend's memory (std::nullopt: a host backend); reset_device_peak restarts the
  // high-water mark (it is process-wide: every device backend of the process shares it).
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  virtual void reset_device_peak() {}
};

// The backends make_backend knows, with one line each (for --help and docs).
std::vector<std::pair<std::string, std::string>> backend_catalog();

// A backend by name (see above); a dsv41::Error naming the spec and the known names otherwise.
std::unique_ptr<Backend> make_backend(const std::string& spec, const BackendResources& resources);

// Checks a backend name without building it (the runner validates --sides before any work).
void validate_backend_name(const std::string& spec);

// The planted defect a backend spec carries (mutant:..., ref-order:<variant>:...), checked;
// std::nullopt for a backend without one.
std::optional<defects::Mutation> backend_mutation(const std::string& spec);

// The claim of the backend `spec` names (what make_backend(spec)->claim() returns), without
// building it: a pair's default expectation follows from it.
Claim backend_claim(const std::string& spec);

// What make_backend builds a backend's model from, without the model: the parts a tool that runs
// a reference::model::Model itself needs (`dsv41 forward --backend`, the Python module:
// scenarios/runner/backend_model.h). The claim is backend_claim(spec).
struct BackendOps {
  std::unique_ptr<reference::seam::Ops> ops;  // nullptr: reference::seam::reference_ops()
  bool device = false;  // ops keeps its tensors on a device: sessions are saved and read through the host
  reference::CachePrecision precision = reference::CachePrecision::kPacked;  // kBf16: ref-bf16kv
  std::optional<defects::Mutation> mutation;  // the planted defect (mutant:..., ref-order:<variant>:...)
};

// The parts of the backend `spec` names (validate_backend_name's names); a dsv41::Error naming the
// spec otherwise, or when a device backend finds no device ("backend cuda: no CUDA device ...").
BackendOps make_backend_ops(const std::string& spec);

// Moves every tensor of a state into `ops`' memory (to_device) or back to the host: session files
// are written and read on the host (reference/session/session_*.cc), a device backend's state lives
// on the device between steps.
void move_state(reference::model::ModelState& st, const reference::seam::Ops& ops, bool to_device);

}  // namespace dsv41::scenarios::runner
