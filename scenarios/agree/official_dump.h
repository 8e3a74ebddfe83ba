// scenarios/agree/official_dump.h
//
// The importer of official runs (issue 31): an official run in the oracle folder layout
// (scenarios/agree/oracle_run.h: golden/oracle, golden/runs/*) turned into a port dump
// (docs/port-dump.md) that `dsv41 conform` judges under the "order-variant" claim (the official
// code sums in torch's order), with the official code's known defects named, not failed:
//
//   mapping      every official item the run holds at EVERY step, under its dsv41 component
//                name (official_component_items: the one table of official names, which the
//                agreement check's forcing reads too): the layer streams and mixes, attn_out,
//                ffn_out, index_score, the selections (indexer_topk as compressed positions, the
//                official window offset removed, ascending, -1 padded to min(index_topk, N)),
//                Engram ids and output, the logits, the compressor's pending group; in_stream
//                and in_pre are the official layer input (embed, or layer N-1's out_stream) and
//                pre (layer N-1's next_pre; layer 0 the identity pre), copied, not computed.
//   left out     an item the run holds at some steps only (coverage is per (component, layer),
//                the same for every step): e.g. the caches of decode/final_state, engram_out
//                held in decode only; ImportSummary::left_out names each with the reason.
//   known        the official decode's "stale index keys" defect (docs/agreement.md, "Known
//                differences"): derived from the config and the positions (stale_index_keys),
//                never from the data; written next to the dump as a conform tolerance file of
//                waivers (docs/conform.md "Waivers"), one per affected (component, layer, step),
//                each naming the difference.
//
// Example:
//   OracleRun run = OracleRun::open("golden/runs/w16_r2early_p520");
//   ImportSummary s = import_official(run, "w16.dump", "dsv41 import-official ...");
//   // s.conform_command: dsv41 conform w16.dump --config ... --tolerances w16.dump.known_differences.json
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/ops/config.h"
#include "scenarios/agree/oracle_run.h"

namespace dsv41::scenarios::agree {

// One dsv41 component (reference/model/hooks.h) and the official per-layer item holding it
// ("layerNN/<item>" under a step's prefix). The single table of official names.
struct OfficialItem {
  const char* component;  // "topk"
  const char* item;       // "indexer_topk"
};
const std::vector<OfficialItem>& official_component_items();
// The official item of `component` ("indexer_topk" for "topk"); a dsv41::Error for a component
// the official run does not record under a layer.
std::string official_item(const std::string& component);

// The name under which the importer reports the official decode's stale index keys.
inline constexpr const char* kStaleIndexKeys = "official code: stale index keys in decode";

// A known difference of the official code at one (component, layer, step) of the dump.
struct KnownDifference {
  std::string name;       // kStaleIndexKeys
  std::string component;  // "index_scores" or "topk"
  int layer = -1;
  int64_t step = 0;       // the dump's step (0 the prefill, k + 1 decode step k)
  std::string reason;     // why, with the rule (written into the waiver)
};

// The (layer, step)s where the official indexer scores against a stale key cache, derived from
// the config and each step's (start_pos, tokens) alone (docs/agreement.md): an indexer layer
// (Full or Reindex) reads the key cache published last; a Full layer publishes its own only at a
// step where its compressor completes a group, (start + T) / ratio > start / ratio; an indexer
// whose last publisher is not its kv owner scores stale keys. Steps with no compressed position
// yet (N = 0) score nothing. Two entries per (layer, step): index_scores and topk.
std::vector<KnownDifference> stale_index_keys(const reference::ModelConfig& c,
                                              const std::vector<std::pair<int64_t, int64_t>>& steps);
std::vector<KnownDifference> known_differences(const OracleRun& run);

// The conform tolerance file of `known`: {"waivers": [{"component", "layers", "steps", "reason"}]},
// one waiver per entry, layers and steps [x, x].
std::string known_differences_json(const std::vector<KnownDifference>& known);

// What an import wrote and left out.
struct LeftOut {
  std::string what;  // "engram_out@1", "decode/final_state"
  std::string why;
};
struct ImportSummary {
  std::string dump;             // the dump's path (a directory, or a .h5 file)
  std::string waivers_file;     // DUMP.known_differences.json
  std::string token_map_file;   // DUMP.token_map.txt, "" when the run's map is the default
  int64_t steps = 0;
  std::map<std::string, std::vector<int>> components;  // what the dump holds, as its manifest
  std::vector<LeftOut> left_out;
  std::vector<KnownDifference> known;  // those of the components the dump holds (each one waiver)
  std::string conform_command;  // the command that judges it
};

// Writes the dump of `run` to `dump_path` (directory, or HDF5 when it ends in ".h5"; new or empty,
// as PortDumpWriter requires) with the claim "order-variant", then the waiver file and, when the
// run's Engram token map is not the default one, the token map beside it. command_line goes into
// the manifest. Errors (a missing item, a shape that does not fit) name the run, the file and the
// item.
ImportSummary import_official(const OracleRun& run, const std::string& dump_path, const std::string& command_line);

// The summary as the verb prints it (components, left out with reasons, known differences, the
// conform command).
std::string format_import_summary(const ImportSummary& s);

}  // namespace dsv41::scenarios::agree
