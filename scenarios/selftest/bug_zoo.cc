// scenarios/selftest/bug_zoo.cc
//
// The zoo's table (scenarios/selftest/bug_zoo.h, docs/selftest.md), its scenario, the dump writer (the
// code path of `dsv41 forward --dump`: capture_hooks, finish_capture, PortDumpWriter) and the dump
// transformations of the storage bugs. The ops-level bugs are in scenarios/defects/bug_zoo_ops.cc.
#include "scenarios/selftest/bug_zoo.h"

#include <filesystem>
#include <map>

#include "base/data_dir.h"
#include "formats/cache_format.h"
#include "base/error.h"
#include "reference/model/kv_cache.h"
#include "reference/model/model.h"
#include "reference/checkpoint/safetensors.h"
#include "scenarios/runner/capture.h"
#include "scenarios/conform/conform.h"
#include "scenarios/conform/port_dump.h"

namespace dsv41::scenarios::selftest {
namespace {

namespace st = reference::checkpoint::safetensors;

// Rewrites every step file of the dump: edit(entries) on its tensors, metadata kept.
template <typename F>
void rewrite_steps(const std::string& dir, F edit) {
  for (int64_t step = 0;; ++step) {
    const std::string path = dir + "/" + conform::dump_step_file(step);
    if (!std::filesystem::exists(path)) break;
    const st::SafetensorsFile f = st::SafetensorsFile::read(path);
    std::vector<st::Entry> entries;
    for (const std::string& n : f.names()) entries.push_back(f.get(n));
    edit(entries);
    st::write(path, entries, f.metadata());
  }
}

// Storage: every indexer-key cache written block-planar (pages of 8 entries: their value bytes,
// then their scale bytes), which a token-interleaved reader misreads (vllm#40991, vllm#50576).
void index_keys_block_planar(const std::string& dir, const reference::ModelConfig& c) {
  rewrite_steps(dir, [&](std::vector<st::Entry>& entries) {
    for (st::Entry& e : entries) {
      const std::string suffix = ".cache.index_keys";
      if (e.name.size() < suffix.size() || e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      reference::model::CacheView v;
      v.kind = "index_keys";
      v.format = formats::CacheFormat::kIndexKeysFp4;
      v.dim = c.index_head_dim;
      v.entry_bytes = formats::entry_bytes(v.format, static_cast<int>(v.dim));
      v.entries = static_cast<int64_t>(e.bytes.size()) / v.entry_bytes;
      v.bytes = e.bytes;
      e.bytes = conform::to_block_planar(v, 8);
    }
  });
}

ZooBug ops_bug(std::string name, std::string description, std::string origin, std::string component, int layer,
               int64_t step, bool ci) {
  ZooBug b;
  b.name = std::move(name);
  b.description = std::move(description);
  b.origin = std::move(origin);
  b.kind = ZooKind::kOps;
  b.expected_component = std::move(component);
  b.expected_layer = layer;
  b.expected_step = step;
  b.ci = ci;
  b.make_ops = defects::zoo_ops_factory(b.name);
  DSV41_CHECK(b.make_ops != nullptr, "bug zoo: no ops for '", b.name, "'");
  return b;
}

std::vector<ZooBug> build_zoo() {
  std::vector<ZooBug> z;
  // Caches and their formats (docs/formats.md).
  z.push_back(ops_bug("kv_quant_before_rope", "the window KV is FP8-quantised before its RoPE, not after",
                      "format pitfall (semantics.md: RoPE, then the window_kv QDQ)", "cache.window_kv", 0, 0, true));
  z.push_back(ops_bug("e8m0_scale_floor", "window KV E8M0 block scales rounded down (floor) instead of up (ceil)",
                      "format pitfall (formats/qdq.h: fast_round_scale is a ceil)", "cache.window_kv", 0, 0, true));
  z.push_back(ops_bug("e2m1_ties_away", "indexer-key E2M1 codes round ties away from zero instead of to even",
                      "format pitfall (formats/minifloat.h: E2M1 is round-to-nearest-even)", "cache.index_keys", 2, 0,
                      false));
  z.push_back(ops_bug("swapped_nibbles", "compressed-KV FP4 written with the two nibbles of each byte swapped",
                      "format pitfall (formats/packed.h: element 2i in the low nibble)", "cache.compressed_kv", 2, 0,
                      true));
  {
    ZooBug b;
    b.name = "index_keys_block_planar";
    b.description = "indexer-key cache written block-planar (pages of 8 entries), read token-interleaved";
    b.origin = "ports.md §2.5 (vllm#40991, vllm#50576)";
    b.kind = ZooKind::kDump;
    b.expected_component = "cache.index_keys";
    b.expected_layer = 2;
    b.expected_step = 0;
    b.ci = true;
    b.transform_dump = index_keys_block_planar;
    z.push_back(std::move(b));
  }
  // The indexer and the sparse selection.
  z.push_back(ops_bug("indexer_rope_pairs", "indexer RoPE on (i, i + rd/2) pairs instead of adjacent (2i, 2i+1) pairs",
                      "ports.md §2.2 (sglang#13530)", "cache.index_keys", 2, 0, false));
  z.push_back(ops_bug("topk_window_offset", "compressed top-k indices offset by the window rows' count minus one",
                      "ports.md §2.1 (sglang#12583)", "attn_out", 2, 0, true));
  z.push_back(ops_bug("topk_tie_higher_position", "top-k prefers the higher position among equal scores",
                      "format pitfall (docs/indexer.md: the lower position wins a tie)", "topk", 6, 1, false));
  z.push_back(ops_bug("reuse_wrong_owner", "a Reuse layer takes its kv owner's top-k, not its top-k owner's",
                      "format pitfall (docs/indexer.md: Reuse owners)", "attn_out", 9, 0, false));
  z.push_back(ops_bug("compressed_position_off_by_one", "compressed KV entries rotated at group*ratio + 1",
                      "format pitfall (semantics.md: a compressed entry's position)", "cache.compressed_kv", 2, 0,
                      false));
  z.push_back(ops_bug("newest_block_not_pinned", "candidate blocks by score alone: the newest block is not pinned",
                      "format pitfall (docs/indexer.md: the newest block is always kept)", "candidates", 6, 1, false));
  {
    ZooBug b;
    b.name = "global_only_window_not_rebuilt";
    b.description = "a global-only cache hit at the resume leaves the window rings as fresh (zero) allocations";
    b.origin = "ports.md §2.7 (ROCm/ATOM#1417)";
    b.kind = ZooKind::kDriver;
    b.expected_component = "cache.window_kv";
    b.expected_layer = 0;
    b.expected_step = zoo_scenario().resume_step;
    b.ci = false;
    b.driver_zero_window_at_resume = true;
    z.push_back(std::move(b));
  }
  z.push_back(ops_bug("rope_tables_swapped", "compressed layers use the window layers' RoPE theta/YaRN and vice versa",
                      "ports.md §2.8 (mlx-lm#1189)", "cache.window_kv", 0, 0, false));
  z.push_back(ops_bug("compressor_partial_group_lost", "a prefill chunk starting mid-group loses the pending rows",
                      "ports.md §2.6 (vllm-ascend fork #76)", "cache.compressed_kv", 2, 1, false));
  // mHC, Engram, attention, MoE, batching.
  z.push_back(ops_bug("mhc_pre_not_lagged", "each sublayer applies its own mixes' pre, not the previous one's",
                      "format pitfall (docs/mhc.md: pre is lagged by one sublayer)", "attn_in", 0, 0, true));
  z.push_back(ops_bug("sinkhorn_one_short", "the mHC Sinkhorn normalisation runs one iteration too few",
                      "format pitfall (docs/mhc.md: hc_sinkhorn_iters)", "hc_attn_comb", 0, 0, true));
  z.push_back(ops_bug("sink_in_numerator", "the attention sink's share is added to the output, not only the denominator",
                      "format pitfall (docs/attention.md: sink in the denominator only)", "attn_out", 0, 0, true));
  z.push_back(ops_bug("engram_multiplier_off_by_one", "every Engram n-gram hash multiplier one too high",
                      "format pitfall (docs/engram.md: hash multipliers)", "engram_ids", 1, 0, true));
  z.push_back(ops_bug("softmax_routing", "MoE gate scores by softmax instead of sqrt(softplus)",
                      "format pitfall (config score_func sqrtsoftplus)", "experts", 0, 0, false));
  z.push_back(ops_bug("batch_dependent_norm", "RMSNorm's reduction order depends on the rows run together",
                      "ports.md §2.13 (vllm#53257)", "ffn_in", 0, 0, false));
  return z;
}

}  // namespace

const char* name(ZooKind k) {
  switch (k) {
    case ZooKind::kOps: return "ops";
    case ZooKind::kDump: return "dump";
    case ZooKind::kDriver: return "driver";
  }
  return "?";
}

const ZooScenario& zoo_scenario() {
  static const ZooScenario s = [] {
    ZooScenario z;
    for (int64_t i = 0; i < 70; ++i) z.prompt.push_back((i * 37 + 11) % 1024);
    z.chunks = {45, 25};
    z.decode = {5, 723, 100};
    z.resume_step = 3;  // the second decode step (position 71)
    return z;
  }();
  return s;
}

const std::vector<ZooBug>& bug_zoo() {
  static const std::vector<ZooBug> z = build_zoo();
  return z;
}

const ZooBug& zoo_bug(const std::string& name) {
  std::string names;
  for (const ZooBug& b : bug_zoo()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  DSV41_FAIL("unknown zoo bug '", name, "' (the zoo: ", names, ")");
}

std::string builtin_oracle_file(const std::string& file) {
  return dsv41::data::file("golden/oracle/" + file);
}

SelftestModel load_selftest_model(const std::string& config_path, const std::string& weights_path) {
  const std::string cp = config_path.empty() ? builtin_oracle_file("config.json") : config_path;
  const std::string wp = weights_path.empty() ? builtin_oracle_file("weights.safetensors") : weights_path;
  reference::ModelConfig c = reference::load_config_file(cp);
  reference::checkpoint::ModelWeights w = reference::checkpoint::ModelWeights::load(wp, c);
  return {wp, std::move(c), std::move(w)};
}

std::string zoo_location(const std::string& component, int layer, int64_t step) {
  return component + "@" + std::to_string(layer) + " step " + std::to_string(step);
}

bool dumps_differ(const std::string& a, const std::string& b) {
  namespace st = reference::checkpoint::safetensors;
  for (int64_t step = 0;; ++step) {
    const std::string pa = a + "/" + conform::dump_step_file(step), pb = b + "/" + conform::dump_step_file(step);
    if (!std::filesystem::exists(pa) || !std::filesystem::exists(pb)) {
      return std::filesystem::exists(pa) != std::filesystem::exists(pb);
    }
    const st::SafetensorsFile fa = st::SafetensorsFile::read(pa), fb = st::SafetensorsFile::read(pb);
    if (fa.names() != fb.names()) return true;
    for (const std::string& n : fa.names()) {
      if (fa.get(n).bytes != fb.get(n).bytes) return true;
    }
  }
}

void write_scenario_dump(const std::string& dir, const reference::ModelConfig& c, const std::string& weights_path,
                         const reference::checkpoint::ModelWeights& weights, const ZooScenario& s,
                         const reference::seam::Ops& ops, const std::string& producer, const DumpDefects& defects) {
  reference::model::Model model(c, weights, reference::model::default_token_map(c), ops);
  conform::PortDumpWriter dump(dir, c, weights_path, "default", producer);
  reference::model::ModelState state = model.new_state();
  runner::StepCapture cap;
  bool fired_here = false;
  bool* fired = defects.fired != nullptr ? defects.fired : &fired_here;
  int64_t index = 0, position = 0;
  auto step = [&](const std::vector<int64_t>& ids, const std::string& event) {
    const int64_t T = static_cast<int64_t>(ids.size());
    model.set_hooks(defects.mutation != nullptr
                        ? defects::mutated_hooks(*defects.mutation, runner::capture_hooks(cap, nullptr), c, position, T,
                                                 index, fired)
                        : runner::capture_hooks(cap, nullptr));
    const reference::model::StepRecord rec = model.forward_chunk(state, ids);
    // A cache mutation flips a stored bit after its step: the dump holds it, later steps read it.
    if (defects.mutation != nullptr && defects.mutation->is_cache() && defects::mutate_cache(*defects.mutation, index, state)) {
      *fired = true;
    }
    dump.add_model_step(cap, model, state, rec, ids, event);
    position += T;
    ++index;
  };
  int64_t at = 0;
  for (int64_t n : s.chunks) {
    step(std::vector<int64_t>(s.prompt.begin() + at, s.prompt.begin() + at + n), "prefill");
    at += n;
  }
  DSV41_CHECK(at == static_cast<int64_t>(s.prompt.size()), "dump scenario: chunks cover ", at, " of ",
              s.prompt.size(), " prompt tokens");
  for (int64_t token : s.decode) {
    const bool resume = index == s.resume_step;
    // A full resume is a continuation (bit-exact, docs/sessions.md). The driver bug: a global-only
    // cache hit that does not rebuild the window rings (fresh, zero-filled).
    if (resume && defects.zero_window_at_resume) {
      for (reference::model::LayerState& ls : state.layers) {
        reference::Tensor<uint8_t> host = model.ops().download(std::move(ls.window_kv.bytes));
        std::fill(host.data().begin(), host.data().end(), uint8_t{0});
        ls.window_kv.bytes = model.ops().upload(std::move(host));
      }
    }
    step({token}, resume ? "resume+decode" : "decode");
  }
  dump.finish();
}

void write_zoo_dump(const std::string& dir, const reference::ModelConfig& c, const std::string& weights_path,
                    const reference::checkpoint::ModelWeights& weights, const ZooBug* bug) {
  std::unique_ptr<reference::seam::Ops> ops = bug != nullptr && bug->make_ops ? bug->make_ops(c) : nullptr;
  DumpDefects defects;
  defects.zero_window_at_resume = bug != nullptr && bug->driver_zero_window_at_resume;
  write_scenario_dump(dir, c, weights_path, weights, zoo_scenario(), ops ? *ops : reference::seam::reference_ops(),
                      "dsv41 selftest" + std::string(bug != nullptr ? " --bugs " + bug->name : " (clean)"), defects);
  if (bug != nullptr && bug->transform_dump) bug->transform_dump(dir, c);
}

}  // namespace dsv41::scenarios::selftest
