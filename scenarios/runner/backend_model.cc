// scenarios/runner/backend_model.cc: a Model over a backend's ops for the tools that run a Model
// themselves (scenarios/runner/backend_model.h).
#include "scenarios/runner/backend_model.h"

#include <utility>

#include "base/error.h"
#include "scenarios/defects/mutants.h"

namespace dsv41::scenarios::runner {

namespace {

constexpr const char* kBf16Ablation = "ref-bf16kv";

// The ops of a name BackendModel takes (checked first: no ops are built for a refused name).
BackendOps checked_ops(const std::string& spec) {
  BackendModel::validate(spec, "backend");
  return make_backend_ops(spec);
}

}  // namespace

std::string BackendModel::valid_names(bool planted_defects) {
  std::string s;
  for (const auto& [catalog_name, what] : backend_catalog()) {
    std::string name = catalog_name;
    if (name == kBf16Ablation || (!planted_defects && name.rfind("mutant:", 0) == 0)) continue;
    if (!planted_defects && name.rfind("ref-order:", 0) == 0) name = "ref-order:<variant>";
    s += (s.empty() ? "" : ", ") + name;
  }
  return s;
}

void BackendModel::validate(const std::string& spec, const std::string& context, bool planted_defects) {
  const std::string head = context + " '" + spec + "': ";
  const std::string valid = "; valid: " + valid_names(planted_defects);
  if (spec == kBf16Ablation) {
    DSV41_FAIL(head, "the bf16-cache ablation is no single packed model: its caches are bf16, not the official "
               "formats (no session file, no cache bytes a port dump could hold); compare it with "
               "dsv41 run --sides ref,ref-bf16kv", valid);
  }
  const bool known_form = spec == "ref" || spec == "cuda" || spec == "cuda-exact" || spec.rfind("mutant:", 0) == 0 ||
                          spec.rfind("ref-order:", 0) == 0;
  if (!known_form) DSV41_FAIL(head, "unknown backend", valid);
  std::optional<defects::Mutation> m;
  try {
    m = backend_mutation(spec);  // validate_backend_name, then the planted defect
  } catch (const Error& e) {
    std::string why = e.what();
    const std::string again = "backend '" + spec + "': ";  // parse_order_spec names the spec too
    if (why.rfind(again, 0) == 0) why = why.substr(again.size());
    DSV41_FAIL(head, why, valid);
  }
  if (m && !planted_defects) {
    DSV41_FAIL(head, "a planted defect counts its S<step> in a tool's run: plant it with dsv41 forward --backend "
               "or dsv41 run --sides", valid);
  }
  if (m && m->is_round()) {
    DSV41_FAIL(head, "a speculative-round defect (", m->component, ") plants in a round's rollback or draft, "
               "which dsv41 run drives (--sides ref,", spec, "); here a planted defect is a value or cache "
               "defect", valid);
  }
}

BackendModel::BackendModel(const std::string& spec)
    : name_(spec), parts_(checked_ops(spec)) {
  claim_ = backend_claim(spec);
}

BackendModel::~BackendModel() = default;

reference::model::Model& BackendModel::build(reference::ModelConfig config,
                                             reference::checkpoint::ModelWeights weights,
                                             std::vector<int64_t> token_map) {
  DSV41_CHECK(!model_, "backend ", name_, ": the model is built once");
  const defects::Mutation* m = parts_.mutation ? &*parts_.mutation : nullptr;
  if (m != nullptr) {
    DSV41_CHECK((m->layer >= 0 && m->layer < config.n_layers) ||
                    (m->layer == -1 && (m->id == reference::model::Component::kFinalNormOut ||
                                        m->id == reference::model::Component::kEmbed)),
                "backend ", name_, ": layer ", m->layer, " is not a layer of this model (0 .. ", config.n_layers - 1,
                "; -1 for embed and final_norm_out)");
  }
  model_.emplace(std::move(config), std::move(weights), std::move(token_map),
                 parts_.ops ? *parts_.ops : reference::seam::reference_ops());
  model_->set_cache_precision(parts_.precision);
  return *model_;
}

reference::model::Model& BackendModel::model() {
  DSV41_CHECK(model_.has_value(), "backend ", name_, ": build() the model first");
  return *model_;
}
const reference::model::Model& BackendModel::model() const {
  DSV41_CHECK(model_.has_value(), "backend ", name_, ": build() the model first");
  return *model_;
}

void BackendModel::begin_step(int64_t start, int64_t T, int64_t step) {
  reference::model::Model& m = model();
  if (!parts_.mutation || parts_.mutation->is_cache() || step < 0) {
    m.set_hooks(hooks_);
    return;
  }
  m.set_hooks(defects::mutated_hooks(*parts_.mutation, hooks_, m.config(), start, T, step, &fired_));
}

void BackendModel::end_step(reference::model::ModelState& state, int64_t step) {
  if (parts_.mutation && parts_.mutation->is_cache() && step >= 0) {
    fired_ = defects::mutate_cache(*parts_.mutation, step, state) || fired_;
  }
}

std::string BackendModel::missing_evidence() const {
  if (!parts_.mutation || fired_) return "";
  return "the planted defect of backend " + name_ + " never applied (no such step, layer or component in this "
         "run, or nothing to change there; a speculative round plants none): the run is the unplanted backend's";
}

reference::model::ModelState BackendModel::host_state(const reference::model::ModelState& state) const {
  reference::model::ModelState host = state;  // a device copy, then moved to the host
  if (parts_.device) move_state(host, model().ops(), /*to_device=*/false);
  return host;
}

const reference::seam::Ops& BackendModel::host_ops() const {
  return parts_.device ? reference::seam::reference_ops() : model().ops();
}

void BackendModel::save_session(const std::string& path, const reference::model::ModelState& state,
                                bool include_swa) const {
  if (!parts_.device) {
    reference::session::save_session(path, state, model().config(), include_swa);
    return;
  }
  reference::session::save_session(path, host_state(state), model().config(), include_swa);
}

std::vector<uint8_t> BackendModel::session_bytes(const reference::model::ModelState& state, bool include_swa) const {
  if (!parts_.device) return reference::session::session_bytes(state, model().config(), include_swa);
  return reference::session::session_bytes(host_state(state), model().config(), include_swa);
}

const reference::model::Model& BackendModel::host_model() {
  if (!parts_.device) return model();
  if (!host_model_) {
    const reference::model::Model& m = model();
    host_model_ = std::make_unique<reference::model::Model>(m.config(), m.weights(), m.token_map());
  }
  return *host_model_;
}

reference::session::LoadedSession BackendModel::load_session(const std::string& path,
                                                             reference::session::ResumeMode mode) {
  // A device backend: read (and, global-only, replayed: on the CPU reference for now) by a host
  // model of the same weights, then uploaded, as the runner's device backends restore.
  reference::session::LoadedSession l = reference::session::load_session(path, model().config(), host_model(), mode);
  if (parts_.device) move_state(l.state, model().ops(), /*to_device=*/true);
  return l;
}

}  // namespace dsv41::scenarios::runner
