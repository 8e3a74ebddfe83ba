// scenarios/conform/port_dump.h
//
// The port dump (docs/port-dump.md, "dsv41 port dump, version 2"): what a port writes of a run so
// dsv41 can judge it, in one of two containers holding the same information:
//   directory  one safetensors file per step, step_000123.safetensors, and a manifest dump.json
//              (format, version, config and its hash, the steps, the components present);
//   HDF5       one file (a path ending in ".h5"): the manifest as the root attribute "manifest",
//              one group per step, /step_000123, one dataset per key (scenarios/conform/port_dump_h5.cc).
// Keys: "layerNN.<component>" (NN two digits, the component names of reference/model/hooks.h),
// "model.<component>" for layer -1 (embed, final_norm_out, logits, ...), "layerNN.cache.<kind>"
// for a cache's packed bytes (reference::model::CacheView) with "layerNN.cache.<kind>.positions", and
// "step.tokens" / "step.positions" for the step's ids and positions.
//
// PortDumpWriter writes the reference's own dump from StepCaptures (scenarios/runner/capture.h);
// read_port_dump reads any dump (either container) and validates it against the manifest, the
// component table and the config: every problem is a dsv41::Error naming the file (and the group),
// the key and the reason. A step of a speculative round (event "verify") runs k + 1 tokens and
// keeps the first `kept` of them: the next step starts at start_pos + kept.
//
// Example:
//   PortDumpWriter w("dump", config, "weights.safetensors", "dsv41 forward ...");
//   w.add_step(capture, {1, 2, 3}, "prefill");
//   w.finish();
//   PortDump d = read_port_dump("dump");           // or "dump.h5", written by PortDumpWriter("dump.h5", ...)
//   const reference::checkpoint::safetensors::Entry* e = d.steps[0].find(3, "attn_out");   // [T, dim] BF16
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/output_file.h"
#include "reference/ops/config.h"
#include "reference/checkpoint/safetensors.h"
#include "scenarios/runner/capture.h"

namespace dsv41::reports {
class H5Writer;
}

namespace dsv41::scenarios::conform {

inline constexpr const char* kPortDumpFormat = "dsv41 port dump";
inline constexpr int kPortDumpVersion = 2;      // written; read_port_dump reads 1 and 2
inline constexpr const char* kPortDumpManifest = "dump.json";
inline constexpr const char* kPortDumpVerify = "verify";  // the event of a speculative round's verify step

// Whether a dump path names the HDF5 container (it ends in ".h5").
bool is_h5_dump_path(const std::string& path);

// "layer03.attn_out", "model.logits" (layer -1).
std::string dump_key(int layer, const std::string& component);
// "step_000123.safetensors" (the directory form); dump_step_group: "step_000123" (the HDF5 form).
std::string dump_step_file(int64_t step);
std::string dump_step_group(int64_t step);
// The safetensors dtype a component is stored as (BF16, F32, I32, I64, U8), from the component table.
reference::DType dump_dtype(const std::string& component);

struct PortDumpStep {
  int64_t index = 0;                // 0, 1, ... in run order
  int64_t start_pos = 0;            // the position of its first token
  std::vector<int64_t> tokens;      // [T] the ids fed
  std::vector<int64_t> positions;   // [T] start_pos, start_pos + 1, ...
  int64_t kept = 0;                 // the tokens the run keeps (= tokens.size() except "verify" steps)
  std::string event;                // "prefill", "decode", "resume+prefill", "verify", ... (docs/port-dump.md)
  std::string file;                 // where the step is: the step file's path, or "DUMP.h5:/step_000123"
  std::map<std::string, reference::checkpoint::safetensors::Entry> tensors;  // by key, as stored
  std::map<std::string, std::string> metadata;                   // the file's __metadata__

  // The stored tensor of (layer, component); nullptr when the dump does not hold it.
  const reference::checkpoint::safetensors::Entry* find(int layer, const std::string& component) const;
};

inline constexpr const char* kClaimBitExact = "bit-exact";
inline constexpr const char* kClaimOrderVariant = "order-variant";

struct PortDump {
  std::string dir;  // the dump's path: a directory, or an HDF5 file
  bool h5 = false;  // the HDF5 container
  int version = 0;
  std::string config_hash;
  reference::ModelConfig config;
  std::string tool, weights, token_map, command_line;
  // What the port claims (docs/conform.md "Claims"): kClaimBitExact (the default when the manifest
  // has no "claim") or kClaimOrderVariant.
  std::string claim;
  // Under order-variant, the accumulation the port's sums use (scenarios/judge/derived_bounds.h
  // "Accumulation"): "fp32" (the default when the manifest has no "accumulation") or
  // "fp8-tensor-core" (its fp8 linears on Hopper's fp8 tensor cores).
  std::string accumulation;
  std::string backend;  // the runner backend that wrote it (`forward --backend`); "": not recorded
  std::map<std::string, std::vector<int>> components;  // component -> its layers, in every step
  std::vector<std::string> not_covered;                // table components the dump does not hold
  std::vector<PortDumpStep> steps;
};

// A cache as an engine keeps it (docs/port-dump.md "Cache layouts", scenarios/conform/cache_layouts.h):
// written as given with its layout in the step's metadata, read back into canonical entries by
// read_port_dump.
struct LaidOutCache {
  int layer = -1;
  std::string kind;                         // "compressed_kv", "index_keys", "window_kv", ...
  std::vector<int64_t> shape;               // the engine's: [entries, entry_bytes], [num_blocks, block_size, entry_bytes], ...
  std::vector<uint8_t> bytes;               // U8, that shape
  // Metadata without the key's prefix: "format", "dim", and "layout", "block_size", "entries",
  // "first" as the layout needs them.
  std::map<std::string, std::string> meta;
  std::vector<int32_t> block_table;         // the paged layouts': [blocks]
  std::vector<int64_t> positions;           // optional: [valid entries], canonical order
};

// Reads and validates a dump, a directory or an HDF5 file (docs/port-dump.md, "Validation").
PortDump read_port_dump(const std::string& path);

// Writes a dump. Directory (`dir` not ending in ".h5"): step files as added (each atomic) and
// the manifest in finish(), all in a temp directory beside `dir` that finish() renames onto
// `dir` (output::AtomicDirectory); `dir` must not exist or be empty (so no stale step file is
// mistaken for part of the dump), and stays so until the dump is complete. HDF5 (`dir` ending in ".h5", which must not exist): everything
// goes to a temp file that finish() renames into place (reports::H5Writer), so the file appears
// whole or not at all.
class PortDumpWriter {
 public:
  // token_map: where the Engram token map came from (a file, or "default"); recorded in the manifest.
  PortDumpWriter(std::string dir, const reference::ModelConfig& config, std::string weights,
                 std::string token_map, std::string command_line);
  // One step: the capture (items, logits, caches; capture.start_pos / tokens set), its ids and
  // its session event. Steps must follow each other (start_pos = the last step's start_pos + kept).
  // kept: the tokens the run keeps of this step, 1 .. T (-1: all T); fewer only for "verify".
  // laid_out: caches as their engine keeps them (LaidOutCache), each read back as the reader will
  // before the step is written (a dsv41::Error naming the key for bytes that do not parse).
  void add_step(const runner::StepCapture& cap, const std::vector<int64_t>& tokens, const std::string& event,
                int64_t kept = -1, const std::vector<LaidOutCache>& laid_out = {});
  // A step a Model just ran, with `cap` the capture its hooks (capture_hooks) filled: adds the
  // record's Engram ids and logits and every cache of `state` (cache_views, then the compressors'
  // pending groups and the DSpark rings), writes the step and clears `cap` for the next one. A
  // verify step (rec.all_logits [T, vocab]) records the logits of every row; `state` is the one
  // after the round's rollback.
  void add_model_step(runner::StepCapture& cap, const reference::model::Model& model, const reference::model::ModelState& state,
                      const reference::model::StepRecord& rec, const std::vector<int64_t>& tokens, const std::string& event,
                      int64_t kept = -1);
  // The manifest's "claim" (kClaimBitExact unless set): what a port declares of its sums.
  void set_claim(const std::string& claim);
  // The manifest's "accumulation" ("fp32" unless set; judge::accumulation_from_name's names).
  void set_accumulation(const std::string& accumulation);
  // The claim set so far ("": none yet; the manifest then says kClaimBitExact).
  const std::string& claim() const { return claim_; }
  // The runner backend that ran the steps (scenarios/runner/backend.h names: `dsv41 forward
  // --backend`, dsv41.Model(backend=)): the manifest's "backend", and the claim from
  // runner::backend_claim (bitexact: kClaimBitExact, order-variant: kClaimOrderVariant), unless
  // kClaimOrderVariant was set before (a bit-exact backend meets it), and its accumulation
  // (runner::backend_accumulation: cuda's fp8-tensor-core) unless one was set. A dsv41::Error for an
  // approximate backend (a dump claims no such thing), for kClaimBitExact set before and an
  // order-variant backend, and for another backend than one set before (one dump, one backend).
  void set_backend(const std::string& backend);
  const std::string& backend() const { return backend_; }
  // The manifest's "tool" (default "dsv41 <version>"): who produced the values, e.g. an imported
  // official run (scenarios/agree/official_dump.h).
  void set_tool(const std::string& tool) { tool_ = tool; }
  // Writes the manifest (and closes the HDF5 file): the dump complete in its temp form, nothing
  // published. A writer publishing companions with the dump (forward --save-state, -o) prepares
  // every output first and commits them only when every one was written.
  void prepare();
  // prepare() (when not done), then the rename that publishes the dump.
  void finish();
  ~PortDumpWriter();
  PortDumpWriter(PortDumpWriter&&) = delete;

 private:
  std::string dir_;
  std::unique_ptr<output::AtomicDirectory> dir_out_;  // the directory form: its temp directory
  std::unique_ptr<reports::H5Writer> h5_;  // the HDF5 container; null: the directory form
  reference::ModelConfig config_;
  std::string weights_, token_map_, command_line_;
  std::string claim_;
  std::string accumulation_;
  bool prepared_ = false;
  std::string backend_;  // "": not recorded (a port's own writer)
  std::string tool_;
  std::map<std::string, std::vector<int>> components_;
  std::vector<PortDumpStep> steps_;  // metadata only (no tensors kept)
};

}  // namespace dsv41::scenarios::conform
