// `dsv41 forward`: runs the reference forward (prefill from position 0, then one-token decode
// steps fed from --decode, not sampled, or --generate N tokens, plain or speculative:
// scenarios/runner/forward_generate.h) on any config and weights, and writes what a port must agree on to
// an HDF5 file (docs/forward-output.md). Sessions (docs/forward.md, docs/sessions.md): --chunk runs
// the prompt in chunks, --save-state / --resume save and continue a session
// (reference/session/session_store.h); --first-token continues a generation from its pending token.
// --dump DIR (or FILE.h5, the HDF5 container) also writes the run as a port dump
// (docs/port-dump.md): every hooked component, the logits and the caches of every step (a
// generating run's decode steps, a speculative run's verify steps), recorded with capture_hooks
// (scenarios/runner/capture.h). --backend NAME runs the model over a runner backend's ops
// (scenarios/runner/backend_model.h: ref, cuda-exact, cuda, ref-order:<variant>[:<defect>],
// mutant:<defect>); a dump records the backend and its claim.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/output_file.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "reference/model/model.h"
#include "reference/ops/numerics.h"
#include "reference/session/session_store.h"
#include "reports/h5_writer.h"
#include "scenarios/cli/cli.h"
#include "scenarios/runner/progress.h"
#include "scenarios/runner/backend_model.h"
#include "scenarios/runner/capture.h"
#include "scenarios/runner/forward_generate.h"
#include "scenarios/conform/port_dump.h"
#include "scenarios/runner/runner.h"  // shell_quote
#include "scenarios/runner/id_list.h"

namespace dsv41::scenarios::cli {
namespace {

using reference::model::StepRecord;
using reference::Tensor;

struct ForwardArgs {
  std::string config, weights, prompt, decode, token_map, output;
  std::string dump;  // --dump DIR or FILE.h5: a port dump of the run (docs/port-dump.md); "": none
  std::string backend = "ref";  // the ops the model runs on (scenarios/runner/backend_model.h)
  int threads = 0;
  // Sessions.
  std::string save_state, resume;
  std::string resume_mode = "full";
  bool resume_mode_given = false;
  bool drop_swa = false;
  int64_t chunk = 0;       // 0: the prompt in one step
  bool quiet = false;      // -q: no progress
  int64_t start_pos = -1;  // -1: not given
  int64_t decoder_replay = 0;  // > 0: decoder replay rows for each prompt step (docs/sessions.md)
  // Generation (scenarios/runner/forward_generate.h).
  int64_t generate = 0;       // 0: none
  std::string speculative;    // "": plain generation
  std::string sampling;       // "": greedy
  uint64_t seed = 0;
  bool seed_given = false;
  int64_t first_token = -1;   // -1: not given
};

// The generation options, checked against each other and the config before the weights are read.
std::optional<runner::GenerateOptions> generation_options(const ForwardArgs& a, const reference::ModelConfig& c,
                                                  bool has_decode) {
  if (a.generate == 0) {
    if (!a.speculative.empty()) DSV41_FAIL("--speculative: only with --generate N (the tokens to generate)");
    if (!a.sampling.empty()) DSV41_FAIL("--sampling: only with --generate N");
    if (a.seed_given) DSV41_FAIL("--seed: only with --generate N");
    if (a.first_token >= 0) DSV41_FAIL("--first-token: only with --resume and --generate N");
    return std::nullopt;
  }
  if (has_decode) {
    DSV41_FAIL("--generate and --decode: choose one (--decode feeds given ids, --generate picks them from the logits)");
  }
  runner::GenerateOptions o;
  o.tokens = a.generate;
  o.seed = a.seed;
  if (!a.sampling.empty()) o.sampling = runner::parse_sampling(a.sampling);
  if (!a.speculative.empty()) {
    o.speculative = runner::parse_speculative(a.speculative);
    if (c.n_mtp_layers == 0) {
      DSV41_FAIL("--speculative: config '", a.config, "' has no DSpark blocks (n_mtp_layers = 0); speculative "
                 "decoding drafts with them (docs/dspark.md)");
    }
  }
  if (a.first_token >= 0) {
    if (a.resume.empty()) DSV41_FAIL("--first-token: only with --resume (the pending token of the saved session)");
    if (!a.prompt.empty()) {
      DSV41_FAIL("--first-token and --prompt: choose one (--first-token continues a generation from its pending "
                 "token, --prompt runs more tokens first)");
    }
    if (a.first_token >= c.vocab_size) {
      DSV41_FAIL("--first-token: ", a.first_token, " is outside the vocab [0, ", c.vocab_size, ") of config '",
                 a.config, "'");
    }
  }
  return o;
}

std::string layer_name(int l) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "layer%02d", l);
  return buf;
}

// Stacks per-step [T_k, width_k] rows into [sum T_k, max width], padding with `pad`.
template <typename T>
void write_stacked(reports::H5Writer& w, const std::string& path, const std::vector<const Tensor<T>*>& parts, T pad) {
  int64_t rows = 0, width = 0;
  for (const Tensor<T>* p : parts) {
    rows += p->dim(0);
    width = std::max(width, p->dim(1));
  }
  std::vector<T> data(static_cast<size_t>(rows * width), pad);
  int64_t r0 = 0;
  for (const Tensor<T>* p : parts) {
    for (int64_t t = 0; t < p->dim(0); ++t) {
      for (int64_t j = 0; j < p->dim(1); ++j) data[static_cast<size_t>((r0 + t) * width + j)] = p->at(t, j);
    }
    r0 += p->dim(0);
  }
  w.write(path, data, {rows, width});
}

template <typename T>
void write_per_layer(reports::H5Writer& w, const std::string& group, const std::vector<StepRecord>& steps,
                     std::map<int, Tensor<T>> StepRecord::*member, T pad) {
  std::map<int, std::vector<const Tensor<T>*>> by_layer;
  for (const StepRecord& s : steps) {
    for (const auto& [l, t] : s.*member) by_layer[l].push_back(&t);
  }
  for (const auto& [l, parts] : by_layer) write_stacked(w, group + "/" + layer_name(l), parts, pad);
}

// One kv source's packed cache: its stored entries and their bf16 values.
void write_packed(reports::H5Writer& w, const std::string& g, const char* kind, const reference::model::PackedCache& cache,
                  const reference::seam::Ops& ops) {
  const int64_t n = cache.size(), eb = cache.entry_bytes();
  std::vector<uint8_t> bytes;
  for (int64_t e = 0; e < n; ++e) bytes.insert(bytes.end(), cache.entry(e), cache.entry(e) + eb);
  w.write(g + "/" + kind + "_packed", bytes, {n, eb});
  const Tensor<float> v = cache.read(ops, cache.owner_layer(), cache.ratio(), n);
  std::vector<uint16_t> bits;
  for (float x : v.data()) bits.push_back(formats::bf16_encode(x));
  w.write(g + "/" + kind + "_bf16", bits, {n, cache.dim()});
}

void write_caches(reports::H5Writer& w, const reference::model::ModelState& s, const reference::ModelConfig& c,
                  const reference::seam::Ops& ops) {
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const reference::model::LayerState& ls = s.layers[l];
    const std::string g = "/cache/" + layer_name(static_cast<int>(l));
    w.write(g + "/window_kv_packed", ls.window_kv.bytes.data(), {c.window_size, ls.window_kv.entry_bytes()});
    w.write(g + "/window_kv_positions", ls.window_kv.positions, {c.window_size});
    if (ls.compressed_kv) write_packed(w, g, "compressed_kv", *ls.compressed_kv, ops);
    if (ls.index_keys) write_packed(w, g, "index_keys", *ls.index_keys, ops);
    if (ls.compressor) {
      w.write(g + "/compressor_kv_state", ls.compressor->kv.data(), {ls.compressor->ratio, ls.compressor->dim});
      w.write(g + "/compressor_score_state", ls.compressor->score.data(), {ls.compressor->ratio, ls.compressor->dim});
    }
  }
}

// Every id must be a token of the config's vocab: checked here, before the weights are read and
// the forward runs, so a bad id costs nothing and the message names the option and the item.
void check_vocab(const std::vector<int64_t>& ids, const std::string& option, const ForwardArgs& a,
                 const reference::ModelConfig& c) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= c.vocab_size) {
      DSV41_FAIL(option, ": id ", i + 1, " of ", ids.size(), " is ", ids[i], ", outside the vocab [0, ",
                 c.vocab_size, ") of config '", a.config, "'");
    }
  }
}

int run_forward(const ForwardArgs& a, const std::string& command_line) {
  if (a.threads > 0) reference::set_reference_threads(a.threads);
  // 1. Inputs that cost nothing to check: backend, config, ids, token map, output path.
  runner::BackendModel::validate(a.backend, "--backend");
  const reference::ModelConfig c = reference::load_config(a.config);
  const std::vector<int64_t> prompt = a.prompt.empty() ? std::vector<int64_t>{} : runner::parse_id_list(a.prompt, "--prompt");
  const std::vector<int64_t> decode = runner::parse_id_list(a.decode, "--decode");
  const std::optional<runner::GenerateOptions> gen = generation_options(a, c, !decode.empty());
  const std::optional<int64_t> first_token = a.first_token >= 0 ? std::optional<int64_t>(a.first_token) : std::nullopt;
  if (prompt.empty() && !first_token) {
    DSV41_FAIL("--prompt: at least one token is needed (or, resuming a generation, --first-token)");
  }
  check_vocab(prompt, "--prompt", a, c);
  check_vocab(decode, "--decode", a, c);
  // Session options: the file's header, table and checksums are checked here, before the weights.
  if (a.drop_swa && a.save_state.empty()) DSV41_FAIL("--drop-swa: only with --save-state");
  if (a.resume_mode_given && a.resume.empty()) DSV41_FAIL("--resume-mode: only with --resume");
  const bool global_only = a.resume_mode == "global-only";
  int64_t start = 0;
  if (!a.resume.empty()) {
    const reference::session::SessionHeader h = reference::session::read_session_header(a.resume, c);
    if (!h.has_swa && !global_only) {
      DSV41_FAIL("--resume '", a.resume, "': the file holds no SWA state (it was saved with --drop-swa); "
                 "--resume-mode full needs the SWA rings of every layer (--resume-mode global-only rebuilds them)");
    }
    start = h.pos;
  }
  if (a.start_pos >= 0 && a.start_pos != start) {
    if (a.resume.empty()) {
      DSV41_FAIL("resuming at a wrong position: --start-pos ", a.start_pos,
                 ", but a run without --resume starts at position 0");
    }
    DSV41_FAIL("resuming at a wrong position: --start-pos ", a.start_pos, ", but the session in '", a.resume,
               "' is at position ", start);
  }
  // Generation: N generated tokens (+ a draft block beyond the last, for speculative rounds).
  const int64_t more = gen ? a.generate + (gen->speculative ? c.dspark_block_size : 0)
                           : static_cast<int64_t>(decode.size());
  const int64_t positions = start + static_cast<int64_t>(prompt.size()) + more;
  if (positions > c.max_seq_len) {
    DSV41_FAIL(gen ? "--prompt / --generate: " : "--prompt / --decode: ",
               start > 0 ? std::to_string(start) + " resumed positions + " : "", prompt.size(), " prompt tokens + ",
               more, gen ? (gen->speculative ? " generated and drafted tokens" : " generated tokens") : " decode steps",
               " = ", positions, " positions, more than max_seq_len ", c.max_seq_len, " of config '", a.config, "'");
  }
  if (!a.save_state.empty()) {
    const std::filesystem::path dir = std::filesystem::path(a.save_state).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir)) {
      DSV41_FAIL("--save-state '", a.save_state, "': directory '", dir.string(), "' does not exist");
    }
    output::check_output_path(a.save_state, "session file (--save-state)");  // before any work
  }
  std::vector<int64_t> map = a.token_map.empty() ? reference::model::default_token_map(c)
                                                 : runner::parse_id_list("@" + a.token_map, "--token-map");
  if (static_cast<int64_t>(map.size()) != c.vocab_size) {
    DSV41_FAIL("--token-map '", a.token_map, "': ", map.size(), " ids, but config '", a.config, "' has a vocab of ",
               c.vocab_size, " (one compressed id per vocab entry)");
  }
  if (a.output.empty() && a.dump.empty()) DSV41_FAIL("-o/--output or --dump: at least one output is needed");
  // As `dsv41 run` refuses a decoder:N side (scenarios/runner/runner.cc), before any weight is loaded.
  if (a.decoder_replay > 0 && a.decoder_replay < c.window_size) {
    DSV41_FAIL("--decoder-replay ", a.decoder_replay, ": decoder replay needs at least window_size = ",
               c.window_size, " rows of config '", a.config,
               "' (docs/sessions.md: R = W + the speculative block), else the later layers' rings keep holes");
  }
  if (!a.dump.empty() && a.decoder_replay > 0) {
    DSV41_FAIL("--dump with --decoder-replay: not supported (its later layers run fewer rows than the step's "
               "tokens, which dump version 1 does not describe)");
  }
  // Created now (as <output>.tmp.<pid>.<n>) so an unwritable path fails before the forward; removed
  // again if anything below throws.
  std::optional<reports::H5Writer> w;
  if (!a.output.empty()) w.emplace(a.output, "forward output (-o)");
  std::optional<conform::PortDumpWriter> dump;
  if (!a.dump.empty()) {
    dump.emplace(a.dump, c, a.weights, a.token_map.empty() ? "default" : a.token_map, command_line);
    dump->set_backend(a.backend);  // the manifest's backend and claim (runner::backend_claim)
  }
  // The backend's ops (a device backend needs a device: checked before the weights are read).
  runner::BackendModel bm(a.backend);

  // 2. Weights and the forward.
  reference::model::Model& model = bm.build(c, reference::checkpoint::ModelWeights::load(a.weights, c), std::move(map));
  // A global-only resume rebuilds the SWA rings by encoder replay (docs/sessions.md).
  const reference::session::ResumeMode mode = global_only ? reference::session::ResumeMode::kGlobalOnly : reference::session::ResumeMode::kFull;
  reference::model::ModelState state = model.new_state();
  int64_t replayed = 0;
  if (!a.resume.empty()) {
    reference::session::LoadedSession loaded = bm.load_session(a.resume, mode);
    state = std::move(loaded.state);
    replayed = loaded.replayed_tokens;
  }
  // --dump: every step's hooked components are recorded into `cap` (hooks set after the resume,
  // so a global-only resume's encoder replay is not recorded), then written as one step file.
  runner::StepCapture cap;
  // Progress per chunk (or step) and layer: counted at each layer's output (out_stream), a hook
  // that only observes. Units: the prompt's chunks and the decode steps, each n_layers.
  const size_t chunk = a.chunk > 0 ? static_cast<size_t>(a.chunk) : std::max<size_t>(1, prompt.size());
  const int64_t prompt_chunks = static_cast<int64_t>((prompt.size() + chunk - 1) / chunk);
  const int64_t planned_steps = prompt_chunks + static_cast<int64_t>(decode.size()) + (gen ? gen->tokens : 0);
  runner::Progress progress("forward", static_cast<double>(planned_steps * c.n_layers), a.quiet);
  int64_t step_index = 0;       // the step running now (0-based)
  std::string step_name;        // "chunk 2/4", "decode 3/5", "generated step 4"
  reference::model::ForwardHooks hooks = dump ? runner::capture_hooks(cap, nullptr) : reference::model::ForwardHooks{};
  if (progress.enabled()) {
    hooks.tensor = [inner = hooks.tensor, &progress, &step_index, &step_name, n_layers = c.n_layers](
                       reference::model::Component what, int layer, reference::Tensor<float>& v) {
      if (inner) inner(what, layer, v);
      if (what != reference::model::Component::kOutStream || layer < 0 || layer >= n_layers) return;
      progress.update(static_cast<double>(step_index * n_layers + layer + 1),
                      step_name + " layer " + std::to_string(layer + 1) + "/" + std::to_string(n_layers));
    };
  }
  bm.set_hooks(hooks);  // set on the model by each step's begin_step, with the planted defect if any
  // Around each step: the backend's planted defect (at its step index), then the dump.
  auto run_step = [&](const std::vector<int64_t>& ids, const auto& fn) {
    bm.begin_step(state.pos, static_cast<int64_t>(ids.size()), step_index);
    StepRecord rec = fn();
    bm.end_step(state, step_index);
    return rec;
  };
  auto dump_step = [&](const StepRecord& rec, std::vector<int64_t> ids, std::string event) {
    if (dump) dump->add_model_step(cap, model, state, rec, ids, event);
    ++step_index;
  };
  std::vector<StepRecord> steps;
  if (a.backend != "ref") {
    std::fprintf(stderr, "dsv41 forward: backend %s (claims %s)\n", a.backend.c_str(),
                 bm.claim() == runner::Claim::kOrderVariant ? conform::kClaimOrderVariant : conform::kClaimBitExact);
  }
  const std::string how = a.chunk > 0 ? " in chunks of " + std::to_string(a.chunk) : std::string();
  if (gen) {
    const std::string mode = gen->speculative ? "speculative " + gen->speculative->str() : std::string("plain");
    char sampling[96] = "greedy";
    if (gen->sampling.temperature != 0) {
      std::snprintf(sampling, sizeof sampling, "temperature %g, top-p %g", gen->sampling.temperature,
                    gen->sampling.top_p);
    }
    const std::string from = a.resume.empty() ? std::string() : "resumed at position " + std::to_string(start) +
                                                                      " from " + a.resume + ": ";
    const std::string fed = first_token ? "first token " + std::to_string(*first_token)
                                        : std::to_string(prompt.size()) + " prompt tokens" + how;
    std::fprintf(stderr, "dsv41 forward: %s%s, then %lld generated tokens (%s, %s, seed %llu; %d threads)\n",
                 from.c_str(), fed.c_str(), static_cast<long long>(gen->tokens), mode.c_str(), sampling,
                 static_cast<unsigned long long>(gen->seed), reference::reference_threads());
  } else if (a.resume.empty()) {
    std::fprintf(stderr, "dsv41 forward: prefill of %zu tokens%s, then %zu decode steps (%d threads)\n",
                 prompt.size(), how.c_str(), decode.size(), reference::reference_threads());
  } else {
    const std::string replay = global_only ? " (global-only: SWA rings rebuilt by encoder replay of the last " +
                                                 std::to_string(replayed) + " tokens)"
                                           : std::string();
    std::fprintf(stderr, "dsv41 forward: resumed at position %lld from %s%s: %zu more tokens%s, then %zu decode "
                 "steps (%d threads)\n", static_cast<long long>(start), a.resume.c_str(), replay.c_str(),
                 prompt.size(), how.c_str(), decode.size(), reference::reference_threads());
  }
  // The prompt: one step, or chunks of --chunk tokens (the same bits, docs/sessions.md).
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t end = std::min(prompt.size(), at + chunk);
    step_name = "prefill chunk " + std::to_string(at / chunk + 1) + "/" + std::to_string(prompt_chunks) + " (tokens " +
                std::to_string(at) + ".." + std::to_string(end - 1) + ")";
    reference::model::StepOptions options;
    options.decoder_replay_rows = a.decoder_replay;
    const std::vector<int64_t> ids(prompt.begin() + static_cast<std::ptrdiff_t>(at),
                                   prompt.begin() + static_cast<std::ptrdiff_t>(end));
    steps.push_back(run_step(ids, [&] { return model.forward_chunk(state, ids, options); }));
    dump_step(steps.back(), ids, !a.resume.empty() && at == 0 ? "resume+prefill" : "prefill");
  }
  const size_t prompt_steps = steps.size();
  for (size_t k = 0; k < decode.size(); ++k) {
    step_name = "decode " + std::to_string(k + 1) + "/" + std::to_string(decode.size());
    steps.push_back(run_step({decode[k]}, [&] { return model.decode(state, decode[k]); }));
    dump_step(steps.back(), {decode[k]}, !a.resume.empty() && prompt.empty() && k == 0 ? "resume+decode" : "decode");
  }
  std::vector<int64_t> tokens = prompt;  // the ids fed
  tokens.insert(tokens.end(), decode.begin(), decode.end());
  runner::GenerationRun generated;
  if (gen) {
    // --dump: a decode step per plain token, a verify step per speculative round (its draft's
    // dspark_* items are dropped: the dump records target steps; docs/port-dump.md).
    runner::GenerateObserver observer;
    bool resumed_first = steps.empty() && !a.resume.empty();  // the session's first step is a generated one
    int64_t generated_steps = 0;
    // A planted defect fires in a plain generated step (one token), never in a speculative round
    // (its draft and verify, as in the runner: scenarios/runner/rounds.h).
    bm.begin_step(state.pos, 1, gen->speculative ? -1 : step_index);
    observer.before_step = [&] {
      bm.begin_step(state.pos, 1, gen->speculative ? -1 : step_index);
      if (dump) cap = runner::StepCapture{};
      step_name = (gen->speculative ? "speculative round " : "generated token ") + std::to_string(++generated_steps);
    };
    observer.after_step = [&](const StepRecord& rec, const std::vector<int64_t>& ids, int64_t kept) {
      bm.end_step(state, gen->speculative ? -1 : step_index);
      ++step_index;
      if (!dump) return;
      const std::string event = gen->speculative ? conform::kPortDumpVerify : resumed_first ? "resume+decode" : "decode";
      resumed_first = false;
      dump->add_model_step(cap, model, state, rec, ids, event, kept);
    };
    generated = generate(model, state, prompt_steps > 0 ? &steps.back().logits : nullptr, first_token, *gen, observer);
    steps.insert(steps.end(), generated.steps.begin(), generated.steps.end());
    tokens.insert(tokens.end(), generated.fed.begin(), generated.fed.end());
  }

  progress.finish(std::to_string(step_index) + " steps");

  // NaN or Inf logits answer nothing (the argmax of all-NaN logits is meaningless): an error,
  // before any output is finished. Usually the weights hold non-finite values.
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::vector<float>& rows = steps[k].all_logits.rank() == 2 ? steps[k].all_logits.data() : steps[k].logits;
    const auto bad = std::count_if(rows.begin(), rows.end(), [](float v) { return !std::isfinite(v); });
    if (bad > 0) {
      DSV41_FAIL("weights '", a.weights, "': step ", k, " gives ", bad, " non-finite logits of ", rows.size(),
                 " (NaN or Inf: do the weights hold non-finite values?)");
    }
  }
  // A planted defect that never applied: the run would pass for the defect's (exit 2, nothing written).
  if (const std::string missing = bm.missing_evidence(); !missing.empty()) DSV41_FAIL("--backend: ", missing);
  if (dump) {
    dump->finish();
    std::fprintf(stderr, "dsv41 forward: wrote the port dump %s (%zu steps)\n", a.dump.c_str(), steps.size());
  }
  // 3. The output file (docs/forward-output.md). /logits: the prompt's last position (from its
  // last chunk), however the prompt was chunked, then one row per later fed position (a decode
  // step's, a speculative round's kept rows).
  if (w) {
    std::vector<float> logits;
    if (prompt_steps > 0) logits = steps[prompt_steps - 1].logits;
    for (size_t k = prompt_steps; k < steps.size(); ++k) {
      const std::vector<float>& rows = steps[k].all_logits.rank() == 2 ? steps[k].all_logits.data() : steps[k].logits;
      logits.insert(logits.end(), rows.begin(), rows.end());
    }
    w->write("/logits", logits, {static_cast<int64_t>(logits.size()) / c.vocab_size, c.vocab_size});
    w->write("/tokens", tokens, {static_cast<int64_t>(tokens.size())});
    write_per_layer<int32_t>(*w, "/topk", steps, &StepRecord::topk, -1);
    write_per_layer<uint8_t>(*w, "/candidates", steps, &StepRecord::candidates, 0);
    write_per_layer<int64_t>(*w, "/engram", steps, &StepRecord::engram_ids, -1);
    write_per_layer<int32_t>(*w, "/experts", steps, &StepRecord::experts, -1);
    std::optional<reference::model::ModelState> host;  // a device backend's caches, read on the host
    if (bm.device()) host = bm.host_state(state);
    write_caches(*w, host ? *host : state, c, bm.host_ops());
    w->attr("/", "tool", std::string("dsv41 ") + DSV41_VERSION_STRING);
    w->attr("/", "git_commit", DSV41_GIT_COMMIT_STRING);
    w->attr("/", "config_hash", reference::config_hash(c));
    w->attr("/", "config_json", reference::to_json_string(c, -1));
    w->attr("/", "weights", a.weights);
    w->attr("/", "backend", a.backend);
    w->attr("/", "command_line", command_line);
    w->attr("/", "prompt_len", static_cast<int64_t>(prompt.size()));
    w->attr("/", "n_decode", static_cast<int64_t>(decode.size()));
    w->attr("/", "start_pos", start);
    if (!a.resume.empty()) w->attr("/", "resumed_from", a.resume);
    if (gen) {
      w->attr("/", "n_generate", gen->tokens);
      if (first_token) w->attr("/", "first_token", *first_token);
      runner::write_generation(*w, generated, *gen, c);
      if (gen->speculative) std::fprintf(stderr, "dsv41 forward: %s\n", runner::speculative_summary(generated, *gen).c_str());
      std::fprintf(stderr, "dsv41 forward: pending token %lld (emitted, not yet run by the target)\n",
                   static_cast<long long>(generated.pending));
    }
  }
  // The session state, before the output is committed: if saving fails, no output is left.
  if (!a.save_state.empty()) {
    bm.save_session(a.save_state, state, !a.drop_swa);
    std::fprintf(stderr, "dsv41 forward: saved the session at position %lld to %s%s\n",
                 static_cast<long long>(state.pos), a.save_state.c_str(), a.drop_swa ? " (without SWA rings)" : "");
    if (gen) {
      std::fprintf(stderr, "dsv41 forward: continue the generation with --resume %s --first-token %lld\n",
                   reports::shell_quote(a.save_state).c_str(), static_cast<long long>(generated.pending));
    }
  }
  if (w) {
    w->commit();
    std::fprintf(stderr, "dsv41 forward: wrote %s\n", a.output.c_str());
  }
  return runner::kExitOk;
}


}  // namespace

Verb add_forward_verb(CLI::App& parent) {
  auto args = std::make_shared<ForwardArgs>();
  CLI::App* app = parent.add_subcommand("forward", "run the reference forward (prefill + decode steps) and write an HDF5 file");
  app->add_option("--backend", args->backend,
                  "the ops the model runs on (default ref): ref, cuda-exact, cuda, ref-order:<variant>[:<defect>], "
                  "mutant:<defect> (dsv41 run --list describes them; docs/forward.md); a --dump records it and its claim")
      ->default_str("ref");
  app->add_option("--config", args->config, "config.json path or preset (tiny, full)")->required();
  app->add_option("--weights", args->weights, "safetensors file with the official tensor names")->required();
  app->add_option("--prompt", args->prompt,
                  "prompt ids: comma-separated, or @FILE with one id per line (required unless --first-token)");
  app->add_option("--decode", args->decode, "ids fed one per decode step (not sampled): comma-separated or @FILE");
  app->add_option("--generate", args->generate,
                  "generate N tokens after the prompt (greedy unless --sampling; docs/forward.md)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app->add_option("--speculative", args->speculative,
                  "with --generate: speculative rounds drafted by the DSpark blocks; K (= fixed:K), fixed:K, "
                  "threshold:TAU or survival:S (the verify-length policy)");
  app->add_option("--sampling", args->sampling,
                  "with --generate: T[,TOP_P] temperature (0: greedy) and top-p (default 1) of the draft and the "
                  "target");
  seed_option(app->add_option("--seed", args->seed, "with --generate: the seed every draw derives from (default 0; docs/forward.md)"))
      ->each([args](const std::string&) { args->seed_given = true; });
  app->add_option("--first-token", args->first_token,
                  "with --resume and --generate: the pending token a generating run printed (emitted, not yet run); "
                  "the generation continues after it")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app->add_option("--token-map", args->token_map, "Engram compressed id of every vocab entry, one per line (default: id*C/V)");
  app->add_option("--threads", args->threads, "worker threads (results do not depend on it; default: all cores)")
      ->check(CLI::Range(1, 1024));
  app->add_option("-o,--output", args->output, "output HDF5 file (written atomically; -o or --dump is required)");
  app->add_option("--dump", args->dump,
                  "write a port dump of the run to DIR (new or empty): one safetensors file per step and "
                  "dump.json; or, for a path ending in .h5, to one new HDF5 file (docs/port-dump.md)");
  app->add_option("--decoder-replay", args->decoder_replay,
                  "SWA decoder replay: layers after the candidate source run only the last N rows of each prompt "
                  "step (approximate by design; docs/sessions.md)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app->add_option("--chunk", args->chunk, "run the prompt in chunks of N tokens (the same bits as one step)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app->add_option("--save-state", args->save_state,
                  "after the run, save the session state to FILE (docs/session-store.md; written atomically)");
  app->add_flag("--drop-swa", args->drop_swa, "with --save-state: save the global state only, without the SWA rings");
  app->add_flag("-q,--quiet", args->quiet, "no progress on stderr (scenarios/runner/progress.h)");
  app->add_option("--resume", args->resume,
                  "continue the session saved in FILE: --prompt holds the next tokens, run at the saved position");
  app->add_option("--resume-mode", args->resume_mode,
                  "full (the file's SWA rings; default) or global-only (rebuild them by encoder replay of the "
                  "last window_size tokens: approximate by design)")
      ->check(CLI::IsMember({"full", "global-only"}))
      ->each([args](const std::string&) { args->resume_mode_given = true; });
  app->add_option("--start-pos", args->start_pos,
                  "the position the session is at (checked: a mismatch with --resume's saved position is an error)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  return {app, [args, &parent] {
            // The options as given (in declaration order), values quoted where a shell needs it.
            std::string cmd = "dsv41 forward";
            for (const CLI::Option* o : parent.get_subcommand("forward")->get_options()) {
              if (o->count() > 0 && o->get_name() != "--help") {
                cmd += " " + o->get_name();
                if (o->get_type_size() != 0) cmd += " " + reports::shell_quote(o->as<std::string>());  // not a flag
              }
            }
            return run_forward(*args, cmd);
          }};
}

}  // namespace dsv41::scenarios::cli
