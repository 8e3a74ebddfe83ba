// python/bind_model.cc
//
// dsv41.Config, dsv41.Weights, dsv41.Model, dsv41.State, dsv41.DumpWriter (docs/python.md,
// "Model and sessions"): the model of reference/model/model.h with its sessions (reference/session/session_store.h)
// and the port dump writer of `dsv41 forward --dump` (scenarios/conform/port_dump.h). A step returns a dict
// of numpy arrays (logits, selections) and, with capture=True, every hooked component under its
// dump key ("layer03.attn_out", "model.logits": reference/model/hooks.h names). backend="NAME" runs
// the model over a runner backend's ops (scenarios/runner/backend_model.h: ref, cuda-exact, cuda,
// ref-order:<variant>; planted defects are `dsv41 forward --backend`'s and `dsv41 run`'s).
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "python/bindings.h"
#include "python/port_ops.h"
#include "reference/ops/config.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "reference/session/session_store.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/runner/backend_model.h"
#include "scenarios/runner/capture.h"
#include "scenarios/conform/port_dump.h"

namespace dsv41::python {

namespace {

namespace st = reference::checkpoint::safetensors;
using reference::model::Model;
using reference::ModelConfig;
using reference::model::ModelState;

// The checkpoint: the decoded weights the model runs on, and the file as stored (raw entries).
struct Weights {
  std::string source;
  std::shared_ptr<st::SafetensorsFile> file;
  std::shared_ptr<reference::checkpoint::ModelWeights> weights;
};

Weights load_weights(const std::string& path, const ModelConfig& c) {
  Weights w;
  w.source = path;
  w.file = std::make_shared<st::SafetensorsFile>(st::SafetensorsFile::read(path));
  w.weights = std::make_shared<reference::checkpoint::ModelWeights>(reference::checkpoint::ModelWeights::load(*w.file, c));
  return w;
}

Weights generate(const ModelConfig& c, uint64_t seed) {
  Weights w;
  w.source = "generated (seed " + std::to_string(seed) + ")";
  w.file = std::make_shared<st::SafetensorsFile>(
      st::SafetensorsFile::from_entries(w.source, reference::checkpoint::generate_weights(c, seed)));
  w.weights = std::make_shared<reference::checkpoint::ModelWeights>(reference::checkpoint::ModelWeights::load(*w.file, c));
  return w;
}

// A model and the ops it runs on (a runner backend's, or a port's ops bridged from Python).
struct PyModel {
  std::shared_ptr<PortOps> port;  // null: a backend's model
  std::shared_ptr<scenarios::runner::BackendModel> backend;  // null: a port's model
  std::shared_ptr<Model> model;  // the backend's model (sharing its ownership), or the port's
};

PyModel make_model(const ModelConfig& c, const Weights& w, std::optional<std::vector<int64_t>> token_map,
                   std::optional<py::dict> port, const std::string& backend) {
  PyModel m;
  std::vector<int64_t> map = token_map ? *token_map : reference::model::default_token_map(c);
  if (port && !port->empty()) {
    if (backend != "ref") {
      DSV41_FAIL("Model: port and backend '", backend, "': a port's ops replace some of the reference's "
                 "(backend 'ref'); give one of them");
    }
    m.port = std::make_shared<PortOps>(*port);
    m.model = std::make_shared<Model>(c, *w.weights, std::move(map), *m.port);
    return m;
  }
  scenarios::runner::BackendModel::validate(backend, "backend", /*planted_defects=*/false);
  m.backend = std::make_shared<scenarios::runner::BackendModel>(backend);  // a device backend: needs a device
  m.model = std::shared_ptr<Model>(m.backend, &m.backend->build(c, *w.weights, std::move(map)));
  return m;
}

const char* claim_name(scenarios::runner::Claim c) {
  return c == scenarios::runner::Claim::kOrderVariant ? scenarios::conform::kClaimOrderVariant
                                                       : scenarios::conform::kClaimBitExact;
}

py::dict record_dict(reference::model::StepRecord&& r) {
  py::dict d;
  d["start_pos"] = r.start_pos;
  d["tokens"] = r.tokens;
  const int64_t vocab = static_cast<int64_t>(r.logits.size());
  d["logits"] = to_numpy(std::move(r.logits), {vocab});
  if (r.all_logits.rank() == 2) d["all_logits"] = to_numpy(std::move(r.all_logits));
  py::dict topk, cand, ids, experts;
  for (auto& [l, t] : r.topk) topk[py::int_(l)] = to_numpy(std::move(t));
  for (auto& [l, t] : r.candidates) cand[py::int_(l)] = to_numpy(std::move(t));
  for (auto& [l, t] : r.engram_ids) ids[py::int_(l)] = to_numpy(std::move(t));
  for (auto& [l, t] : r.experts) experts[py::int_(l)] = to_numpy(std::move(t));
  d["topk"] = topk;
  d["candidates"] = cand;
  d["engram_ids"] = ids;
  d["experts"] = experts;
  return d;
}

py::dict cache_dict(reference::model::CacheView&& v) {
  py::dict d;
  d["kind"] = v.kind;
  d["layer"] = v.layer;
  d["format"] = formats::info(v.format).name;
  d["dim"] = v.dim;
  d["entry_bytes"] = v.entry_bytes;
  d["bytes"] = to_numpy(std::move(v.bytes), {v.entries, v.entry_bytes});
  const int64_t n = static_cast<int64_t>(v.positions.size());
  d["positions"] = to_numpy(std::move(v.positions), {n});
  return d;
}

// Every captured item under its dump key: floats as float32, selections int32, masks uint8, ids int64.
py::dict capture_dict(const scenarios::runner::StepCapture& cap) {
  py::dict d;
  for (const scenarios::runner::CapturedItem& it : cap.items) {
    const std::string key = scenarios::conform::dump_key(it.layer, it.component);
    switch (it.kind) {
      case scenarios::runner::CapturedItem::kFloat: d[key.c_str()] = to_numpy(it.f); break;
      case scenarios::runner::CapturedItem::kIndex: d[key.c_str()] = to_numpy(it.i); break;
      case scenarios::runner::CapturedItem::kMask: d[key.c_str()] = to_numpy(it.m); break;
      case scenarios::runner::CapturedItem::kIds: {
        std::vector<int64_t> ids = it.ids;
        d[key.c_str()] = to_numpy(std::move(ids), it.ids_shape);
        break;
      }
    }
  }
  return d;
}

// Replaces captured items by a port's values (the hook adapter, dsv41/torch_hooks.py): key -> array
// of the item's shape. A key the capture does not hold, or another shape, is an error naming the key.
void apply_override(scenarios::runner::StepCapture& cap, const py::dict& values) {
  for (const auto& [k, v] : values) {
    const std::string key = py::str(k).cast<std::string>();
    scenarios::runner::CapturedItem* hit = nullptr;
    for (scenarios::runner::CapturedItem& it : cap.items) {
      if (scenarios::conform::dump_key(it.layer, it.component) == key) hit = &it;
    }
    if (hit == nullptr) DSV41_FAIL("port value '", key, "': the step has no such component (dump keys: layerNN.<component>, model.<component>)");
    const auto same = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
      DSV41_CHECK(a == b, "port value '", key, "': shape ", reference::shape_string(b), ", the step's is ",
                  reference::shape_string(a));
    };
    switch (hit->kind) {
      case scenarios::runner::CapturedItem::kFloat: {
        reference::Tensor<float> t = to_f32(v, key);
        same(hit->f.shape(), t.shape());
        hit->f = std::move(t);
        break;
      }
      case scenarios::runner::CapturedItem::kIndex: {
        reference::Tensor<int32_t> t = to_int<int32_t>(v, key);
        same(hit->i.shape(), t.shape());
        hit->i = std::move(t);
        break;
      }
      case scenarios::runner::CapturedItem::kMask: {
        reference::Tensor<uint8_t> t = to_int<uint8_t>(v, key);
        same(hit->m.shape(), t.shape());
        hit->m = std::move(t);
        break;
      }
      case scenarios::runner::CapturedItem::kIds: {
        reference::Tensor<int64_t> t = to_int<int64_t>(v, key);
        same(hit->ids_shape, t.shape());
        hit->ids = t.data();
        break;
      }
    }
  }
}

reference::session::ResumeMode resume_mode(const std::string& s) {
  if (s == "full") return reference::session::ResumeMode::kFull;
  if (s == "global-only") return reference::session::ResumeMode::kGlobalOnly;
  DSV41_FAIL("resume mode '", s, "': expected full or global-only");
}

py::dict step(PyModel& pm, ModelState& state, const std::vector<int64_t>& tokens, bool capture,
              scenarios::conform::PortDumpWriter* dump, const std::string& event, py::object port_values,
              int64_t decoder_replay, int64_t window_floor, bool all_logits) {
  DSV41_CHECK(!tokens.empty(), "step: no tokens");
  reference::model::StepOptions o;
  o.decoder_replay_rows = decoder_replay;
  o.window_floor = window_floor;
  o.all_logits = all_logits;
  scenarios::runner::StepCapture cap;
  const bool record = capture || dump != nullptr;
  if (dump != nullptr && decoder_replay > 0) {
    DSV41_FAIL("dump with decoder_replay: not supported (its later layers run fewer rows than the step's tokens)");
  }
  Model& model = *pm.model;
  if (record) model.set_hooks(scenarios::runner::capture_hooks(cap, nullptr));
  reference::model::StepRecord rec;
  try {
    py::gil_scoped_release release;  // a port's ops take the GIL back (python/port_ops.h)
    rec = model.forward_chunk(state, tokens, o);
  } catch (...) {
    model.set_hooks({});
    throw;
  }
  model.set_hooks({});
  py::dict out;
  if (record) {
    if (!port_values.is_none()) {  // a dict, or an object whose take() gives one (dsv41.torch_hooks.DumpHooks)
      py::dict values = py::hasattr(port_values, "take") ? port_values.attr("take")().cast<py::dict>()
                                                         : port_values.cast<py::dict>();
      apply_override(cap, values);
    }
    if (capture) {
      scenarios::runner::StepCapture shown = cap;
      scenarios::runner::finish_capture(shown, rec, {});
      out["components"] = capture_dict(shown);
      py::list caches;
      for (reference::model::CacheView v : model.cache_views(state)) caches.append(cache_dict(std::move(v)));
      out["caches"] = caches;
    }
    if (dump != nullptr) {  // add_model_step finishes the capture (Engram ids, logits, every cache)
      // The dump's values are the backend's (not a port's): it records the backend and its claim.
      if (pm.backend && port_values.is_none()) dump->set_backend(pm.backend->name());
      const bool first = state.pos == static_cast<int64_t>(tokens.size());
      const std::string ev = !event.empty() ? event : first || tokens.size() > 1 ? "prefill" : "decode";
      dump->add_model_step(cap, model, state, rec, tokens, ev);
    }
  }
  py::dict r = record_dict(std::move(rec));
  for (const auto& [k, v] : out) r[k] = v;
  return r;
}

}  // namespace

void register_model(py::module_& m) {
  py::class_<ModelConfig>(m, "Config", "a model config (docs/config.md): a preset name ('tiny', 'full') or a file")
      .def_static("load", &reference::load_config, py::arg("file_or_preset"),
                  "a preset name ('tiny', 'full') or a config.json path; a dsv41.Error names the file and key")
      .def_static("from_json", &reference::parse_config, py::arg("text"), py::arg("source") = "python",
                  "parse and validate a config's JSON text")
      .def("json", [](const ModelConfig& c) { return reference::to_json_string(c); }, "the config as JSON text")
      .def("hash", [](const ModelConfig& c) { return reference::config_hash(c); }, "the config hash (16 hex digits)")
      .def("__repr__", [](const ModelConfig& c) { return "dsv41.Config(hash=" + reference::config_hash(c) + ")"; });
  m.def("presets", &reference::preset_names, "the built-in config presets");

  py::class_<Weights>(m, "Weights", "a checkpoint in the official safetensors format (reference/checkpoint/weights.h)")
      .def_static("load", &load_weights, py::arg("path"), py::arg("config"),
                  "read and check a weights file against the config (every tensor, dtype and shape)")
      .def_static("generate", &generate, py::arg("config"), py::arg("seed") = 0,
                  "seeded random weights (dsv41 weights --seed), in memory")
      .def_property_readonly("source", [](const Weights& w) { return w.source; })
      .def("names", [](const Weights& w) { return w.file->names(); }, "the checkpoint tensor names")
      .def("raw", [](const Weights& w, const std::string& name) {
             const st::Entry& e = w.file->get(name);
             std::vector<uint8_t> b = e.bytes;
             const int64_t n = static_cast<int64_t>(b.size());
             return py::make_tuple(reference::dtype_name(e.dtype), e.shape, to_numpy(std::move(b), {n}));
           }, py::arg("name"),
           "(dtype name, logical shape, uint8 bytes as stored): a tensor as the checkpoint holds it (F8_E4M3, F4 "
           "packed two per byte, E8M0 scales, BF16, F32); an input of dsv41.ops for weights")
      .def("tensor", [](const Weights& w, const std::string& name) {
             const st::Entry& e = w.file->get(name);
             DSV41_CHECK(e.dtype == reference::DType::kF32 || e.dtype == reference::DType::kBF16, "weight '", name,
                         "' is ", reference::dtype_name(e.dtype), "; tensor() decodes F32 and BF16 only (raw() gives the bytes)");
             return to_numpy(e.to_f32(), e.shape);
           }, py::arg("name"), "an F32 or BF16 checkpoint tensor as float32 (exact)");

  py::class_<ModelState>(m, "State", "a session's state (reference/model/kv_cache.h): caches, compressor groups, Engram history")
      .def_property_readonly("pos", [](const ModelState& s) { return s.pos; }, "tokens consumed so far")
      .def("copy", [](const ModelState& s) { return ModelState(s); }, "an independent snapshot");

  py::class_<scenarios::conform::PortDumpWriter, std::unique_ptr<scenarios::conform::PortDumpWriter>>(
      m, "DumpWriter", "writes a port dump (docs/port-dump.md), as `dsv41 forward --dump` does")
      .def(py::init([](const std::string& path, const ModelConfig& c, const std::string& weights,
                       const std::string& token_map, const std::string& command_line,
                       const std::optional<std::string>& claim) {
             auto w = std::make_unique<scenarios::conform::PortDumpWriter>(path, c, weights, token_map, command_line);
             if (claim) w->set_claim(*claim);
             return w;
           }),
           py::arg("path"), py::arg("config"), py::arg("weights") = "", py::arg("token_map") = "default",
           py::arg("command_line") = "python", py::arg("claim") = py::none(),
           "path: a new or empty directory, or a new FILE.h5; claim: 'bit-exact' or 'order-variant' (docs/conform.md); "
           "None: the claim of the Model(backend=...) whose steps it writes (bit-exact when a port's values are dumped)")
      .def_property_readonly("claim", [](const scenarios::conform::PortDumpWriter& w) {
             return w.claim().empty() ? std::string(scenarios::conform::kClaimBitExact) : w.claim();
           }, "the claim the manifest will hold")
      .def_property_readonly("backend", [](const scenarios::conform::PortDumpWriter& w) -> py::object {
             if (w.backend().empty()) return py::none();
             return py::str(w.backend());
           }, "the backend whose steps it holds (None: not recorded)")
      .def("finish", &scenarios::conform::PortDumpWriter::finish, "write the manifest (the dump exists only after this)");

  py::class_<PyModel>(m, "Model", "the reference forward (reference/model/model.h), optionally over a port's ops")
      .def(py::init(&make_model), py::arg("config"), py::arg("weights"), py::arg("token_map") = py::none(),
           py::arg("port") = py::none(), py::kw_only(), py::arg("backend") = "ref",
           "token_map: [vocab] Engram compressed ids (default: id * C / V); port: {op name: callable} replacing "
           "seam ops by a port's (docs/python.md, 'A port's ops in the reference model'); backend: the ops the "
           "model runs on, a runner backend's name (default 'ref'; 'cuda-exact', 'cuda', 'ref-order:<variant>'; "
           "docs/python.md): a bad name is a dsv41.Error naming the valid ones")
      .def_property_readonly("backend", [](const PyModel& pm) -> py::object {
             if (!pm.backend) return py::none();
             return py::str(pm.backend->name());
           }, "the backend's name (None: a port's model)")
      .def_property_readonly("claim", [](const PyModel& pm) -> py::object {
             if (!pm.backend) return py::none();
             return py::str(claim_name(pm.backend->claim()));
           }, "what the backend claims: 'bit-exact' or 'order-variant' (None: a port's model, which states its own)")
      .def("new_state", [](const PyModel& pm) { return pm.model->new_state(); }, "a fresh state at position 0")
      .def("step", &step, py::arg("state"), py::arg("tokens"), py::kw_only(), py::arg("capture") = false,
           py::arg("dump") = nullptr, py::arg("event") = "", py::arg("port_values") = py::none(),
           py::arg("decoder_replay") = 0, py::arg("window_floor") = 0, py::arg("all_logits") = false,
           "run `tokens` at state.pos (any chunking gives the same bits). Returns {start_pos, tokens, logits "
           "float32 [vocab] (last position), topk {layer: int32 [T, k]}, candidates {layer: uint8 [T, N]}, "
           "engram_ids {layer: int64 [T, cols]}, experts {layer: int32 [T, k]}}; capture=True adds components "
           "{dump key: array} and caches [ {kind, layer, format, dim, bytes uint8 [entries, entry_bytes], positions} ]; "
           "dump=DumpWriter writes the step (event: prefill, decode, resume+prefill, ...); port_values {dump key: "
           "array}, or an object whose take() returns one after the step (dsv41.torch_hooks), replaces captured values "
           "before they are dumped")
      .def("cache_views", [](const PyModel& pm, const ModelState& s) {
             py::list l;
             for (reference::model::CacheView v : pm.model->cache_views(s)) l.append(cache_dict(std::move(v)));
             return l;
           }, py::arg("state"), "every cache of the state as stored bytes")
      .def("replay_local_state", [](const PyModel& pm, ModelState& s, const std::vector<int64_t>& tail) {
             pm.model->replay_local_state(s, tail);
           }, py::arg("state"), py::arg("tail"), "encoder replay after a global-only resume (docs/sessions.md)")
      .def("draft", [](const PyModel& pm, const ModelState& s, int64_t last, double temperature, uint64_t seed) {
             reference::model::DraftResult d = pm.model->draft(s, last, reference::model::DraftSampling{temperature, seed});
             py::dict r;
             r["position"] = d.position;
             r["tokens"] = d.tokens;
             r["logits"] = to_numpy(std::move(d.logits));
             r["probs"] = to_numpy(std::move(d.probs));
             const int64_t b = static_cast<int64_t>(d.confidence.size());
             r["confidence"] = to_numpy(std::move(d.confidence), {b});
             return r;
           }, py::arg("state"), py::arg("last_token"), py::arg("temperature") = 0.0, py::arg("seed") = 0,
           "the DSpark draft after state.pos (docs/dspark.md): {position, tokens [B], logits float32 [B, vocab], "
           "probs, confidence float32 [B]}")
      .def("save_session", [](const PyModel& pm, const ModelState& s, const std::string& path, bool swa) {
             if (pm.backend) return pm.backend->save_session(path, s, swa);  // a device backend: via the host
             reference::session::save_session(path, s, pm.model->config(), swa);
           }, py::arg("state"), py::arg("path"), py::arg("include_swa") = true,
           "save the session (docs/session-store.md; atomic); include_swa=False drops the SWA rings")
      .def("session_bytes", [](const PyModel& pm, const ModelState& s, bool swa) {
             std::vector<uint8_t> b = pm.backend ? pm.backend->session_bytes(s, swa)
                                                 : reference::session::session_bytes(s, pm.model->config(), swa);
             const int64_t n = static_cast<int64_t>(b.size());
             return to_numpy(std::move(b), {n});
           }, py::arg("state"), py::arg("include_swa") = true, "the session file's bytes, uint8")
      .def("load_session", [](const PyModel& pm, const std::string& path, const std::string& mode) {
             reference::session::LoadedSession l =
                 pm.backend ? pm.backend->load_session(path, resume_mode(mode))
                            : reference::session::load_session(path, pm.model->config(), *pm.model, resume_mode(mode));
             py::dict info;
             info["pos"] = l.header.pos;
             info["has_swa"] = l.has_swa;
             info["mode"] = mode;
             info["replayed_tokens"] = l.replayed_tokens;
             return py::make_tuple(std::move(l.state), info);
           }, py::arg("path"), py::arg("mode") = "full",
           "resume a saved session: mode 'full' (bit-exact continuation) or 'global-only' (encoder replay). "
           "Returns (State, info {pos, has_swa, mode, replayed_tokens}); every corrupt file is a dsv41.Error");
  m.def("default_token_map", &reference::model::default_token_map, py::arg("config"), "id * compressed_vocab / vocab");
}

}  // namespace dsv41::python
