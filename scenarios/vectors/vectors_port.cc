// scenarios/vectors/vectors_port.cc
//
// The reference "port" of the conformance vectors (scenarios/vectors/vectors.h): run_vector_case reads a
// case's inputs and parameters, calls the Ops method the case names, and returns its outputs.
// It is the documented example of what a port does with a case (docs/port-dump.md, "Conformance
// vectors"): each branch below is the whole contract of one op's case file.
#include <filesystem>
#include <functional>
#include <map>

#include "base/error.h"
#include "reference/ops/engram.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/rope.h"
#include "scenarios/vectors/vectors.h"
#include "scenarios/vectors/vectors_internal.h"

namespace dsv41::scenarios::vectors {

using namespace reference;  // NOLINT: the reference's types throughout
using vectors_detail::case_config;
using vectors_detail::f32_entry;
using vectors_detail::get_f32;
using vectors_detail::get_i32;
using vectors_detail::get_i64;
using vectors_detail::get_linear;
using vectors_detail::get_u8;
using vectors_detail::i32_entry;
using vectors_detail::i64_entry;
using vectors_detail::param;
using vectors_detail::param_int;
using vectors_detail::param_real;
using vectors_detail::u8_entry;
namespace st = reference::checkpoint::safetensors;

namespace {

using Outputs = std::vector<st::Entry>;
using Runner = std::function<Outputs(const reference::seam::Ops&, const st::SafetensorsFile&)>;

CacheRows cache_rows(const st::SafetensorsFile& f, const std::string& prefix, const Tensor<uint8_t>& bytes) {
  CacheRows r;
  r.format = formats::cache_format_from_name(param(f, prefix + "_format"));
  r.dim = param_int(f, prefix + "_dim");
  r.count = param_int(f, prefix + "_count");
  r.bytes = &bytes;
  return r;
}

MoeWeights gate_weights(const st::SafetensorsFile& f) {
  MoeWeights w;
  w.gate = get_linear(f, "in.gate");
  w.gate_bias = get_f32(f, "in.gate.bias");
  return w;
}

// Every op's case: inputs "in.*" and parameters "param.*" -> outputs "out.*".
const std::map<std::string, Runner>& runners() {
  static const std::map<std::string, Runner> m = {
      {"embed",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.x", o.embed(get_i64(f, "in.tokens"), get_f32(f, "in.table"),
                                                   param_int(f, "hc")))};
       }},
      {"linear",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.y", o.linear(get_f32(f, "in.x"), get_linear(f, "in.w")))};
       }},
      {"linear_fp32",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.y", o.linear_fp32(get_f32(f, "in.x"), get_linear(f, "in.w")))};
       }},
      {"grouped_linear",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.y", o.grouped_linear(get_f32(f, "in.x"), get_linear(f, "in.w"),
                                                            static_cast<int>(param_int(f, "groups"))))};
       }},
      {"rms_norm",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.y", o.rms_norm(get_f32(f, "in.x"), get_f32(f, "in.weight"), param_real(f, "eps")))};
       }},
      {"rope_rows",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         RopeParams p;
         p.rope_dim = param_int(f, "rope_dim");
         p.max_seq_len = param_int(f, "max_seq_len");
         p.original_seq_len = param_int(f, "original_seq_len");
         p.base = param_real(f, "base");
         p.factor = param_real(f, "factor");
         p.beta_fast = param_int(f, "beta_fast");
         p.beta_slow = param_int(f, "beta_slow");
         Tensor<float> x = get_f32(f, "in.x");
         o.rope_rows(x, param_int(f, "heads"), RopeTable(p), param_int(f, "first_pos"), param_int(f, "pos_stride"),
                     param_int(f, "inverse") != 0);
         return Outputs{f32_entry("out.x", x)};
       }},
      {"qdq",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.y", o.qdq(formats::cache_format_from_name(param(f, "format")), get_f32(f, "in.x")))};
       }},
      {"write_entries",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         Tensor<uint8_t> storage = get_u8(f, "in.storage");
         o.write_entries(storage, formats::cache_format_from_name(param(f, "format")), get_i64(f, "in.entries"),
                         get_f32(f, "in.rows"));
         return Outputs{u8_entry("out.storage", storage)};
       }},
      {"read_entries",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const Tensor<uint8_t> storage = get_u8(f, "in.storage");
         return Outputs{f32_entry("out.rows", o.read_entries(cache_rows(f, "cache", storage), get_i64(f, "in.entries")))};
       }},
      {"compress",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         Tensor<float> kv_state = get_f32(f, "in.kv_state"), score_state = get_f32(f, "in.score_state");
         const Tensor<float> kv = get_f32(f, "in.kv");
         const CompressedLatents c = o.compress(kv, get_f32(f, "in.score"), param_int(f, "start_pos"),
                                                static_cast<int>(param_int(f, "ratio")), kv_state, score_state);
         const Tensor<float> latent = c.count() > 0 ? c.latent : Tensor<float>({0, kv.dim(1)}, "latent");
         return Outputs{f32_entry("out.latent", latent), i64_entry("out.first_group", {1}, {c.first_group}),
                        f32_entry("out.kv_state", kv_state), f32_entry("out.score_state", score_state)};
       }},
      {"index_weights",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.weights", o.index_weights(get_f32(f, "in.proj"),
                                                                 static_cast<int>(param_int(f, "index_head_dim"))))};
       }},
      {"index_scores",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const Tensor<uint8_t> keys = get_u8(f, "in.keys");
         return Outputs{f32_entry("out.scores", o.index_scores(get_f32(f, "in.q"), cache_rows(f, "keys", keys),
                                                               get_f32(f, "in.weights"), get_i64(f, "in.reach")))};
       }},
      {"candidate_blocks",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{u8_entry("out.mask", o.candidate_blocks(get_f32(f, "in.scores"), get_i64(f, "in.reach"),
                                                                static_cast<int>(param_int(f, "topk_blocks")),
                                                                static_cast<int>(param_int(f, "block_size"))))};
       }},
      {"mask_scores",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         Tensor<float> scores = get_f32(f, "in.scores");
         o.mask_scores(scores, get_u8(f, "in.mask"));
         return Outputs{f32_entry("out.scores", scores)};
       }},
      {"index_topk",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{i32_entry("out.topk", o.index_topk(get_f32(f, "in.scores"), get_i64(f, "in.reach"),
                                                           static_cast<int>(param_int(f, "k"))))};
       }},
      {"attention_index_rows",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{i32_entry("out.idxs", o.attention_index_rows(get_i32(f, "in.window"), get_i32(f, "in.topk"),
                                                                     param_int(f, "offset"), param_int(f, "width")))};
       }},
      {"sparse_attn",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const Tensor<uint8_t> compressed = get_u8(f, "in.compressed");
         return Outputs{f32_entry(
             "out.o", o.sparse_attn(get_f32(f, "in.q"), get_f32(f, "in.window_kv"), cache_rows(f, "compressed", compressed),
                                    get_f32(f, "in.sink"), get_i32(f, "in.idxs"),
                                    static_cast<float>(param_real(f, "softmax_scale"))))};
       }},
      {"hc_mixes",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const HcWeights w{get_f32(f, "in.fn"), get_f32(f, "in.base"), get_f32(f, "in.scale")};
         const HcMixes m = o.hc_mixes(get_f32(f, "in.stream"), w, param_real(f, "norm_eps"),
                                      static_cast<int>(param_int(f, "iters")), param_real(f, "hc_eps"));
         return Outputs{f32_entry("out.pre", m.pre), f32_entry("out.post", m.post), f32_entry("out.comb", m.comb)};
       }},
      {"hc_pre",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.x", o.hc_pre(get_f32(f, "in.stream"), get_f32(f, "in.pre")))};
       }},
      {"hc_post",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         return Outputs{f32_entry("out.stream", o.hc_post(get_f32(f, "in.f"), get_f32(f, "in.residual"),
                                                          get_f32(f, "in.post"), get_f32(f, "in.comb")))};
       }},
      {"engram_hash_ids",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const ModelConfig c = case_config(f);
         const EngramLayout layout = EngramLayout::build(c);
         EngramHistory history(param_int(f, "pad_id"));
         history.restore(param_int(f, "history_first"), get_i64(f, "in.history"));
         const Tensor<int64_t> ids = o.engram_hash_ids(layout, layout.layer_index(static_cast<int>(param_int(f, "layer_id"))),
                                                       history, param_int(f, "start_pos"), param_int(f, "count"));
         return Outputs{i64_entry("out.ids", ids.shape(), ids.data())};
       }},
      {"engram_lookup",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const st::Entry& table = f.get("in.table.weight");
         EngramWeights w;
         w.table = Tensor<uint8_t>(table.shape, table.bytes, "in.table.weight");
         const st::Entry& scale = f.get("in.table.scale");
         w.table_scale = Tensor<uint8_t>(scale.shape, scale.bytes, "in.table.scale");
         const std::vector<int64_t> ids = get_i64(f, "in.ids");
         const int64_t cols = param_int(f, "n_cols");
         DSV41_CHECK(cols > 0 && static_cast<int64_t>(ids.size()) % cols == 0, f.path(), ": in.ids holds ", ids.size(),
                     " ids, not a multiple of param.n_cols ", cols);
         const Tensor<int64_t> t({static_cast<int64_t>(ids.size()) / cols, cols}, ids, "in.ids");
         return Outputs{f32_entry("out.kv", o.engram_lookup(w, static_cast<int>(param_int(f, "head_dim")), t))};
       }},
      {"engram_gate_residual",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         EngramWeights w;
         w.q_weight = get_f32(f, "in.q_weight");
         w.k_weight = get_f32(f, "in.k_weight");
         return Outputs{f32_entry("out.x", o.engram_gate_residual(get_f32(f, "in.x"), get_f32(f, "in.kv"), w,
                                                                  param_real(f, "eps")))};
       }},
      {"moe_gate",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const MoeRouting r = o.moe_gate(get_f32(f, "in.x"), gate_weights(f), case_config(f),
                                         static_cast<int>(param_int(f, "layer")));
         return Outputs{i32_entry("out.experts", r.experts), f32_entry("out.weights", r.weights),
                        f32_entry("out.scores", r.scores)};
       }},
      {"moe_experts",
       [](const reference::seam::Ops& o, const st::SafetensorsFile& f) {
         const ModelConfig c = case_config(f);
         MoeWeights w;
         for (int e = 0; e < c.n_routed_experts; ++e) {
           const std::string p = "in.experts." + std::to_string(e) + ".";
           w.w1.push_back(get_linear(f, p + "w1"));
           w.w2.push_back(get_linear(f, p + "w2"));
           w.w3.push_back(get_linear(f, p + "w3"));
         }
         w.s_w1 = get_linear(f, "in.shared_experts.w1");
         w.s_w2 = get_linear(f, "in.shared_experts.w2");
         w.s_w3 = get_linear(f, "in.shared_experts.w3");
         MoeRouting r;
         r.experts = get_i32(f, "in.routing.experts");
         r.weights = get_f32(f, "in.routing.weights");
         return Outputs{f32_entry("out.y", o.moe_experts(get_f32(f, "in.x"), w, r, c))};
       }},
  };
  return m;
}

}  // namespace

std::vector<st::Entry> run_vector_case(const reference::seam::Ops& ops, const st::SafetensorsFile& file) {
  const auto& md = file.metadata();
  const auto it = md.find("op");
  DSV41_CHECK(it != md.end(), file.path(), ": __metadata__ has no 'op'");
  const auto r = runners().find(it->second);
  DSV41_CHECK(r != runners().end(), file.path(), ": __metadata__ 'op' = '", it->second,
              "' is not an op of the conformance vectors (docs/port-dump.md)");
  try {
    return r->second(ops, file);
  } catch (const Error& e) {
    DSV41_FAIL(file.path(), " (op ", it->second, "): ", e.what());
  }
}

void run_port_on_vectors(const reference::seam::Ops& ops, const std::string& vectors_dir, const std::string& port_dir,
                         const std::string& only) {
  const VectorSet set = read_vector_set(vectors_dir);
  std::filesystem::create_directories(port_dir);
  for (const VectorSetEntry& c : set.cases) {
    if (!only.empty() && c.op != only) continue;
    const st::SafetensorsFile in = st::SafetensorsFile::read((std::filesystem::path(vectors_dir) / c.file).string());
    st::write((std::filesystem::path(port_dir) / c.file).string(), run_vector_case(ops, in),
              {{"format", kVectorsFormat}, {"version", std::to_string(kVectorsVersion)}, {"case", c.name},
               {"port", ops.name()}});
  }
}

}  // namespace dsv41::scenarios::vectors
