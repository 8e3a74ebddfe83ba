// scenarios/defects/bug_zoo_ops.cc
//
// The ops-level bugs of the zoo (scenarios/selftest/bug_zoo.h, docs/selftest.md): each a BugOps (a ForwardingOps)
// (scenarios/defects/bug_zoo_forwarding.h) that gets one op wrong the way a shipped port did, and forwards
// everything else to the CPU reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

#include "formats/cache_format.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "formats/qdq.h"
#include "reference/ops/kv_quant.h"
#include "reference/ops/moe.h"
#include "reference/ops/topk.h"
#include "scenarios/defects/bug_zoo_ops.h"
#include "scenarios/defects/bug_zoo_forwarding.h"

namespace dsv41::scenarios::defects {
namespace {

using formats::CacheFormat;
using reference::ModelConfig;
using reference::RopeTable;
using reference::Tensor;
using T32 = Tensor<float>;
using TI32 = Tensor<int32_t>;
using TU8 = Tensor<uint8_t>;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- caches (kv_quant.h) ----

// The window KV entry with E8M0 scales rounded DOWN (floor of log2) instead of up: codes beyond
// E4M3's 448 saturate. entry: [d E4M3 codes][d/32 E8M0 scales].
class E8m0ScaleFloor : public BugOps {
 public:
  E8m0ScaleFloor() : BugOps("e8m0_scale_floor") {}
  void write_entries(TU8& storage, CacheFormat f, const std::vector<int64_t>& entries, const T32& rows) const override {
    ref().write_entries(storage, f, entries, rows);
    if (f != CacheFormat::kWindowKvFp8) return;
    const int64_t d = rows.dim(1);
    for (size_t i = 0; i < entries.size(); ++i) {
      const float* x = rows.row(static_cast<int64_t>(i));
      uint8_t* out = storage.row(entries[i]);
      for (int64_t b = 0; b < d / formats::kFp8Block; ++b) {
        bool finite = true;
        const float amax = formats::block_amax(x + b * formats::kFp8Block, formats::kFp8Block, &finite);
        const float t = formats::max_f32(amax, dsv41::f32_from_bits(formats::kFp8AmaxFloorBits)) *
                        dsv41::f32_from_bits(formats::kInv448Bits);
        const uint8_t scale = static_cast<uint8_t>((dsv41::f32_bits(t) >> 23) & 0xFFu);  // floor, not ceil
        const float s = formats::e8m0_decode(scale);
        out[d + b] = scale;
        for (int64_t j = 0; j < formats::kFp8Block; ++j) {
          const int64_t e = b * formats::kFp8Block + j;
          out[e] = formats::e4m3_encode_satfinite(formats::clamp_f32(x[e] / s, -448.0f, 448.0f));
        }
      }
    }
  }
};

// E2M1 with ties AWAY from zero (the official rounding is to the nearest even code), in the
// indexer-key entries: [d/2 nibble bytes][d/32 E8M0 scales], scales as the reference's.
uint8_t e2m1_ties_away(float v) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  for (int i = 0; i < 7; ++i) {
    if (a == 0.5f * (kMag[i] + kMag[i + 1])) return static_cast<uint8_t>((v < 0 ? 0x8 : 0) | (i + 1));
  }
  return formats::e2m1_encode(v);
}
class E2m1TiesAway : public BugOps {
 public:
  E2m1TiesAway() : BugOps("e2m1_ties_away") {}
  void write_entries(TU8& storage, CacheFormat f, const std::vector<int64_t>& entries, const T32& rows) const override {
    ref().write_entries(storage, f, entries, rows);
    if (f != CacheFormat::kIndexKeysFp4) return;
    const int64_t d = rows.dim(1);
    for (size_t i = 0; i < entries.size(); ++i) {
      const float* x = rows.row(static_cast<int64_t>(i));
      uint8_t* out = storage.row(entries[i]);
      for (int64_t b = 0; b < d / formats::kIndexBlock; ++b) {
        const float s = formats::e8m0_decode(out[d / 2 + b]);
        uint8_t codes[formats::kIndexBlock];
        for (int j = 0; j < formats::kIndexBlock; ++j) {
          codes[j] = e2m1_ties_away(formats::clamp_f32(x[b * formats::kIndexBlock + j] / s, -6.0f, 6.0f));
        }
        formats::pack_nibbles(codes, formats::kIndexBlock, out + b * formats::kIndexBlock / 2);
      }
    }
  }
};

// The compressed-KV entries written with the two nibbles of every value byte swapped; read the
// official way.
class SwappedNibbles : public BugOps {
 public:
  SwappedNibbles() : BugOps("swapped_nibbles") {}
  void write_entries(TU8& storage, CacheFormat f, const std::vector<int64_t>& entries, const T32& rows) const override {
    ref().write_entries(storage, f, entries, rows);
    if (f != CacheFormat::kCompressedKvFp4) return;
    for (int64_t e : entries) {
      uint8_t* out = storage.row(e);
      for (int64_t i = 0; i < rows.dim(1) / 2; ++i) out[i] = static_cast<uint8_t>((out[i] >> 4) | (out[i] << 4));
    }
  }
};

// ---- RoPE (rope.h) ----

// The window KV quantised (QDQ) BEFORE its RoPE: the window KV rope call is the first one-head,
// head_dim-wide call after a layer's query rope.
class KvQuantBeforeRope : public BugOps {
 public:
  explicit KvQuantBeforeRope(const ModelConfig& c) : BugOps("kv_quant_before_rope"), c_(c) {}
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t stride,
                 bool inverse) const override {
    note_layer(rope);
    if (!inverse && heads == c_.n_heads && x.dim(1) == c_.n_heads * c_.head_dim) {
      after_q_ = true;
    } else if (after_q_ && !inverse && heads == 1 && x.dim(1) == c_.head_dim && stride == 1) {
      after_q_ = false;
      x = ref().qdq(CacheFormat::kWindowKvFp8, x);
    }
    ref().rope_rows(x, heads, rope, first_pos, stride, inverse);
  }

 private:
  ModelConfig c_;
  mutable bool after_q_ = false;
};

// The compressed KV entries rotated at position group * ratio + 1 (one past the official one).
class CompressedPositionOffByOne : public BugOps {
 public:
  explicit CompressedPositionOffByOne(const ModelConfig& c) : BugOps("compressed_position_off_by_one"), c_(c) {}
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t stride,
                 bool inverse) const override {
    note_layer(rope);
    const bool compressed_kv = !inverse && heads == 1 && stride > 1 && x.dim(1) == c_.head_dim;
    ref().rope_rows(x, heads, rope, compressed_kv ? first_pos + 1 : first_pos, stride, inverse);
  }

 private:
  ModelConfig c_;
};

// The indexer's RoPE (its queries and keys) on the wrong pairs: (x[i], x[i + rd/2]) ("rotate
// half") instead of the official adjacent pairs (x[2i], x[2i+1]).
class IndexerRopePairs : public BugOps {
 public:
  explicit IndexerRopePairs(const ModelConfig& c) : BugOps("indexer_rope_pairs"), c_(c) {}
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t stride,
                 bool inverse) const override {
    note_layer(rope);
    const bool indexer = x.dim(1) == heads * c_.index_head_dim && (heads == 1 || heads == c_.index_n_heads);
    if (!indexer) return ref().rope_rows(x, heads, rope, first_pos, stride, inverse);
    const int64_t w = c_.index_head_dim, rd = rope.rope_dim(), half = rd / 2;
    // Gather each head's tail so the reference's adjacent pairs are (x[i], x[i + half]), rotate, scatter.
    T32 y = x;
    for (int64_t t = 0; t < x.dim(0); ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        float* src = x.row(t) + h * w + (w - rd);
        float* dst = y.row(t) + h * w + (w - rd);
        for (int64_t i = 0; i < half; ++i) dst[2 * i] = src[i], dst[2 * i + 1] = src[i + half];
      }
    }
    ref().rope_rows(y, heads, rope, first_pos, stride, inverse);
    for (int64_t t = 0; t < x.dim(0); ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        float* dst = x.row(t) + h * w + (w - rd);
        const float* src = y.row(t) + h * w + (w - rd);
        for (int64_t i = 0; i < half; ++i) dst[i] = src[2 * i], dst[i + half] = src[2 * i + 1];
      }
    }
  }

 private:
  ModelConfig c_;
};

// The compressed layers rotate with the window layers' table (rope_theta, no YaRN) and the window
// layers with the compressed layers' (compress_rope_theta, YaRN).
class RopeTablesSwapped : public BugOps {
 public:
  explicit RopeTablesSwapped(const ModelConfig& c)
      : BugOps("rope_tables_swapped"), c_(c),
        window_(RopeTable::make(c, reference::RopeKind::kWindow)),
        compressed_(RopeTable::make(c, reference::RopeKind::kCompressed)) {}
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t stride,
                 bool inverse) const override {
    note_layer(rope);
    const int l = layer_of(rope);
    if (l < 0 || l >= c_.n_layers) return ref().rope_rows(x, heads, rope, first_pos, stride, inverse);
    const bool compressed = c_.compress_ratios[static_cast<size_t>(l)] > 0;
    ref().rope_rows(x, heads, compressed ? window_ : compressed_, first_pos, stride, inverse);
  }

 private:
  ModelConfig c_;
  RopeTable window_, compressed_;
};

// ---- attention and the indexer ----

// The compressed part of the attention indices offset by one row too few (the window rows' count
// minus one): every compressed entry reads its predecessor, the first reads the last window row.
class TopkWindowOffset : public BugOps {
 public:
  TopkWindowOffset() : BugOps("topk_window_offset") {}
  TI32 attention_index_rows(const TI32& window, const TI32& topk, int64_t offset, int64_t width) const override {
    return ref().attention_index_rows(window, topk, offset - 1, width);
  }
};

// The top-k prefers the HIGHER position among equal scores (the official rule: the lower).
class TopkTieHigherPosition : public BugOps {
 public:
  TopkTieHigherPosition() : BugOps("topk_tie_higher_position") {}
  TI32 index_topk(const T32& scores, const std::vector<int64_t>& reach, int k_max) const override {
    const T32 s = ref().download(scores);
    const int64_t rows = s.dim(0), n = s.dim(1), k = std::min<int64_t>(k_max, n);
    TI32 out({rows, k}, "indexer_topk");
    for (int64_t t = 0; t < rows; ++t) {
      const float* v = s.row(t);
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
      order.resize(static_cast<size_t>(k));
      std::sort(order.begin(), order.end());
      for (int64_t i = 0; i < k; ++i) {
        const int64_t pos = order[static_cast<size_t>(i)];
        out.at(t, i) = pos < reach[static_cast<size_t>(t)] ? static_cast<int32_t>(pos) : -1;
      }
    }
    return ref().upload(std::move(out));
  }
};

// A Reuse layer whose top-k owner is not its kv owner takes its KV OWNER's top-k (the owners
// confused): the top-k each index source published in this step is kept by layer.
class ReuseWrongOwner : public BugOps {
 public:
  explicit ReuseWrongOwner(const ModelConfig& c)
      : BugOps("reuse_wrong_owner"), schedule_(reference::layer_schedule(c)) {}
  TI32 index_topk(const T32& scores, const std::vector<int64_t>& reach, int k) const override {
    TI32 own = ref().index_topk(scores, reach, k);
    published_[current_layer()] = own;
    return own;
  }
  TI32 attention_index_rows(const TI32& window, const TI32& topk, int64_t offset, int64_t width) const override {
    const int l = current_layer();
    if (l >= 0 && l < static_cast<int>(schedule_.size())) {
      const reference::LayerInfo& info = schedule_[static_cast<size_t>(l)];
      const auto it = published_.find(info.kv_owner);
      if (info.role == reference::LayerRole::kReuse && info.topk_owner != info.kv_owner && it != published_.end() &&
          it->second.shape() == topk.shape()) {
        return ref().attention_index_rows(window, it->second, offset, width);
      }
    }
    return ref().attention_index_rows(window, topk, offset, width);
  }

 private:
  std::vector<reference::LayerInfo> schedule_;
  mutable std::map<int, TI32> published_;
};

// The candidate blocks picked by score alone: the newest, partly filled block is not pinned.
class NewestBlockNotPinned : public BugOps {
 public:
  NewestBlockNotPinned() : BugOps("newest_block_not_pinned") {}
  TU8 candidate_blocks(const T32& scores_in, const std::vector<int64_t>& reach, int topk_blocks,
                       int block_size) const override {
    const T32 s = ref().download(scores_in);
    const int64_t rows = s.dim(0), n = s.dim(1), blocks = (n + block_size - 1) / block_size;
    const int64_t k = std::min<int64_t>(topk_blocks, blocks);
    TU8 mask({rows, n}, "candidates", 0);
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<float> block(static_cast<size_t>(blocks), -kInf);
      for (int64_t j = 0; j < n; ++j) block[static_cast<size_t>(j / block_size)] = std::max(block[j / block_size], s.at(t, j));
      for (int64_t b : reference::topk_lowest_index(block.data(), blocks, k)) {
        if (!(block[static_cast<size_t>(b)] > -kInf)) continue;
        for (int64_t j = b * block_size; j < std::min<int64_t>(n, (b + 1) * block_size); ++j) mask.at(t, j) = 1;
      }
    }
    (void)reach;
    return ref().upload(std::move(mask));
  }
};

// The attention sink in the numerator too: out += p_sink on every channel (the sink's share of the
// softmax, as if its value row were all ones), besides the denominator.
class SinkInNumerator : public BugOps {
 public:
  SinkInNumerator() : BugOps("sink_in_numerator") {}
  T32 sparse_attn(const T32& q, const T32& window_kv, const reference::CacheRows& compressed, const T32& sink,
                  const TI32& idxs, float scale) const override {
    T32 o = ref().sparse_attn(q, window_kv, compressed, sink, idxs, scale);
    const T32 kv = compressed.count == 0 ? window_kv
                                         : reference::concat_kv_rows(window_kv, reference::read_all_entries(compressed));
    const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), K = idxs.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> s;
        for (int64_t j = 0; j < K; ++j) {
          const int32_t r = idxs.at(t, j);
          if (r < 0) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q.at(t, h, d)) * kv.at(r, d);
          s.push_back(dot * scale);
        }
        if (s.empty()) continue;
        const double sk = sink.data()[static_cast<size_t>(h)];
        const double m = std::max(sk, *std::max_element(s.begin(), s.end()));
        double l = std::exp(sk - m);
        for (double v : s) l += std::exp(v - m);
        const float p_sink = static_cast<float>(std::exp(sk - m) / l);
        for (int64_t d = 0; d < D; ++d) o.at(t, h, d) = formats::round_to_bf16(o.at(t, h, d) + p_sink);
      }
    }
    return o;
  }
};

// ---- compressor, mHC, Engram, MoE, norms ----

// A prefill chunk that starts inside a compressor group loses the group's pending rows (the state
// is re-initialised: kv 0, score -inf), so the group is pooled from the new rows only.
class CompressorPartialGroupLost : public BugOps {
 public:
  CompressorPartialGroupLost() : BugOps("compressor_partial_group_lost") {}
  reference::CompressedLatents compress(const T32& kv, const T32& score, int64_t start_pos, int ratio, T32& kv_state,
                                        T32& score_state) const override {
    if (kv.dim(0) > 1 && start_pos % ratio != 0) {
      std::fill(kv_state.data().begin(), kv_state.data().end(), 0.0f);
      std::fill(score_state.data().begin(), score_state.data().end(), -kInf);
    }
    return ref().compress(kv, score, start_pos, ratio, kv_state, score_state);
  }
};

// Each sublayer applies the pre of its OWN mixes (computed from the stream it reads) instead of
// the previous sublayer's, one step lagged.
class MhcPreNotLagged : public BugOps {
 public:
  MhcPreNotLagged() : BugOps("mhc_pre_not_lagged") {}
  reference::HcMixes hc_mixes(const T32& stream, const reference::HcWeights& w, double norm_eps, int iters,
                              double hc_eps) const override {
    reference::HcMixes m = ref().hc_mixes(stream, w, norm_eps, iters, hc_eps);
    latest_pre_ = m.pre;
    return m;
  }
  T32 hc_pre(const T32& stream, const T32& pre) const override {
    return ref().hc_pre(stream, latest_pre_.shape() == pre.shape() ? latest_pre_ : pre);
  }

 private:
  mutable T32 latest_pre_;
};

class SinkhornOneShort : public BugOps {
 public:
  SinkhornOneShort() : BugOps("sinkhorn_one_short") {}
  reference::HcMixes hc_mixes(const T32& stream, const reference::HcWeights& w, double norm_eps, int iters,
                              double hc_eps) const override {
    return ref().hc_mixes(stream, w, norm_eps, iters - 1, hc_eps);
  }
};

// Every Engram n-gram hash multiplier one higher than the official one.
class EngramMultiplierOffByOne : public BugOps {
 public:
  EngramMultiplierOffByOne() : BugOps("engram_multiplier_off_by_one") {}
  Tensor<int64_t> engram_hash_ids(const reference::EngramLayout& layout, int layer_index,
                                  const reference::EngramHistory& h, int64_t start_pos,
                                  int64_t count) const override {
    reference::EngramLayout wrong = layout;
    for (int64_t& m : wrong.multipliers[static_cast<size_t>(layer_index)]) m += 1;
    return ref().engram_hash_ids(wrong, layer_index, h, start_pos, count);
  }
};

// Routing scores softmax(logits / gate_temp) over the experts instead of sqrt(softplus(.)); the
// choice (with the bias) and the weights follow from them as officially.
class SoftmaxRouting : public BugOps {
 public:
  SoftmaxRouting() : BugOps("softmax_routing") {}
  reference::MoeRouting moe_gate(const T32& x, const reference::MoeWeights& w, const ModelConfig& c,
                                 int layer) const override {
    const T32 logits = ref().linear_fp32(x, w.gate);  // [T, E] fp32
    reference::MoeRouting r = reference::moe_route(logits, w, c, layer);
    const int64_t T = logits.dim(0), E = logits.dim(1), k = r.experts.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      float mx = -kInf;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits.at(t, e) / static_cast<float>(c.gate_temp));
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (r.scores.at(t, e) = std::exp(logits.at(t, e) / static_cast<float>(c.gate_temp) - mx));
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::vector<float> biased(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        r.scores.at(t, e) /= sum;
        biased[static_cast<size_t>(e)] = r.scores.at(t, e) + w.gate_bias.data()[static_cast<size_t>(e)];
      }
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return biased[a] > biased[b]; });
      for (int64_t j = 0; j < k; ++j) r.experts.at(t, j) = order[static_cast<size_t>(j)];
    }
    reference::moe_routing_weights(r, c);
    return r;
  }
};

// RMSNorm whose reduction depends on how many rows run together: from 16 rows on (the "batched"
// kernel) the sum of squares is accumulated in double, in index order; fewer rows run the
// reference. The same token gets other bits depending on the batch it runs in.
class BatchDependentNorm : public BugOps {
 public:
  BatchDependentNorm() : BugOps("batch_dependent_norm") {}
  T32 rms_norm(const T32& x, const T32& weight, double eps) const override {
    if (x.rank() != 2 || x.dim(0) < 16) return ref().rms_norm(x, weight, eps);
    T32 y = x;
    const int64_t n = x.dim(1);
    for (int64_t t = 0; t < x.dim(0); ++t) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x.at(t, i)) * x.at(t, i);
      const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
      for (int64_t i = 0; i < n; ++i) {
        y.at(t, i) = formats::round_to_bf16(weight.data()[static_cast<size_t>(i)] * (x.at(t, i) * r));
      }
    }
    return y;
  }
};

template <typename B>
std::function<std::unique_ptr<reference::seam::Ops>(const ModelConfig&)> plain() {
  return [](const ModelConfig&) { return std::unique_ptr<reference::seam::Ops>(new B()); };
}
template <typename B>
std::function<std::unique_ptr<reference::seam::Ops>(const ModelConfig&)> with_config() {
  return [](const ModelConfig& c) { return std::unique_ptr<reference::seam::Ops>(new B(c)); };
}

}  // namespace

std::function<std::unique_ptr<reference::seam::Ops>(const ModelConfig&)> zoo_ops_factory(const std::string& bug) {
  static const std::map<std::string, std::function<std::unique_ptr<reference::seam::Ops>(const ModelConfig&)>> table = {
      {"kv_quant_before_rope", with_config<KvQuantBeforeRope>()},
      {"e8m0_scale_floor", plain<E8m0ScaleFloor>()},
      {"e2m1_ties_away", plain<E2m1TiesAway>()},
      {"swapped_nibbles", plain<SwappedNibbles>()},
      {"indexer_rope_pairs", with_config<IndexerRopePairs>()},
      {"topk_window_offset", plain<TopkWindowOffset>()},
      {"topk_tie_higher_position", plain<TopkTieHigherPosition>()},
      {"reuse_wrong_owner", with_config<ReuseWrongOwner>()},
      {"compressed_position_off_by_one", with_config<CompressedPositionOffByOne>()},
      {"newest_block_not_pinned", plain<NewestBlockNotPinned>()},
      {"rope_tables_swapped", with_config<RopeTablesSwapped>()},
      {"compressor_partial_group_lost", plain<CompressorPartialGroupLost>()},
      {"mhc_pre_not_lagged", plain<MhcPreNotLagged>()},
      {"sinkhorn_one_short", plain<SinkhornOneShort>()},
      {"sink_in_numerator", plain<SinkInNumerator>()},
      {"engram_multiplier_off_by_one", plain<EngramMultiplierOffByOne>()},
      {"softmax_routing", plain<SoftmaxRouting>()},
      {"batch_dependent_norm", plain<BatchDependentNorm>()},
  };
  const auto it = table.find(bug);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace dsv41::scenarios::defects
