// scenarios/runner/backend_model.h
//
// BackendModel: a reference::model::Model over a backend's ops (backend.h make_backend_ops), for
// the tools that run a Model themselves rather than a Backend: `dsv41 forward --backend NAME`
// (scenarios/cli/cli_forward.cc) and the Python module's dsv41.Model(..., backend=NAME)
// (python/bind_model.cc). The names are the runner's (backend.h, docs/scenarios.md) that are one
// packed model:
//   ref, cuda-exact, cuda, ref-order:<variant>[:<defect>], mutant:<defect>
// Refused, with the reason and these names: ref-bf16kv (its caches are bf16, not the official
// formats: no session file, no cache bytes a port dump could hold; `dsv41 run --sides
// ref,ref-bf16kv` compares it) and the speculative-round defects (they plant in a round's
// rollback or draft, which `dsv41 run` drives: scenarios/runner/rounds.h).
//
// What a Backend adds around its model, the tool gets here:
//   planted defects  begin_step / end_step around each step: a value defect through the hooks when
//                    the tool's step index is its S<step>, a cache defect after that step; a step
//                    given the index -1 (a speculative round's draft and verify, as in rounds.h)
//                    plants nothing. missing_evidence() says when it never applied.
//   device state     a device backend's state lives on the device between steps: host_state,
//                    save_session and load_session go through the host (move_state); a session is
//                    read (and, global-only, replayed) by a host model of the same weights.
//   claim            backend_claim(name): what a port dump of the run claims
//                    (conform::PortDumpWriter::set_backend).
//
// Example:
//   BackendModel::validate("ref-order:splitk", "--backend");   // before anything is read
//   BackendModel bm("ref-order:splitk");                          // the ops (a device: checked here)
//   reference::model::Model& m = bm.build(config, weights, token_map);
//   ModelState s = m.new_state();
//   bm.begin_step(s.pos, prompt.size(), 0);
//   StepRecord r = m.forward_chunk(s, prompt);
//   bm.end_step(s, 0);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reference/model/hooks.h"
#include "reference/model/model.h"
#include "reference/session/session_store.h"
#include "scenarios/runner/backend.h"

namespace dsv41::scenarios::runner {

class BackendModel {
 public:
  // Checks `spec` is a backend name this class takes (above), before anything is read: a
  // dsv41::Error "<context> '<spec>': <reason>; valid: <names>" otherwise. planted_defects =
  // false also refuses mutant:... and ref-order:<variant>:<defect> (Python: no step count there).
  static void validate(const std::string& spec, const std::string& context, bool planted_defects = true);
  // The names this class takes, one line (backend_catalog's, without the refused ones).
  static std::string valid_names(bool planted_defects = true);

  // The ops of `spec` (validate's names; a device backend needs a device: a dsv41::Error otherwise).
  explicit BackendModel(const std::string& spec);
  BackendModel(const BackendModel&) = delete;
  BackendModel& operator=(const BackendModel&) = delete;
  ~BackendModel();

  // The model over the ops; once. The weights stay with the model (model().weights()).
  reference::model::Model& build(reference::ModelConfig config, reference::checkpoint::ModelWeights weights,
                                 std::vector<int64_t> token_map);
  reference::model::Model& model();
  const reference::model::Model& model() const;

  const std::string& name() const { return name_; }
  Claim claim() const { return claim_; }
  bool device() const { return parts_.device; }

  // The hooks the tool wants on every step (capture, progress); begin_step sets them on the model.
  void set_hooks(reference::model::ForwardHooks hooks) { hooks_ = std::move(hooks); }
  // Before a step of T tokens at `start`, the tool's step `step` (0, 1, ... in run order; -1: a
  // step no defect plants in): the model's hooks are the tool's, with the planted value defect.
  void begin_step(int64_t start, int64_t T, int64_t step);
  // After that step (before its caches are read): the planted cache defect, when its step came.
  void end_step(reference::model::ModelState& state, int64_t step);
  // "" or why the run proves less than it claims: the planted defect never applied.
  std::string missing_evidence() const;

  // A host copy of the state (a host backend: a copy), and the ops that read it.
  reference::model::ModelState host_state(const reference::model::ModelState& state) const;
  const reference::seam::Ops& host_ops() const;
  // Sessions (reference/session/session_store.h), through the host for a device backend.
  void save_session(const std::string& path, const reference::model::ModelState& state, bool include_swa) const;
  std::vector<uint8_t> session_bytes(const reference::model::ModelState& state, bool include_swa) const;
  reference::session::LoadedSession load_session(const std::string& path, reference::session::ResumeMode mode);

 private:
  const reference::model::Model& host_model();  // the model itself, or (a device backend) a host twin

  std::string name_;
  Claim claim_ = Claim::kBitExact;  // backend_claim(name_)
  BackendOps parts_;  // declared before the model using its ops
  std::optional<reference::model::Model> model_;
  std::unique_ptr<reference::model::Model> host_model_;  // a device backend's: reads saved sessions
  reference::model::ForwardHooks hooks_;
  bool fired_ = false;  // the planted defect applied
};

}  // namespace dsv41::scenarios::runner
