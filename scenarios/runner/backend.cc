#include "scenarios/runner/backend.h"

#include <utility>

#include "base/error.h"
#include "scenarios/defects/mutants.h"
#include "scenarios/defects/reordered_ops.h"

#if defined(DSV41_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#endif

namespace dsv41::scenarios::runner {
namespace {

using reference::CachePrecision;
using reference::model::ModelState;

struct RefSession final : BackendSession {
  explicit RefSession(ModelState s) : state(std::move(s)) {}
  int64_t pos() const override { return state.pos; }
  ModelState state;
};

// A step index no planted value or cache defect keys on.
constexpr int64_t kNoDefectStep = -1;

RefSession& as_ref(BackendSession& s) {
  RefSession* r = dynamic_cast<RefSession*>(&s);
  DSV41_CHECK(r != nullptr, "a session of another backend was passed to a reference backend");
  return *r;
}
const RefSession& as_ref(const BackendSession& s) { return as_ref(const_cast<BackendSession&>(s)); }

// The reference (official formats or the bf16 ablation) over the CPU reference's ops, the CUDA
// ops or a reordered variant's, optionally with one planted defect.
class ReferenceBackend final : public Backend {
 public:
  // parts: the components the model runs on, its cache precision and planted defect
  // (make_backend_ops). A device backend's sessions are saved and restored through the host
  // (move_state), with the same session bytes.
  ReferenceBackend(std::string name, const BackendResources& r, BackendOps parts)
      : name_(std::move(name)),
        ops_(std::move(parts.ops)),
        device_(parts.device && ops_ != nullptr),
        claim_(backend_claim(name_)),
        draft_defect_ops_(parts.mutation && parts.mutation->round == defects::RoundDefect::kDraftRopeAtBlockStart
                              ? std::make_unique<defects::DraftRopeAtBlockStartOps>(ops_ ? *ops_ : reference::seam::reference_ops())
                              : nullptr),
        model_(r.config, r.weights, r.token_map,
               draft_defect_ops_ ? *draft_defect_ops_ : ops_ ? *ops_ : reference::seam::reference_ops()),
        resources_(device_ ? &r : nullptr),
        precision_(parts.precision),
        mutation_(std::move(parts.mutation)) {
    model_.set_cache_precision(precision_);
    if (mutation_) {
      DSV41_CHECK(mutation_->is_round() ||
                      (mutation_->layer < r.config.n_layers && mutation_->layer >= 0) ||
                      (mutation_->layer == -1 && (mutation_->id == reference::model::Component::kFinalNormOut ||
                                                  mutation_->id == reference::model::Component::kEmbed)),
                  "backend ", name_, ": layer ", mutation_->layer, " is not a layer of this model (0 .. ",
                  r.config.n_layers - 1, "; -1 for embed and final_norm_out)");
    }
  }

  std::optional<DeviceMemory> device_memory() const override {
#if defined(DSV41_HAVE_CUDA)
    if (device_) {
      const gpu::DeviceMemoryStats m = gpu::device_memory_stats();
      return DeviceMemory{static_cast<int64_t>(m.peak_alloc_bytes), static_cast<int64_t>(m.in_use_bytes)};
    }
#endif
    return std::nullopt;
  }
  void reset_device_peak() override {
#if defined(DSV41_HAVE_CUDA)
    if (device_) gpu::reset_device_alloc_peak();
#endif
  }

  std::string missing_evidence() const override {
    if (!mutation_ || fired_) return "";
    return "the planted defect of " + name_ + " never applied (no such step, layer or component in this run, or "
           "nothing to change there): the comparison proves nothing about it";
  }

  std::string name() const override { return name_; }
  Claim claim() const override { return claim_; }
  const reference::ModelConfig& config() const override { return model_.config(); }

  std::unique_ptr<BackendSession> new_session() override {
    return std::make_unique<RefSession>(model_.new_state());
  }

  reference::model::StepRecord step(BackendSession& s, const std::vector<int64_t>& tokens,
                             const reference::model::StepOptions& options, const reference::model::ForwardHooks& hooks,
                             int64_t step) override {
    ModelState& state = as_ref(s).state;
    reference::model::StepRecord rec;
    with_hooks(hooks, state.pos, static_cast<int64_t>(tokens.size()), step,
               [&] { rec = model_.forward_chunk(state, tokens, options); });
    if (mutation_ && mutation_->is_cache()) fired_ = defects::mutate_cache(*mutation_, step, state) || fired_;
    return rec;
  }

  VerifyResult verify(BackendSession& s, const VerifyRequest& r, const reference::model::ForwardHooks& hooks,
                      int64_t step) override {
    ModelState& state = as_ref(s).state;
    const int64_t k = static_cast<int64_t>(r.drafts.size());
    DSV41_CHECK(!r.keep || (*r.keep >= 0 && *r.keep <= k), "backend ", name_, ": keep ", r.keep.value_or(-1), " of ",
                k, " drafts");
    // A speculative defect fires in the first round at or after its step where it changes something.
    const defects::RoundDefect defect =
        mutation_ && mutation_->is_round() && !fired_ && step >= mutation_->step ? mutation_->round : defects::RoundDefect::kNone;
    bool defect_fired = false;
    const reference::model::RoundHooks defect_hooks = defects::round_defect_hooks(defect, model_.config(), &defect_fired);
    const ModelState before = state;
    reference::SampleRng rng(r.seed);
    reference::model::Verification v;
    // Value and cache defects never fire inside a round: one planted in a rolled-back row would
    // vanish and prove nothing (scenarios/runner/rounds.h).
    with_hooks(hooks, state.pos, k + 1, kNoDefectStep, [&] {
      v = reference::model::verify_drafts(model_, state, r.current, r.drafts, r.p_draft, r.sampling, rng);
    });
    if (defect_hooks.decided) defect_hooks.decided(v, k);
    VerifyResult out;
    out.kept = r.keep.value_or(v.decision.accepted);
    std::vector<int64_t> tokens = {r.current};
    tokens.insert(tokens.end(), r.drafts.begin(), r.drafts.end());
    reference::model::roll_back(model_, state, before, tokens, out.kept, defect_hooks);
    fired_ = fired_ || defect_fired;
    out.step = std::move(v.step);
    out.decision = std::move(v.decision);
    return out;
  }

  reference::model::DraftResult draft(BackendSession& s, int64_t last_token, const reference::model::DraftSampling& sampling,
                               const reference::model::ForwardHooks& hooks, int64_t step) override {
    const ModelState& state = as_ref(s).state;
    // draft_rope_pos0 fires in the first draft at or after its step (a block of one row: nothing to change).
    const bool plant = draft_defect_ops_ && !fired_ && step >= mutation_->step &&
                       model_.config().dspark_block_size >= 2;
    reference::model::DraftResult d;
    // Value and cache defects never fire inside a round (rounds.h).
    struct Disarm {  // the defect is armed for this draft only, also when it throws
      const defects::DraftRopeAtBlockStartOps* ops;
      ~Disarm() {
        if (ops) ops->arm(false);
      }
    } disarm{plant ? draft_defect_ops_.get() : nullptr};
    if (plant) draft_defect_ops_->arm(true);
    with_hooks(hooks, state.pos, model_.config().dspark_block_size, kNoDefectStep,
               [&] { d = model_.draft(state, last_token, sampling); });
    fired_ = fired_ || plant;
    return d;
  }

  std::unique_ptr<BackendSession> fork(const BackendSession& s) override {
    return std::make_unique<RefSession>(as_ref(s).state);
  }

  SavedState save(const BackendSession& s, bool include_swa) override {
    const ModelState& state = as_ref(s).state;
    SavedState out;
    out.pos = state.pos;
    out.has_swa = include_swa;
    if (precision_ == CachePrecision::kPacked && device_) {
      ModelState host = state;  // a device copy, then moved to the host
      move_state(host, model_.ops(), /*to_device=*/false);
      out.bytes = reference::session::session_bytes(host, model_.config(), include_swa);
    } else if (precision_ == CachePrecision::kPacked) {
      out.bytes = reference::session::session_bytes(state, model_.config(), include_swa);
    } else {
      // Session files hold the official formats only: the ablation keeps its state in memory.
      ModelState copy = state;
      if (!include_swa) {
        for (reference::model::LayerState& ls : copy.layers) ls.window_kv.clear();
      }
      out.snapshot = std::make_shared<ModelState>(std::move(copy));
    }
    return out;
  }

  std::unique_ptr<BackendSession> restore(const SavedState& saved, reference::session::ResumeMode mode) override {
    if (precision_ == CachePrecision::kPacked) {
      DSV41_CHECK(!saved.bytes.empty(), "backend ", name_, ": the saved state holds no session bytes");
      if (device_) {
        // Loaded (and, global-only, replayed) by a host model of the same weights, then uploaded:
        // the same session bytes on both sides (the replay runs on the CPU reference for now).
        if (!host_model_) {
          host_model_ = std::make_unique<reference::model::Model>(resources_->config, resources_->weights,
                                                           resources_->token_map);
        }
        reference::session::LoadedSession l =
            reference::session::load_session_bytes(saved.bytes, "saved session", model_.config(), *host_model_, mode);
        move_state(l.state, model_.ops(), /*to_device=*/true);
        return std::make_unique<RefSession>(std::move(l.state));
      }
      reference::session::LoadedSession l =
          reference::session::load_session_bytes(saved.bytes, "saved session", model_.config(), model_, mode);
      return std::make_unique<RefSession>(std::move(l.state));
    }
    const auto* snap = std::any_cast<std::shared_ptr<ModelState>>(&saved.snapshot);
    DSV41_CHECK(snap != nullptr && *snap, "backend ", name_, ": the saved state holds no snapshot");
    ModelState state = **snap;
    if (mode == reference::session::ResumeMode::kFull) {
      DSV41_CHECK(saved.has_swa, "backend ", name_, ": a full resume needs the SWA rings, saved without them");
    } else {
      const int64_t n = std::min<int64_t>(state.pos, model_.config().window_size);
      std::vector<int64_t> tail;
      const int64_t kept = static_cast<int64_t>(state.recent_tokens.size());
      for (int64_t p = state.pos - n; p < state.pos; ++p) tail.push_back(state.recent_tokens[static_cast<size_t>(p % kept)]);
      // The Engram history is part of the global state the snapshot keeps.
      model_.replay_local_state(state, tail);
    }
    return std::make_unique<RefSession>(std::move(state));
  }

  std::vector<reference::model::CacheView> caches(const BackendSession& s) const override {
    // The caches, then the compressors' pending groups and the DSpark rings: what a rollback or a
    // resume must restore.
    std::vector<reference::model::CacheView> v = model_.cache_views(as_ref(s).state);
    for (std::vector<reference::model::CacheView> more : {reference::model::compressor_views(as_ref(s).state, model_.ops()),
                                                   reference::model::dspark_views(as_ref(s).state, model_.ops())}) {
      v.insert(v.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    return v;
  }

 private:
  // Runs `fn` with the caller's hooks (and this backend's planted value defect) set on the model.
  template <typename F>
  void with_hooks(const reference::model::ForwardHooks& hooks, int64_t start, int64_t T, int64_t step, F&& fn) {
    if (!mutation_ || mutation_->is_cache() || mutation_->is_round()) {
      model_.set_hooks(hooks);
    } else {
      model_.set_hooks(defects::mutated_hooks(*mutation_, hooks, model_.config(), start, T, step, &fired_));
    }
    try {
      fn();
    } catch (...) {
      model_.set_hooks({});
      throw;
    }
    model_.set_hooks({});
#if defined(DSV41_HAVE_CUDA)
    // DSV41_CUDA_OP_TIMES: what happens between two forwards (the runner, the other side) is not
    // charged to the forward's last op.
    if (const auto* cuda = dynamic_cast<const gpu::CudaOps*>(ops_.get())) cuda->time_mark("(outside the forward)");
#endif
  }

  std::string name_;
  std::unique_ptr<reference::seam::Ops> ops_;  // nullptr: reference_ops(); declared before the model using it
  bool device_;  // ops_ keeps its tensors on a device (the cuda backends)
  Claim claim_;  // backend_claim(name_)
  std::unique_ptr<defects::DraftRopeAtBlockStartOps> draft_defect_ops_;  // mutant:draft_rope_pos0 only: wraps the ops
  reference::model::Model model_;
  const BackendResources* resources_;    // device backends: to build host_model_ (outlives the backend)
  std::unique_ptr<reference::model::Model> host_model_;  // device backends: loads saved sessions on the host
  CachePrecision precision_;
  std::optional<defects::Mutation> mutation_;
  bool fired_ = false;
};

}  // namespace

namespace {

// "reversed, pairwise, blocked, fma, splitk, tiles"
std::string variant_names() {
  std::string s;
  for (defects::SumOrder o : defects::all_sum_orders()) s += (s.empty() ? "" : ", ") + std::string(defects::name(o));
  return s;
}

// ref-order:<variant>[:<mutation>]: the variant and the planted defect, checked (a dsv41::Error
// naming the spec and the known variants otherwise).
struct OrderSpec {
  defects::SumOrder order;
  std::optional<defects::Mutation> mutation;
};
OrderSpec parse_order_spec(const std::string& spec) {
  const std::string rest = spec.substr(std::string("ref-order:").size());
  const size_t colon = rest.find(':');
  const std::string variant = rest.substr(0, colon);
  OrderSpec o{};
  try {
    o.order = defects::sum_order_from_name(variant);
  } catch (const Error&) {
    DSV41_FAIL("backend '", spec, "': unknown reordered variant '", variant, "' (known: ", variant_names(),
               "; e.g. ref-order:pairwise)");
  }
  if (colon != std::string::npos) {
    try {
      o.mutation = defects::parse_mutation(rest.substr(colon + 1));
    } catch (const Error& e) {
      DSV41_FAIL("backend '", spec, "': the planted defect after the variant: ", e.what());
    }
  }
  return o;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> backend_catalog() {
  return {
      {"ref", "the CPU reference, official cache formats (FP4/FP8 packed); claims the reference's bits"},
      {"ref-bf16kv", "the reference with every cache in bf16 (no FP4/FP8 QDQ): a precision ablation, "
                     "approximate by design"},
      {"mutant:<component>:L<layer>:S<step>", "the reference with one planted defect (scenarios/defects/mutants.h): "
                                               "the verifier's self-test; claims the reference's bits"},
      {"ref-order:<variant>[:<component>:L<layer>:S<step>[:x<factor>]]",
       "the reference over a correct reordered variant (scenarios/defects/reordered_ops.h; variants: " +
           variant_names() + "): sums in another order, claims order-variant (judged by the derived bounds, "
           "docs/scenarios.md); with a mutation, that variant with one planted defect (the judge's power)"},
      {"cuda-exact", "the model over the CUDA ops table in its exact mode (cuda/cuda_ops.h, docs/cuda.md): ported "
                     "ops as bit-exact kernels, the rest as counted host fallbacks; claims the reference's bits"},
      {"cuda", "the production CUDA path (docs/cuda.md \"Production ops\"): the same ops table with production "
               "kernels (fp8 tensor-core linear, ...) in place of the exact ones; claims order-variant results "
               "(judged by tolerance and derived bounds)"},
  };
}

void validate_backend_name(const std::string& spec) {
  if (spec == "ref" || spec == "ref-bf16kv") return;
  if (spec == "cuda" || spec == "cuda-exact") {
#if defined(DSV41_HAVE_CUDA)
    return;
#else
    DSV41_FAIL("backend ", spec, ": this build has no CUDA path (configured without nvcc; DSV41_HAVE_CUDA is off)");
#endif
  }
  if (spec.rfind("mutant:", 0) == 0) {
    defects::parse_mutation(spec.substr(7));
    return;
  }
  if (spec.rfind("ref-order:", 0) == 0) {
    parse_order_spec(spec);
    return;
  }
  DSV41_FAIL("unknown backend '", spec, "' (known: ref, ref-bf16kv, cuda-exact, cuda, mutant:<component>:L<layer>:S<step>, "
             "ref-order:<variant> with variant one of ", variant_names(), ")");
}

std::optional<defects::Mutation> backend_mutation(const std::string& spec) {
  validate_backend_name(spec);
  if (spec.rfind("mutant:", 0) == 0) return defects::parse_mutation(spec.substr(7));
  if (spec.rfind("ref-order:", 0) == 0) return parse_order_spec(spec).mutation;
  return std::nullopt;
}

Claim backend_claim(const std::string& spec) {
  validate_backend_name(spec);
  if (spec == "ref-bf16kv") return Claim::kApproximate;
  if (spec.rfind("ref-order:", 0) == 0 || spec == "cuda") return Claim::kOrderVariant;
  return Claim::kBitExact;
}

judge::Accumulation backend_accumulation(const std::string& spec) {
  validate_backend_name(spec);
  if (spec == "cuda") return judge::Accumulation::kFp8TensorCore;
  if (spec.rfind("ref-order:", 0) == 0 && parse_order_spec(spec).order == defects::SumOrder::kTrunc13) {
    return judge::Accumulation::kFp8TensorCore;
  }
  return judge::Accumulation::kFp32;
}

void move_state(ModelState& st, const reference::seam::Ops& ops, bool to_device) {
  const auto move = [&](auto& t) { t = to_device ? ops.upload(std::move(t)) : ops.download(std::move(t)); };
  for (reference::model::LayerState& ls : st.layers) {
    move(ls.window_kv.bytes);
    if (ls.compressor) {
      move(ls.compressor->kv);
      move(ls.compressor->score);
    }
    for (std::optional<reference::model::PackedCache>* c : {&ls.compressed_kv, &ls.index_keys}) {
      if (*c) to_device ? (*c)->place(ops) : (*c)->fetch(ops);
    }
  }
  for (reference::model::WindowKvRing& ring : st.dspark_window_kv) move(ring.bytes);
}

BackendOps make_backend_ops(const std::string& spec) {
  validate_backend_name(spec);
  BackendOps b;
  if (spec == "ref") return b;
  if (spec == "ref-bf16kv") {
    b.precision = CachePrecision::kBf16;
    return b;
  }
#if defined(DSV41_HAVE_CUDA)
  // cuda-exact: every ported op is bit-exact and every fallback is the reference itself (bitexact).
  // cuda: production kernels replace some exact ones (CudaOps::production_ops): order-variant.
  if (spec == "cuda-exact" || spec == "cuda") {
    b.ops = std::make_unique<gpu::CudaOps>(spec == "cuda-exact" ? gpu::CudaMode::kExact : gpu::CudaMode::kProduction);
    b.device = true;
    return b;
  }
#endif
  if (spec.rfind("ref-order:", 0) == 0) {
    OrderSpec o = parse_order_spec(spec);
    b.ops = defects::make_reordered_ops(o.order);
    b.mutation = std::move(o.mutation);
    return b;
  }
  b.mutation = defects::parse_mutation(spec.substr(7));  // mutant:<spec>
  return b;
}

std::unique_ptr<Backend> make_backend(const std::string& spec, const BackendResources& r) {
  return std::make_unique<ReferenceBackend>(spec, r, make_backend_ops(spec));
}

}  // namespace dsv41::scenarios::runner
