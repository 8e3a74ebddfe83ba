// scenarios/defects/small_bug_ops.cc
//
// The ops-level bugs of the small-bug zoo (scenarios/defects/small_bug_ops.h): each a BugOps that
// gets one op of one layer slightly wrong and forwards everything else to the CPU reference.
#include "scenarios/defects/small_bug_ops.h"

#include <cstdio>
#include <string>

#include "base/error.h"
#include "reference/checkpoint/weights.h"
#include "reference/ops/engram.h"
#include "reference/ops/indexer.h"
#include "reference/ops/moe.h"
#include "reference/ops/numerics.h"
#include "reference/ops/rmsnorm.h"
#include "scenarios/defects/bug_zoo_forwarding.h"

namespace dsv41::scenarios::defects {
namespace {

using formats::CacheFormat;
using reference::seam::Ops;
using reference::ModelConfig;
using reference::RopeTable;
using reference::Tensor;
using T32 = Tensor<float>;
using TU8 = Tensor<uint8_t>;

// "softmax_scale_x1.01": the BugOps name (a report's backend name).
std::string factor_label(const char* what, double factor) {
  char f[32];
  std::snprintf(f, sizeof f, "_x%g", factor);
  return what + std::string(f);
}

class SoftmaxScaleOff : public BugOps {
 public:
  SoftmaxScaleOff(int layer, double factor, const Ops& b)
      : BugOps(factor_label("softmax_scale", factor), b), layer_(layer), factor_(factor) {}
  T32 sparse_attn(const T32& q, const T32& window_kv, const reference::CacheRows& compressed, const T32& sink,
                  const Tensor<int32_t>& idxs, float softmax_scale) const override {
    const float s = current_layer() == layer_ ? static_cast<float>(softmax_scale * factor_) : softmax_scale;
    return base().sparse_attn(q, window_kv, compressed, sink, idxs, s);
  }

 private:
  int layer_;
  double factor_;
};

class RopeShift : public BugOps {
 public:
  RopeShift(const ModelConfig& c, int layer, RopeRows rows, int64_t shift, const Ops& b)
      : BugOps("rope_shift", b), c_(c), layer_(layer), rows_(rows), shift_(shift) {}
  void rope_rows(T32& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t stride,
                 bool inverse) const override {
    note_layer(rope);
    bool hit = !inverse && layer_of(rope) == layer_;
    if (rows_ == RopeRows::kQuery) {
      hit = hit && heads == c_.n_heads && x.dim(1) == c_.n_heads * c_.head_dim;
    } else {
      hit = hit && heads == 1 && x.dim(1) == c_.head_dim && stride == 1;
    }
    base().rope_rows(x, heads, rope, hit ? first_pos + shift_ : first_pos, stride, inverse);
  }

 private:
  ModelConfig c_;
  int layer_;
  RopeRows rows_;
  int64_t shift_;
};

// The weight tensor of a block's norm (its address names the norm: the model hands rms_norm the
// checkpoint's own tensor).
const T32& block_norm_weight(const reference::checkpoint::ModelWeights& w, int layer, BlockNorm norm) {
  DSV41_CHECK(layer >= 0 && layer < static_cast<int>(w.blocks.size()), "small bug: layer ", layer,
              " is not a block of the model (", w.blocks.size(), " blocks)");
  const reference::checkpoint::BlockWeights& b = w.blocks[static_cast<size_t>(layer)];
  switch (norm) {
    case BlockNorm::kAttnNorm: return b.attn_norm;
    case BlockNorm::kFfnNorm: return b.ffn_norm;
    case BlockNorm::kQNorm: return b.attn.q_norm;
    case BlockNorm::kKvNorm: return b.attn.kv_norm;
  }
  DSV41_FAIL("small bug: unknown block norm");
}

class NormBf16Statistic : public BugOps {
 public:
  NormBf16Statistic(int layer, BlockNorm norm, const Ops& b) : BugOps("norm_bf16_statistic", b), layer_(layer), norm_(norm) {}
  void prepare(const reference::checkpoint::ModelWeights& w, const std::vector<RopeTable>& rope) const override {
    BugOps::prepare(w, rope);
    target_ = &block_norm_weight(w, layer_, norm_);
  }
  T32 rms_norm(const T32& x_in, const T32& weight, double eps) const override {
    if (&weight != target_) return base().rms_norm(x_in, weight, eps);
    const T32 x = host(x_in);
    const int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
    T32 y(x.shape(), "rms_norm");
    for (int64_t r = 0; r < rows; ++r) {  // reference/ops/rmsnorm.h rms_norm_row, the statistic in bf16
      const float* xr = x.data().data() + r * n;
      float* yr = y.data().data() + r * n;
      const float s = reference::round_to_bf16(reference::rms_rsqrt_f32(xr, n, eps));
      for (int64_t i = 0; i < n; ++i) yr[i] = reference::round_to_bf16(weight.data()[static_cast<size_t>(i)] * (xr[i] * s));
    }
    return device(std::move(y));
  }

 private:
  int layer_;
  BlockNorm norm_;
  mutable const T32* target_ = nullptr;
};

// moe_experts (reference/ops/moe.cc) with one expert's weighted rows (or the shared expert's) times
// the factor, in fp32, before the official sum and its one bf16 rounding.
class ExpertScale : public BugOps {
 public:
  ExpertScale(int layer, int expert, double factor, const Ops& b)
      : BugOps(factor_label("expert_scale", factor), b), layer_(layer), expert_(expert), factor_(static_cast<float>(factor)) {}
  T32 moe_experts(const T32& x_in, const reference::MoeWeights& w, const reference::MoeRouting& routing_in,
                  const ModelConfig& c) const override {
    if (current_layer() != layer_) return base().moe_experts(x_in, w, routing_in, c);
    const T32 x = host(x_in);
    reference::MoeRouting routing{host(routing_in.experts), host(routing_in.weights), host(routing_in.scores)};
    // The experts' linears on the base (its fp8 linear: the tensor cores), the rest on the host.
    const reference::ExpertLinear lin = [this](const T32& in, const reference::LinearWeight& lw) {
      return host(base().linear(in, lw));
    };
    const int64_t T = x.dim(0), dim = x.dim(1);
    T32 acc({T, dim}, "moe.acc");  // fp32
    for (int e = 0; e < static_cast<int>(w.w1.size()); ++e) {
      const reference::ExpertBatch b = reference::expert_batch(x, routing, e);
      if (b.tokens.empty()) continue;
      const T32 ye = reference::expert_forward(b.rows, w.w1[e], w.w2[e], w.w3[e], b.weights.data(), c.swiglu_limit, lin);
      const float f = e == expert_ ? factor_ : 1.0f;
      for (size_t i = 0; i < b.tokens.size(); ++i) {
        for (int64_t d = 0; d < dim; ++d) acc.at(b.tokens[i], d) += f * ye.at(static_cast<int64_t>(i), d);
      }
    }
    const T32 shared = reference::expert_forward(x, w.s_w1, w.s_w2, w.s_w3, nullptr, c.swiglu_limit, lin);
    const float fs = expert_ < 0 ? factor_ : 1.0f;
    T32 y({T, dim}, "moe.y");
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < dim; ++d) y.at(t, d) = reference::round_to_bf16(acc.at(t, d) + fs * shared.at(t, d));
    }
    return device(std::move(y));
  }

 private:
  int layer_, expert_;
  float factor_;
};

// engram_gate_residual (reference/ops/engram.cc) with the gates times the factor.
class EngramGateScale : public BugOps {
 public:
  EngramGateScale(int layer, double factor, const Ops& b)
      : BugOps(factor_label("engram_gate", factor), b), layer_(layer), factor_(static_cast<float>(factor)) {}
  void prepare(const reference::checkpoint::ModelWeights& w, const std::vector<RopeTable>& rope) const override {
    BugOps::prepare(w, rope);
    DSV41_CHECK(layer_ >= 0 && layer_ < static_cast<int>(w.blocks.size()) && w.blocks[static_cast<size_t>(layer_)].has_engram,
                "small bug engram gate: layer ", layer_, " has no Engram");
    target_ = &w.blocks[static_cast<size_t>(layer_)].engram;
  }
  T32 engram_gate_residual(const T32& x_in, const T32& kv_in, const reference::EngramWeights& w, double eps) const override {
    if (&w != target_) return base().engram_gate_residual(x_in, kv_in, w, eps);
    const T32 x = host(x_in), kv = host(kv_in);
    const T32 gates = reference::engram_gates(x, kv, w.q_weight.data(), w.k_weight.data(), eps);  // [T, hc] fp32
    const int64_t tokens = x.dim(0), hc = x.dim(1), dim = x.dim(2);
    T32 out({tokens, hc, dim}, "engram_out");
    for (int64_t t = 0; t < tokens; ++t) {
      const float* value = kv.row(t) + hc * dim;
      for (int64_t c = 0; c < hc; ++c) {
        const float g = gates.at(t, c) * factor_;
        const float* h = x.row(t, c);
        float* o = out.row(t, c);
        for (int64_t d = 0; d < dim; ++d) o[d] = reference::round_to_bf16(h[d] + g * value[d]);
      }
    }
    return device(std::move(out));
  }

 private:
  int layer_;
  float factor_;
  mutable const reference::EngramWeights* target_ = nullptr;
};

// index_weights (reference/ops/indexer.cc) with its scale times the factor.
class IndexWeightScale : public BugOps {
 public:
  IndexWeightScale(int layer, double factor, const Ops& b)
      : BugOps(factor_label("index_weight_scale", factor), b), layer_(layer), factor_(factor) {}
  T32 index_weights(const T32& proj_in, int index_head_dim) const override {
    if (current_layer() != layer_) return base().index_weights(proj_in, index_head_dim);
    const T32 proj = host(proj_in);
    const float scale =
        static_cast<float>(reference::index_weight_scale(index_head_dim, static_cast<int>(proj.dim(1))) * factor_);
    T32 w(proj.shape(), "index_weights");
    for (int64_t i = 0; i < proj.numel(); ++i) {
      w.data()[static_cast<size_t>(i)] = reference::round_to_bf16(proj.data()[static_cast<size_t>(i)] * scale);
    }
    return device(std::move(w));
  }

 private:
  int layer_;
  double factor_;
};

class CompressorScoreScale : public BugOps {
 public:
  CompressorScoreScale(int layer, double factor, const Ops& b)
      : BugOps(factor_label("compressor_score", factor), b), layer_(layer), factor_(static_cast<float>(factor)) {}
  reference::CompressedLatents compress(const T32& kv, const T32& score, int64_t start_pos, int ratio, T32& kv_state,
                                        T32& score_state) const override {
    if (current_layer() != layer_) return base().compress(kv, score, start_pos, ratio, kv_state, score_state);
    T32 s = host(score);  // [T, D] fp32
    for (float& v : s.data()) v *= factor_;
    return base().compress(kv, device(std::move(s)), start_pos, ratio, kv_state, score_state);
  }

 private:
  int layer_;
  float factor_;
};

// The neighbouring valid scale code: one up, or one down from the largest finite code.
uint8_t neighbouring_scale(uint8_t code, CacheFormat f) {
  const uint8_t max_finite = f == CacheFormat::kCompressedKvFp4 ? 0x7E : 0xFE;  // E4M3 448; E8M0 2^127
  return code >= max_finite ? static_cast<uint8_t>(code - 1) : static_cast<uint8_t>(code + 1);
}
// An E2M1 code one magnitude step away from zero (toward it from 6), the sign kept.
uint8_t neighbouring_e2m1(uint8_t code) {
  const uint8_t sign = code & 0x8, mag = code & 0x7;
  return static_cast<uint8_t>(sign | (mag == 0x7 ? mag - 1 : mag + 1));
}

class CacheByte : public BugOps {
 public:
  CacheByte(int layer, CacheFormat f, CacheByteDefect what, const Ops& b)
      : BugOps("cache_byte", b), layer_(layer), format_(f), what_(what) {
    DSV41_CHECK(f != CacheFormat::kBf16, "small bug cache byte: a bf16 cache has no scale or code bytes");
    DSV41_CHECK(what == CacheByteDefect::kScaleByte || f != CacheFormat::kWindowKvFp8,
                "small bug cache byte: an E2M1 nibble needs an FP4 format, not ", formats::info(f).name);
  }
  void write_entries(TU8& storage, CacheFormat f, const std::vector<int64_t>& entries, const T32& rows) const override {
    base().write_entries(storage, f, entries, rows);
    if (done_ || f != format_ || current_layer() != layer_ || entries.empty()) return;
    done_ = true;
    const int64_t d = rows.dim(1);
    const bool fp4 = f != CacheFormat::kWindowKvFp8;
    TU8 bytes = host(storage);
    uint8_t* entry = bytes.row(entries.back());  // [values: d or d/2 bytes][scales]
    if (what_ == CacheByteDefect::kScaleByte) {
      uint8_t& s = entry[fp4 ? d / 2 : d];
      s = neighbouring_scale(s, f);
    } else {
      uint8_t& b = entry[0];  // element 0 in the low nibble (formats/packed.h)
      b = static_cast<uint8_t>((b & 0xF0) | neighbouring_e2m1(b & 0x0F));
    }
    storage = device(std::move(bytes));
  }

 private:
  int layer_;
  CacheFormat format_;
  CacheByteDefect what_;
  mutable bool done_ = false;
};

}  // namespace

std::unique_ptr<Ops> make_softmax_scale_ops(int layer, double factor, const Ops& base) {
  return std::make_unique<SoftmaxScaleOff>(layer, factor, base);
}
std::unique_ptr<Ops> make_rope_shift_ops(const ModelConfig& c, int layer, RopeRows rows, int64_t shift, const Ops& base) {
  return std::make_unique<RopeShift>(c, layer, rows, shift, base);
}
std::unique_ptr<Ops> make_norm_bf16_statistic_ops(int layer, BlockNorm norm, const Ops& base) {
  return std::make_unique<NormBf16Statistic>(layer, norm, base);
}
std::unique_ptr<Ops> make_expert_scale_ops(int layer, int expert, double factor, const Ops& base) {
  return std::make_unique<ExpertScale>(layer, expert, factor, base);
}
std::unique_ptr<Ops> make_engram_gate_scale_ops(int layer, double factor, const Ops& base) {
  return std::make_unique<EngramGateScale>(layer, factor, base);
}
std::unique_ptr<Ops> make_index_weight_scale_ops(int layer, double factor, const Ops& base) {
  return std::make_unique<IndexWeightScale>(layer, factor, base);
}
std::unique_ptr<Ops> make_compressor_score_scale_ops(int layer, double factor, const Ops& base) {
  return std::make_unique<CompressorScoreScale>(layer, factor, base);
}
std::unique_ptr<Ops> make_cache_byte_ops(int layer, CacheFormat format, CacheByteDefect what, const Ops& base) {
  return std::make_unique<CacheByte>(layer, format, what, base);
}

}  // namespace dsv41::scenarios::defects
