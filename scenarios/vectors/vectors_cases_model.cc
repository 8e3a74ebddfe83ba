// scenarios/vectors/vectors_cases_model.cc
//
// The conformance vector cases (scenarios/vectors/vectors.h) of the model-level ops: the indexer
// (index_weights, index_scores, candidate_blocks, mask_scores, index_topk), the attention's index
// rows and sparse_attn, mHC (hc_mixes, hc_pre, hc_post), MoE (moe_gate, moe_experts), Engram
// (engram_hash_ids, engram_lookup, engram_gate_residual) and embed. Each case's adversarial
// property is written into its inputs here and stated in its metadata.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "reference/ops/attention.h"
#include "reference/ops/engram.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/mhc.h"
#include "reference/model/model.h"
#include "reference/ops/moe.h"
#include "reference/seam/ops.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/vectors/vectors.h"
#include "scenarios/vectors/vectors_internal.h"

namespace dsv41::scenarios::vectors::vectors_detail {

using reference::DType;
using reference::Tensor;

namespace {

std::string str(int64_t v) { return std::to_string(v); }
constexpr int64_t kRows = 4;  // tokens of the indexer and attention cases: one per adversarial row

// Scores with exact ties: multiples of 1/4 in [-2, 2] (17 levels), bf16 values; -inf beyond each
// row's reach. [rows, n].
Tensor<float> tied_scores(CaseRng& rng, int64_t n, const std::vector<int64_t>& reach) {
  Tensor<float> s({static_cast<int64_t>(reach.size()), n}, "scores");
  for (int64_t t = 0; t < s.dim(0); ++t) {
    for (int64_t i = 0; i < n; ++i) {
      s.at(t, i) = i < reach[static_cast<size_t>(t)] ? static_cast<float>(rng.below(17) - 8) / 4.0f : -INFINITY;
    }
  }
  return s;
}

// Makes the k-th highest score of row t tied with a score outside the top k (when the row reaches
// more than k positions): if no unselected score equals the k-th, the first lower one is raised to it.
void force_tie_at_cut(dsv41::reference::Tensor<float>& s, int64_t t, int64_t reach, int64_t k) {
  if (reach <= k) return;
  std::vector<float> row(s.data().begin() + t * s.dim(1), s.data().begin() + t * s.dim(1) + reach);
  std::nth_element(row.begin(), row.begin() + (k - 1), row.end(), std::greater<float>());
  const float kth = row[static_cast<size_t>(k - 1)];
  int64_t at_least = 0;
  for (int64_t i = 0; i < reach; ++i) at_least += s.at(t, i) >= kth;
  for (int64_t i = 0; i < reach && at_least <= k; ++i) {
    if (s.at(t, i) < kth) {
      s.at(t, i) = kth;
      ++at_least;
    }
  }
}

void add_indexer_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
  {
    VectorCase v = s.begin("index_weights", "", "w = bf16(proj * fl32(Di^-0.5 * Hi^-0.5))", "");
    CaseRng rng(v.seed);
    v.tensors.push_back(f32_entry("in.proj", rng.bf16({kRows, Hi}, 4.0, "proj")));
    v.params["index_head_dim"] = str(Di);
    s.finish(std::move(v));
  }
  {
    const int64_t N = 64;
    VectorCase v = s.begin("index_scores", "",
                           "scores[t, n] = sum_h w[t, h] relu(q[t, h] . key[n]) for n < reach[t], -inf beyond; keys "
                           "read from the packed index-key cache",
                           "row 0 empty (reach 0: all -inf), row 1 length 1 (reach 1), row 2 reaches half the keys");
    CaseRng rng(v.seed);
    const Tensor<float> q = reference::qdq(formats::CacheFormat::kIndexKeysFp4, rng.bf16({kRows * Hi, Di}, 1.0, "q"));
    v.tensors.push_back(f32_entry("in.q", dsv41::reference::Tensor<float>({kRows, Hi, Di}, q.data(), "q")));
    reference::Tensor<uint8_t> keys({N, formats::entry_bytes(formats::CacheFormat::kIndexKeysFp4, static_cast<int>(Di))}, "keys");
    std::vector<int64_t> all(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) all[static_cast<size_t>(i)] = i;
    reference::write_entries(keys, formats::CacheFormat::kIndexKeysFp4, all, rng.bf16({N, Di}, 1.0, "keys"));
    v.tensors.push_back(u8_entry("in.keys", keys));
    v.tensors.push_back(f32_entry("in.weights", rng.bf16({kRows, Hi}, 0.5, "weights")));
    const std::vector<int64_t> reach = {0, 1, N / 2, N};
    v.tensors.push_back(i64_entry("in.reach", {kRows}, reach));
    v.params = {{"keys_format", formats::info(formats::CacheFormat::kIndexKeysFp4).name},
                {"keys_dim", str(Di)},
                {"keys_count", str(N)}};
    s.finish(std::move(v));
  }
  const int64_t B = c.candidate_topk_blocks, bs = c.candidate_block_size;
  const int64_t Nc = (B + 3) * bs + 3;  // more blocks than kept, the last one partial
  const std::vector<int64_t> reach_c = {0, 1, Nc / 2, Nc};
  dsv41::reference::Tensor<float> cand_scores;
  {
    VectorCase v = s.begin("candidate_blocks", "",
                           "the candidate source's mask: per row the topk_blocks blocks of highest max score (the "
                           "newest reachable block pinned), lower block wins a tie; 1 = position in a kept block",
                           "exact ties between block maxima (17 score levels), row 0 empty (reach 0), row 1 length 1, "
                           "a partial last block");
    CaseRng rng(v.seed);
    cand_scores = tied_scores(rng, Nc, reach_c);
    v.tensors.push_back(f32_entry("in.scores", cand_scores));
    v.tensors.push_back(i64_entry("in.reach", {kRows}, reach_c));
    v.params = {{"topk_blocks", str(B)}, {"block_size", str(bs)}};
    s.finish(std::move(v));
  }
  {
    VectorCase v = s.begin("mask_scores", "", "scores = -inf where mask == 0", "the candidate mask of candidate_blocks "
                                                                               "(its empty and length-1 rows)");
    v.tensors.push_back(f32_entry("in.scores", cand_scores));
    v.tensors.push_back(u8_entry(
        "in.mask", reference::seam::reference_ops().candidate_blocks(cand_scores, reach_c, static_cast<int>(B), static_cast<int>(bs))));
    s.finish(std::move(v));
  }
  {
    const int64_t k = c.index_topk, N = k + 37;
    VectorCase v = s.begin("index_topk", "",
                           "the k positions of highest score per row, ascending, -1 where fewer than k are reachable; "
                           "among equal scores the lower position wins",
                           "exact ties in top-k (17 score levels: the k-th score is tied across the cut), row 0 empty "
                           "(reach 0: all -1), row 1 length 1, row 2 fewer reachable than k (-1 padding)");
    CaseRng rng(v.seed);
    const std::vector<int64_t> reach = {0, 1, k - 5, N};
    reference::Tensor<float> scores = tied_scores(rng, N, reach);
    force_tie_at_cut(scores, 3, N, k);
    v.tensors.push_back(f32_entry("in.scores", scores));
    v.tensors.push_back(i64_entry("in.reach", {kRows}, reach));
    v.params["k"] = str(k);
    s.finish(std::move(v));
  }
}

// Window index rows of 4 queries: a decode at 3W + 5 (the ring has wrapped: slots pos%W+1 .. W-1,
// then 0 .. pos%W), a decode at W/2 (ring still filling: -1 slots first), a query reading one
// row, and a row with no index.
Tensor<int32_t> window_rows(int64_t W) {
  Tensor<int32_t> r({kRows, W}, "window", -1);
  const Tensor<int32_t> wrapped = reference::window_topk_idxs_decode(static_cast<int>(W), 3 * W + 5);
  const Tensor<int32_t> filling = reference::window_topk_idxs_decode(static_cast<int>(W), W / 2);
  for (int64_t j = 0; j < W; ++j) {
    r.at(0, j) = wrapped.at(0, j);
    r.at(1, j) = filling.at(0, j);
  }
  r.at(2, W - 1) = static_cast<int32_t>((3 * W + 5) % W);  // length 1: the current token only
  return r;
}

// Compressed top-k rows [4, kc]: ascending positions < n, row 1 partly -1, rows 2 and 3 all -1.
Tensor<int32_t> topk_rows(CaseRng& rng, int64_t kc, int64_t n) {
  Tensor<int32_t> t({kRows, kc}, "topk", -1);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(pos[static_cast<size_t>(i)], pos[static_cast<size_t>(rng.below(i + 1))]);
  std::sort(pos.begin(), pos.begin() + kc);
  for (int64_t j = 0; j < kc; ++j) t.at(0, j) = pos[static_cast<size_t>(j)];
  for (int64_t j = 0; j < kc / 2; ++j) t.at(1, j) = pos[static_cast<size_t>(j)];
  return t;
}

void add_attention_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t W = c.window_size, H = c.n_heads, D = c.head_dim, kc = 16, Nc = 48;
  const Tensor<int32_t> window = window_rows(W);
  {
    VectorCase v = s.begin("attention_index_rows", "", "the sparse_attn rows: window rows, then the top-k shifted by "
                                                       "offset and padded with -1 to width",
                           "window wrap-around rows (a decode after the ring wrapped, one while it fills), all -1 top-k "
                           "rows, a length-1 row");
    CaseRng rng(v.seed);
    v.tensors.push_back(i32_entry("in.window", window));
    v.tensors.push_back(i32_entry("in.topk", topk_rows(rng, kc, Nc)));
    v.params = {{"offset", str(W)}, {"width", str(c.index_topk)}};
    s.finish(std::move(v));
  }
  VectorCase v = s.begin("sparse_attn", "",
                         "online-softmax attention with a sink over [window KV rows | the packed compressed cache's "
                         "entries]: an index < W is a window row, index - W a compressed entry; -1 = none",
                         "row 0 a window wrap-around row (decode after the ring wrapped) plus 16 compressed entries, "
                         "row 1 a filling ring, row 2 length 1 (one index), row 3 all -1 indices (its output is zero "
                         "by definition); the sink enters the denominator only");
  CaseRng rng(v.seed);
  const int64_t width = W + kc;
  dsv41::reference::Tensor<int32_t> idxs = reference::attention_index_rows(window, topk_rows(rng, kc, Nc), W, kc);
  for (int64_t j = 0; j < width; ++j) idxs.at(3, j) = -1;  // all -1
  v.tensors.push_back(f32_entry("in.q", rng.bf16({kRows, H, D}, 1.0, "q")));
  v.tensors.push_back(f32_entry(
      "in.window_kv", reference::qdq(formats::CacheFormat::kWindowKvFp8, rng.bf16({W, D}, 1.0, "window_kv"))));
  const formats::CacheFormat cf = formats::CacheFormat::kCompressedKvFp4;
  reference::Tensor<uint8_t> compressed({Nc, formats::entry_bytes(cf, static_cast<int>(D))}, "compressed");
  std::vector<int64_t> all(static_cast<size_t>(Nc));
  for (int64_t i = 0; i < Nc; ++i) all[static_cast<size_t>(i)] = i;
  reference::write_entries(compressed, cf, all, rng.bf16({Nc, D}, 1.0, "compressed"));
  v.tensors.push_back(u8_entry("in.compressed", compressed));
  Tensor<float> sink({H}, "sink");
  for (float& x : sink.data()) x = static_cast<float>(0.5 + 0.5 * rng.uniform());
  v.tensors.push_back(f32_entry("in.sink", sink));
  v.tensors.push_back(i32_entry("in.idxs", idxs));
  v.params = {{"softmax_scale", real_string(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))))},
              {"compressed_format", formats::info(cf).name},
              {"compressed_dim", str(D)},
              {"compressed_count", str(Nc)}};
  s.finish(std::move(v));
}

void add_mhc_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t T = s.tokens(), hc = c.hc_mult, dim = c.dim, mixes = reference::hc_mix_count(hc);
  VectorCase v = s.begin("hc_mixes", "",
                         "mHC mixes: raw = (stream fn^T) * rsqrt(mean(stream^2) + eps), then pre = sigmoid + eps, post "
                         "= 2 sigmoid, comb = Sinkhorn(iters) of exp logits",
                         "");
  CaseRng rng(v.seed);
  const Tensor<float> stream = rng.bf16({T, hc, dim}, 1.0, "stream");
  v.tensors.push_back(f32_entry("in.stream", stream));
  const auto gen = [&](const std::string& n, std::vector<int64_t> shape) {
    const reference::checkpoint::safetensors::Entry e = reference::checkpoint::generate_tensor({"layers.0.hc_attn_" + n, DType::kF32, shape}, v.seed);
    return dsv41::reference::Tensor<float>(shape, e.to_f32(), n);
  };
  const reference::HcWeights w{gen("fn", {mixes, hc * dim}), gen("base", {mixes}), gen("scale", {3})};
  v.tensors.push_back(f32_entry("in.fn", w.fn));
  v.tensors.push_back(f32_entry("in.base", w.base));
  v.tensors.push_back(f32_entry("in.scale", w.scale));
  v.params = {{"norm_eps", real_string(c.norm_eps)}, {"iters", str(c.hc_sinkhorn_iters)}, {"hc_eps", real_string(c.hc_eps)}};
  s.finish(std::move(v));
  const reference::HcMixes m =
      reference::seam::reference_ops().hc_mixes(stream, w, c.norm_eps, c.hc_sinkhorn_iters, c.hc_eps);
  VectorCase pre = s.begin("hc_pre", "", "x = bf16(sum_i pre[t, i] stream[t, i, :])", "");
  pre.tensors.push_back(f32_entry("in.stream", stream));
  pre.tensors.push_back(f32_entry("in.pre", m.pre));
  s.finish(std::move(pre));
  VectorCase post = s.begin("hc_post", "", "stream'[t, i] = bf16(post[t, i] f[t] + sum_j comb[t, j, i] residual[t, j])", "");
  CaseRng rng2(post.seed);
  post.tensors.push_back(f32_entry("in.f", rng2.bf16({T, dim}, 1.0, "f")));
  post.tensors.push_back(f32_entry("in.residual", stream));
  post.tensors.push_back(f32_entry("in.post", m.post));
  post.tensors.push_back(f32_entry("in.comb", m.comb));
  s.finish(std::move(post));
}

void add_moe_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t T = s.tokens(), E = c.n_routed_experts, k = c.n_activated_experts, dim = c.dim;
  // Experts in groups of g identical gate rows and biases, g not dividing k: the k-th choice is
  // always an exact tie inside a group (the lower expert index wins).
  const int64_t g = k % 2 != 0 ? 2 : k % 4 != 0 ? 4 : 3;
  VectorCase v = s.begin("moe_gate", "",
                         "routing: scores = sqrt(softplus(x W^T)) (fp32), top-k of scores + bias (stable: among equal "
                         "biased scores the lower expert), weights = scores[experts] normalized, times route_scale",
                         "exact ties between experts: groups of " + str(g) +
                             " identical gate rows and biases, so the k-th choice is tied");
  CaseRng rng(v.seed);
  v.tensors.push_back(f32_entry("in.x", rng.bf16({T, dim}, 2.0, "x")));
  s.add_weight(v, "gate", "layers.0.ffn.gate", DType::kBF16, E, dim);
  reference::checkpoint::safetensors::Entry bias =
      reference::checkpoint::generate_tensor({"layers.0.ffn.gate.bias", DType::kF32, {E}}, v.seed);
  bias.name = "in.gate.bias";
  v.tensors.push_back(bias);
  for (reference::checkpoint::safetensors::Entry& e : v.tensors) {
    const size_t row = e.name == "in.gate.weight" ? static_cast<size_t>(dim) * 2 : e.name == "in.gate.bias" ? 4 : 0;
    for (int64_t x = 0; row > 0 && x < E; ++x) {
      if (x % g != 0) std::memcpy(e.bytes.data() + x * row, e.bytes.data() + (x - x % g) * row, row);
    }
  }
  v.params["layer"] = "0";
  s.finish(std::move(v));
  if (s.released()) return;  // the experts' weights: 18 MB an expert, 35 MB the shared one
  VectorCase m = s.begin("moe_experts", "",
                         "routed experts (w2(swiglu(w1 x, w3 x) * weight), F4) plus the shared expert (F8), summed in "
                         "the official order",
                         "");
  CaseRng r2(m.seed);
  const Tensor<float> x = r2.bf16({T, dim}, 2.0, "x");
  m.tensors.push_back(f32_entry("in.x", x));
  reference::MoeWeights gw;
  gw.gate = reference::LinearWeight{"gate", DType::kF32, E, dim, {}, {}, {}};
  for (int64_t i = 0; i < E * dim; ++i) gw.gate.w.push_back(static_cast<float>(r2.uniform()));
  gw.gate_bias = dsv41::reference::Tensor<float>({E}, "bias", 0.0f);
  const reference::MoeRouting routing = reference::moe_gate(x, gw, c, 0);
  m.tensors.push_back(i32_entry("in.routing.experts", routing.experts));
  m.tensors.push_back(f32_entry("in.routing.weights", routing.weights));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "experts." + str(e) + ".";
    s.add_weight(m, p + "w1", "layers.0.ffn." + p + "w1", DType::kF4, c.moe_inter_dim, dim);
    s.add_weight(m, p + "w2", "layers.0.ffn." + p + "w2", DType::kF4, dim, c.moe_inter_dim);
    s.add_weight(m, p + "w3", "layers.0.ffn." + p + "w3", DType::kF4, c.moe_inter_dim, dim);
  }
  s.add_weight(m, "shared_experts.w1", "layers.0.ffn.shared_experts.w1", DType::kF8E4M3, c.moe_inter_dim, dim);
  s.add_weight(m, "shared_experts.w2", "layers.0.ffn.shared_experts.w2", DType::kF8E4M3, dim, c.moe_inter_dim);
  s.add_weight(m, "shared_experts.w3", "layers.0.ffn.shared_experts.w3", DType::kF8E4M3, c.moe_inter_dim, dim);
  s.finish(std::move(m));
}

void add_engram_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t T = s.tokens(), hc = c.hc_mult, dim = c.dim;
  const reference::EngramLayout layout = reference::EngramLayout::build(c);
  const int layer_id = layout.layer_ids.front();
  const int64_t pad = reference::engram_pad_id(reference::model::default_token_map(c), c.engram_pad_id);
  const int64_t tail = layout.max_ngram_size - 1;
  dsv41::reference::Tensor<int64_t> ids;
  for (const bool resume : {false, true}) {
    VectorCase v = s.begin("engram_hash_ids", resume ? "resume" : "start",
                           "per position and (n-gram order, head) column: the hashed table row of the compressed ids of "
                           "the last n positions (pad id before the first), offset into the layer's table",
                           resume ? "resume boundary: the history is a saved tail of max_ngram - 1 ids restored at "
                                    "position 97, then the new tokens from 100"
                                  : "the first positions: n-grams reach before position 0 (the pad id)");
    CaseRng rng(v.seed);
    const int64_t start = resume ? 100 : 0, first = resume ? start - tail : 0;
    std::vector<int64_t> hist;
    for (int64_t i = first; i < start + T; ++i) hist.push_back(rng.below(layout.compressed_vocab));
    if (T > 2) hist[hist.size() - 2] = pad;  // a pad id inside the history
    v.tensors.push_back(i64_entry("in.history", {static_cast<int64_t>(hist.size())}, hist));
    v.params = {{"layer_id", str(layer_id)}, {"pad_id", str(pad)}, {"history_first", str(first)},
                {"start_pos", str(start)}, {"count", str(T)}};
    s.finish(std::move(v));
    const auto out = reference::checkpoint::safetensors::SafetensorsFile::from_entries("ids", s.last_outputs());
    ids = reference::Tensor<int64_t>(out.get("out.ids").shape, get_i64(out, "out.ids"), "ids");
  }
  if (!s.released()) {  // the table: 384M rows at released dims
    VectorCase v = s.begin("engram_lookup", "", "out[t, col*hd + d] = bf16(e4m3(code[id, d]) * e8m0(scale[id, d/32]))",
                           "ids include the table's first and last rows");
    const int64_t rows = layout.rows.front(), hd = layout.head_dim;
    const std::string p = "layers." + str(layer_id) + ".engram.embed.";
    auto w = reference::checkpoint::generate_tensor({p + "weight", DType::kF8E4M3, {rows, hd}}, v.seed);
    auto sc = reference::checkpoint::generate_tensor({p + "scale", DType::kF8E8M0, {rows, hd / 32}}, v.seed);
    w.name = "in.table.weight";
    sc.name = "in.table.scale";
    v.tensors.push_back(w);
    v.tensors.push_back(sc);
    std::vector<int64_t> flat = ids.data();
    flat.front() = 0;
    flat.back() = rows - 1;
    v.tensors.push_back(i64_entry("in.ids", ids.shape(), flat));
    v.params = {{"head_dim", str(hd)}, {"n_cols", str(layout.n_cols())}};
    s.finish(std::move(v));
  }
  VectorCase v = s.begin("engram_gate_residual", "",
                         "gate[t, c] = sigmoid(signed sqrt(<h, w * key> rstd(h) rstd(key) dim^-0.5)); out = bf16(h + "
                         "gate * value)",
                         "");
  CaseRng rng(v.seed);
  v.tensors.push_back(f32_entry("in.x", rng.bf16({T, hc, dim}, 1.0, "x")));
  v.tensors.push_back(f32_entry("in.kv", rng.bf16({T, (hc + 1) * dim}, 1.0, "kv")));
  for (const char* n : {"q_weight", "k_weight"}) {
    const auto e = reference::checkpoint::generate_tensor({"layers.1.engram." + std::string(n), DType::kBF16, {hc, dim}}, v.seed);
    v.tensors.push_back(f32_entry(std::string("in.") + n, reference::Tensor<float>({hc, dim}, e.to_f32(), n)));
  }
  v.params["eps"] = real_string(c.norm_eps);
  s.finish(std::move(v));
}

void add_embed_case(CaseSet& s) {
  if (s.released()) return;  // the table: 1.3 GB at released dims
  const auto& c = s.config();
  VectorCase v = s.begin("embed", "", "x[t, i, :] = table[tokens[t]] for each of the hc streams",
                         "the first and last vocab entries");
  CaseRng rng(v.seed);
  std::vector<int64_t> tokens = {0, c.vocab_size - 1, rng.below(c.vocab_size), rng.below(c.vocab_size), 0};
  v.tensors.push_back(i64_entry("in.tokens", {static_cast<int64_t>(tokens.size())}, tokens));
  const auto t = reference::checkpoint::generate_tensor({"embed.weight", DType::kBF16, {c.vocab_size, c.dim}}, v.seed);
  v.tensors.push_back(f32_entry("in.table", dsv41::reference::Tensor<float>({c.vocab_size, c.dim}, t.to_f32(), "table")));
  v.params["hc"] = str(c.hc_mult);
  s.finish(std::move(v));
}

}  // namespace

void add_model_cases(CaseSet& s) {
  add_indexer_cases(s);
  add_attention_cases(s);
  add_mhc_cases(s);
  add_moe_cases(s);
  add_engram_cases(s);
  add_embed_case(s);
}

}  // namespace dsv41::scenarios::vectors::vectors_detail
