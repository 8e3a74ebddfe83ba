#include "reference/checkpoint/weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <map>
#include <set>
#include <utility>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/config_footprint.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference::checkpoint {
namespace {

using safetensors::SafetensorsFile;
using StEntry = safetensors::Entry;

int64_t cdiv32(int64_t v) { return (v + 31) / 32; }

struct SpecBuilder {
  std::vector<TensorSpec> specs;
  void add(const std::string& name, DType d, std::vector<int64_t> shape) {
    specs.push_back({name, d, std::move(shape)});
  }
  // An fp8 linear: weight [out, in] E4M3 + scale [ceil(out/32), ceil(in/32)] E8M0.
  void fp8(const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", DType::kF8E4M3, {out, in});
    add(p + ".scale", DType::kF8E8M0, {cdiv32(out), cdiv32(in)});
  }
  // An fp4 expert linear: weight [out, in] F4 (logical) + scale [out, in/32] E8M0.
  void fp4(const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", DType::kF4, {out, in});
    add(p + ".scale", DType::kF8E8M0, {out, in / 32});
  }
};

std::string block_prefix(const ModelConfig& c, int layer) {
  return layer < c.n_layers ? "layers." + std::to_string(layer) + "."
                            : "mtp." + std::to_string(layer - c.n_layers) + ".";
}

int n_experts(const ModelConfig& c, int layer) {
  return layer < c.n_layers || c.dspark_n_routed_experts == 0 ? c.n_routed_experts
                                                              : c.dspark_n_routed_experts;
}

bool contains(const std::vector<int>& v, int x) {
  for (int e : v) {
    if (e == x) return true;
  }
  return false;
}

int engram_index(const ModelConfig& c, int layer) {
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    if (c.engram_layer_ids[i] == layer) return static_cast<int>(i);
  }
  return -1;
}

// An entry's decoded values as a tensor of its shape, named by its checkpoint name.
Tensor<float> values_of(const StEntry& t) { return Tensor<float>(t.shape, t.to_f32(), t.name); }
// An entry's raw bytes (E4M3 / E8M0 codes) as a tensor of its shape.
Tensor<uint8_t> codes_of(const StEntry& t) { return Tensor<uint8_t>(t.shape, t.bytes, t.name); }

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& c, DType head_dtype) {
  DSV41_CHECK(head_dtype == DType::kF32 || head_dtype == DType::kBF16, "head dtype must be F32 or BF16");
  SpecBuilder b;
  const int64_t dim = c.dim, H = c.n_heads, D = c.head_dim, G = c.o_groups, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc;
  b.add("embed.weight", DType::kBF16, {c.vocab_size, dim});
  b.add("norm.weight", DType::kBF16, {dim});
  b.add("head.weight", head_dtype, {c.vocab_size, dim});
  for (int l = 0; l < c.total_layers(); ++l) {
    const std::string p = block_prefix(c, l);
    const bool backbone = l < c.n_layers;
    const int ratio = c.compress_ratios[static_cast<size_t>(l)];
    b.add(p + "attn_norm.weight", DType::kBF16, {dim});
    b.add(p + "ffn_norm.weight", DType::kBF16, {dim});
    for (const char* s : {"attn", "ffn"}) {
      b.add(p + "hc_" + s + "_fn", DType::kF32, {mix, hc * dim});
      b.add(p + "hc_" + s + "_base", DType::kF32, {mix});
      b.add(p + "hc_" + s + "_scale", DType::kF32, {3});
    }
    b.add(p + "attn.attn_sink", DType::kF32, {H});
    b.fp8(p + "attn.wq_a", c.q_lora_rank, dim);
    b.add(p + "attn.q_norm.weight", DType::kBF16, {c.q_lora_rank});
    b.fp8(p + "attn.wq_b", H * D, c.q_lora_rank);
    b.fp8(p + "attn.wkv", D, dim);
    b.add(p + "attn.kv_norm.weight", DType::kBF16, {D});
    b.add(p + "attn.wo_a.weight", DType::kBF16, {G * c.o_lora_rank, H * D / G});
    b.fp8(p + "attn.wo_b", dim, G * c.o_lora_rank);
    const bool kv_source = backbone && contains(c.kv_source_layers, l);
    const bool index_source = backbone && contains(c.index_source_layers, l);
    if (kv_source) {
      b.add(p + "attn.compressor.wkv.weight", ratio > 1 ? DType::kF32 : DType::kBF16, {D, dim});
      if (ratio > 1) b.add(p + "attn.compressor.wgate.weight", DType::kF32, {D, dim});
      b.add(p + "attn.compressor.norm.weight", DType::kBF16, {D});
    }
    if (index_source) {
      b.fp8(p + "attn.indexer.wq_b", int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank);
      b.add(p + "attn.indexer.weights_proj.weight", DType::kBF16, {c.index_n_heads, dim});
      if (kv_source) {
        b.add(p + "attn.indexer.wk.weight", DType::kBF16, {c.index_head_dim, D});
        b.add(p + "attn.indexer.k_norm.weight", DType::kBF16, {c.index_head_dim});
      }
    }
    const int E = n_experts(c, l);
    b.add(p + "ffn.gate.weight", DType::kBF16, {E, dim});
    b.add(p + "ffn.gate.bias", DType::kF32, {E});
    for (int e = 0; e < E; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      b.fp4(ep + "w1", c.moe_inter_dim, dim);
      b.fp4(ep + "w2", dim, c.moe_inter_dim);
      b.fp4(ep + "w3", c.moe_inter_dim, dim);
    }
    b.fp8(p + "ffn.shared_experts.w1", c.moe_inter_dim, dim);
    b.fp8(p + "ffn.shared_experts.w2", dim, c.moe_inter_dim);
    b.fp8(p + "ffn.shared_experts.w3", c.moe_inter_dim, dim);
    const int ei = backbone ? engram_index(c, l) : -1;
    if (ei >= 0) {
      const int64_t rows = c.engram_num_embeddings[static_cast<size_t>(ei)];
      const int64_t cols = int64_t{c.engram_max_ngram_size - 1} * c.engram_n_heads;
      b.add(p + "engram.embed.weight", DType::kF8E4M3, {rows, c.engram_head_dim});
      b.add(p + "engram.embed.scale", DType::kF8E8M0, {rows, c.engram_head_dim / 32});
      b.fp8(p + "engram.wkv", (hc + 1) * dim, cols * c.engram_head_dim);
      b.add(p + "engram.q_weight", DType::kBF16, {hc, dim});
      b.add(p + "engram.k_weight", DType::kBF16, {hc, dim});
    }
    if (!backbone && l == c.n_layers) {
      b.fp8(p + "main_proj", dim, dim * static_cast<int64_t>(c.dspark_target_layer_ids.size()));
      b.add(p + "main_norm.weight", DType::kBF16, {dim});
    }
    if (!backbone && l == c.total_layers() - 1) {
      b.add(p + "norm.weight", DType::kBF16, {dim});
      b.add(p + "markov_head.embed.weight", DType::kBF16, {c.vocab_size, c.dspark_markov_rank});
      b.add(p + "markov_head.head.weight", DType::kF32, {c.vocab_size, c.dspark_markov_rank});
      b.add(p + "confidence_head.proj.weight", DType::kF32, {1, dim + c.dspark_markov_rank});
    }
  }
  return b.specs;
}

ModelWeights ModelWeights::load(const std::string& path, const ModelConfig& c, bool pack_fp4) {
  return load(SafetensorsFile::read(path), c, pack_fp4);
}

ModelWeights ModelWeights::load(const SafetensorsFile& f, const ModelConfig& c, bool pack_fp4) {
  const std::string& path = f.path();
  const DType head_dtype = f.contains("head.weight") ? f.get("head.weight").dtype : DType::kF32;
  if (head_dtype != DType::kF32 && head_dtype != DType::kBF16) {
    DSV41_FAIL("weights file '", path, "': tensor 'head.weight' has dtype ",
               dtype_name(head_dtype), ", expected F32 or BF16");
  }
  const std::vector<TensorSpec> specs = expected_tensors(c, head_dtype);
  std::set<std::string> expected;
  for (const TensorSpec& s : specs) {
    f.get(s.name, s.dtype, s.shape);  // throws naming the tensor
    expected.insert(s.name);
  }
  for (const std::string& n : f.names()) {
    if (!expected.count(n)) {
      DSV41_FAIL("weights file '", path, "': unexpected tensor '", n,
                 "' (not part of the model for this config)");
    }
  }

  const int64_t dim = c.dim, H = c.n_heads, D = c.head_dim, G = c.o_groups;
  auto vec = [&](const std::string& n) { return values_of(f.get(n)); };
  auto lin = [&](const std::string& p, DType d, int64_t out, int64_t in) {
    return load_linear(f, p, d, out, in, pack_fp4);
  };

  ModelWeights w;
  w.embed = vec("embed.weight");
  w.norm = vec("norm.weight");
  w.head = lin("head", head_dtype, c.vocab_size, dim);
  if (head_dtype == DType::kBF16) w.head.dtype = DType::kF32;  // bf16 values widen exactly
  for (int l = 0; l < c.total_layers(); ++l) {
    const std::string p = block_prefix(c, l);
    const int ratio = c.compress_ratios[static_cast<size_t>(l)];
    BlockWeights bw;
    bw.layer = l;
    bw.attn_norm = vec(p + "attn_norm.weight");
    bw.ffn_norm = vec(p + "ffn_norm.weight");
    bw.hc_attn = {vec(p + "hc_attn_fn"), vec(p + "hc_attn_base"), vec(p + "hc_attn_scale")};
    bw.hc_ffn = {vec(p + "hc_ffn_fn"), vec(p + "hc_ffn_base"), vec(p + "hc_ffn_scale")};
    AttentionWeights& a = bw.attn;
    a.wq_a = lin(p + "attn.wq_a", DType::kF8E4M3, c.q_lora_rank, dim);
    a.q_norm = vec(p + "attn.q_norm.weight");
    a.wq_b = lin(p + "attn.wq_b", DType::kF8E4M3, H * D, c.q_lora_rank);
    a.wkv = lin(p + "attn.wkv", DType::kF8E4M3, D, dim);
    a.kv_norm = vec(p + "attn.kv_norm.weight");
    a.wo_a = lin(p + "attn.wo_a", DType::kBF16, G * c.o_lora_rank, H * D / G);
    a.wo_b = lin(p + "attn.wo_b", DType::kF8E4M3, dim, G * c.o_lora_rank);
    a.attn_sink = vec(p + "attn.attn_sink");
    const bool backbone = l < c.n_layers;
    a.has_compressor = backbone && contains(c.kv_source_layers, l);
    a.has_indexer = backbone && contains(c.index_source_layers, l);
    a.has_index_keys = a.has_compressor && a.has_indexer;
    if (a.has_compressor) {
      a.comp_wkv = lin(p + "attn.compressor.wkv", ratio > 1 ? DType::kF32 : DType::kBF16, D, dim);
      if (ratio > 1) a.comp_wgate = lin(p + "attn.compressor.wgate", DType::kF32, D, dim);
      a.comp_norm = vec(p + "attn.compressor.norm.weight");
    }
    if (a.has_indexer) {
      a.idx_wq_b = lin(p + "attn.indexer.wq_b", DType::kF8E4M3,
                       int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank);
      a.idx_weights_proj = lin(p + "attn.indexer.weights_proj", DType::kBF16, c.index_n_heads, dim);
      if (a.has_index_keys) {
        a.idx_wk = lin(p + "attn.indexer.wk", DType::kBF16, c.index_head_dim, D);
        a.idx_k_norm = vec(p + "attn.indexer.k_norm.weight");
      }
    }
    MoeWeights& m = bw.ffn;
    const int E = n_experts(c, l);
    m.gate = lin(p + "ffn.gate", DType::kBF16, E, dim);
    m.gate_bias = vec(p + "ffn.gate.bias");
    m.w1.resize(static_cast<size_t>(E));
    m.w2.resize(static_cast<size_t>(E));
    m.w3.resize(static_cast<size_t>(E));
    // The bulk of a layer's bytes: experts on the reference's threads; an error is the lowest
    // expert's, as a serial load would raise it.
    std::vector<std::exception_ptr> errors(static_cast<size_t>(E));
    parallel_for(E, [&](int64_t e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      const size_t i = static_cast<size_t>(e);
      try {
        m.w1[i] = lin(ep + "w1", DType::kF4, c.moe_inter_dim, dim);
        m.w2[i] = lin(ep + "w2", DType::kF4, dim, c.moe_inter_dim);
        m.w3[i] = lin(ep + "w3", DType::kF4, c.moe_inter_dim, dim);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
    for (const std::exception_ptr& err : errors) {
      if (err) std::rethrow_exception(err);
    }
    m.s_w1 = lin(p + "ffn.shared_experts.w1", DType::kF8E4M3, c.moe_inter_dim, dim);
    m.s_w2 = lin(p + "ffn.shared_experts.w2", DType::kF8E4M3, dim, c.moe_inter_dim);
    m.s_w3 = lin(p + "ffn.shared_experts.w3", DType::kF8E4M3, c.moe_inter_dim, dim);
    const int ei = backbone ? engram_index(c, l) : -1;
    if (ei >= 0) {
      bw.has_engram = true;
      EngramWeights& e = bw.engram;
      e.table = codes_of(f.get(p + "engram.embed.weight"));
      e.table_scale = codes_of(f.get(p + "engram.embed.scale"));
      const int64_t cols = int64_t{c.engram_max_ngram_size - 1} * c.engram_n_heads;
      e.wkv = lin(p + "engram.wkv", DType::kF8E4M3, (c.hc_mult + 1) * dim, cols * c.engram_head_dim);
      e.q_weight = vec(p + "engram.q_weight");
      e.k_weight = vec(p + "engram.k_weight");
    }
    w.blocks.push_back(std::move(bw));
  }
  if (c.n_mtp_layers > 0) {
    const std::string p0 = block_prefix(c, c.n_layers);
    const std::string pl = block_prefix(c, c.total_layers() - 1);
    w.dspark.main_proj = lin(p0 + "main_proj", DType::kF8E4M3, dim,
                             dim * static_cast<int64_t>(c.dspark_target_layer_ids.size()));
    w.dspark.main_norm = vec(p0 + "main_norm.weight");
    w.dspark.norm = vec(pl + "norm.weight");
    w.dspark.markov_embed = vec(pl + "markov_head.embed.weight");
    w.dspark.markov_head = lin(pl + "markov_head.head", DType::kF32, c.vocab_size, c.dspark_markov_rank);
    w.dspark.confidence_proj =
        lin(pl + "confidence_head.proj", DType::kF32, 1, dim + c.dspark_markov_rank);
  }
  return w;
}

LinearWeight load_linear(const SafetensorsFile& file, const std::string& prefix, DType dtype, int64_t out,
                         int64_t in, bool pack_fp4) {
  DSV41_CHECK(out > 0 && in > 0, "linear '", prefix, "': shape [", out, ", ", in, "] must be positive");
  LinearWeight lw;
  lw.name = prefix;
  lw.dtype = dtype;
  lw.out = out;
  lw.in = in;
  const std::string wname = prefix + ".weight", sname = prefix + ".scale";
  switch (dtype) {
    case DType::kF8E4M3:
      DSV41_CHECK(in % 32 == 0, "linear '", prefix, "': F8_E4M3 weights need in % 32 == 0 ",
                  "(act_quant blocks of 32), got in=", in);
      lw.w = file.get(wname, DType::kF8E4M3, {out, in}).to_f32();
      lw.scale = file.get(sname, DType::kF8E8M0, {cdiv32(out), cdiv32(in)}).to_f32();
      break;
    case DType::kF4:
      DSV41_CHECK(in % 32 == 0, "linear '", prefix, "': F4 weights need in % 32 == 0, got in=", in);
      if (pack_fp4) lw.packed = file.get(wname, DType::kF4, {out, in}).bytes;  // [out, in/2]
      else lw.w = file.get(wname, DType::kF4, {out, in}).to_f32();
      lw.scale = file.get(sname, DType::kF8E8M0, {out, in / 32}).to_f32();
      break;
    case DType::kBF16:
    case DType::kF32:
      lw.w = file.get(wname, dtype, {out, in}).to_f32();
      DSV41_CHECK(!file.contains(sname), "linear '", prefix, "': a ", dtype_name(dtype),
                  " weight has no scale, but the file holds '", sname, "'");
      break;
    default:
      DSV41_FAIL("linear '", prefix, "': weight dtype ", dtype_name(dtype),
                 " is not a linear weight dtype (F8_E4M3, F4, BF16, F32)");
  }
  for (size_t i = 0; i < lw.scale.size(); ++i) {
    DSV41_CHECK(!std::isnan(lw.scale[i]), "linear '", prefix, "': scale element ", i,
                " is the E8M0 NaN code 0xFF");
  }
  return lw;
}

EngramTableRef engram_table(const safetensors::Entry& weight, const safetensors::Entry& scale) {
  DSV41_CHECK(weight.dtype == DType::kF8E4M3 && weight.shape.size() == 2, "engram table '",
              weight.name, "' must be F8_E4M3 [rows, head_dim], got ",
              dtype_name(weight.dtype), " ", shape_string(weight.shape));
  const int64_t rows = weight.shape[0];
  const int64_t head_dim = weight.shape[1];
  DSV41_CHECK(head_dim % 32 == 0 && head_dim > 0, "engram table '", weight.name, "': head_dim ",
              head_dim, " is not a positive multiple of 32");
  DSV41_CHECK(
      scale.dtype == DType::kF8E8M0 && scale.shape == std::vector<int64_t>({rows, head_dim / 32}),
      "engram table scale '", scale.name, "' must be F8_E8M0 [", rows, ", ", head_dim / 32,
      "], got ", dtype_name(scale.dtype), " ", shape_string(scale.shape));
  return reference::engram_table(weight.bytes, scale.bytes, rows, static_cast<int>(head_dim));
}

// ---------------------------------------------------------------- generator

int64_t uniform_numerator(uint64_t draw) { return static_cast<int64_t>(draw >> 40) - (int64_t{1} << 23); }

uint8_t generated_fp4_code(int64_t k) {
  // |6 k 2^-23| grows with |k| and E2M1 rounding is monotone, so the magnitude code is the number
  // of thresholds |k| reaches: thr[c] = the least |k| whose code is > c, found once by bisection
  // with the encoder itself. The sign: 6 k 2^-23 is negative for k < 0 (a zero magnitude keeps its
  // sign: 0x8), and k = 0 is +0.
  static const std::array<int64_t, 7> thr = [] {
    std::array<int64_t, 7> t{};
    for (uint8_t c = 0; c < 7; ++c) {
      int64_t lo = 0, hi = int64_t{1} << 23;  // code(lo) <= c < code(hi) (|6 * 1| = 6 is code 7)
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        const uint8_t code = formats::e2m1_encode(6.0f * (static_cast<float>(mid) * 0x1p-23f));
        (code > c ? hi : lo) = mid;
      }
      t[c] = hi;
    }
    return t;
  }();
  const int64_t a = k < 0 ? -k : k;
  int mag = 0;  // the thresholds reached, counted without branches (the draws are random)
  for (int c = 0; c < 7; ++c) mag += static_cast<int>(a >= thr[static_cast<size_t>(c)]);
  return static_cast<uint8_t>((k < 0 ? 0x8 : 0) | mag);
}

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a fixed, portable stream.
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) with 24 random bits: exact in fp32 (uniform_numerator(next()) * 2^-23).
  float uniform() { return static_cast<float>(uniform_numerator(next())) * 0x1p-23f; }
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001B3ull;
  }
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The value-per-draw dtypes (F32, BF16, F8_E4M3, F4): element i takes draw i of the tensor's
// stream, so a range of elements can be made on its own (SplitMix64 jumps: after i draws the state
// is s0 + i * gamma) and a large tensor is made in parallel chunks, the same bytes as in one pass.
bool one_draw_per_value(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF8E4M3 || d == DType::kF4;
}

// Elements [first, last) of spec s (first even for F4) into out (the tensor's bytes).
void fill_values(const TensorSpec& s, uint64_t s0, int64_t first, int64_t last, uint8_t* out) {
  SplitMix64 rng{s0 + static_cast<uint64_t>(first) * 0x9E3779B97F4A7C15ull};
  const int64_t in = s.shape.size() >= 2 ? s.shape.back() : 1;
  const float spread = 1.0f / std::sqrt(static_cast<float>(in));
  const bool is_norm = ends_with(s.name, "norm.weight") || ends_with(s.name, "q_weight") ||
                       ends_with(s.name, "k_weight");
  switch (s.dtype) {
    case DType::kF32:
    case DType::kBF16: {
      // The distribution is chosen once per tensor (by name).
      enum { kNorm, kScale, kSmall, kUnit, kSpread } kind = kSpread;
      if (is_norm) kind = kNorm;
      else if (ends_with(s.name, "_scale")) kind = kScale;
      else if (ends_with(s.name, "_base") || ends_with(s.name, "bias") || ends_with(s.name, "attn_sink")) kind = kSmall;
      else if (s.name == "embed.weight" || ends_with(s.name, "markov_head.embed.weight")) kind = kUnit;
      const float spread3 = spread * std::sqrt(3.0f);  // spread * sqrt(3) * u, left to right
      const int width = s.dtype == DType::kF32 ? 4 : 2;
      for (int64_t i = first; i < last; ++i) {
        const float u = rng.uniform();
        float v;
        switch (kind) {
          case kNorm: v = 1.0f + 0.25f * u; break;
          case kScale: v = 0.5f + 0.25f * u; break;
          case kSmall: v = 0.5f * u; break;
          case kUnit: v = u; break;
          default: v = spread3 * u; break;
        }
        const uint32_t b = width == 4 ? f32_bits(v) : formats::bf16_encode(v);
        for (int k = 0; k < width; ++k) out[i * width + k] = static_cast<uint8_t>(b >> (8 * k));
      }
      break;
    }
    case DType::kF8E4M3:  // codes of ~U(-64, 64); the .scale tensor sets the magnitude
      for (int64_t i = first; i < last; ++i) out[i] = formats::e4m3_encode_satfinite(64.0f * rng.uniform());
      break;
    case DType::kF4:  // codes of ~U(-6, 6): e2m1_encode(6.0f * rng.uniform()), by its thresholds
      for (int64_t i = first; i < last; i += 2) {
        const uint8_t lo = generated_fp4_code(uniform_numerator(rng.next()));
        const uint8_t hi = generated_fp4_code(uniform_numerator(rng.next()));
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      break;
    default:
      DSV41_FAIL("generate_weights: '", s.name, "' is not a value-per-draw tensor");
  }
}

// A tensor of at least this many values is made in parallel chunks of kChunkValues.
constexpr int64_t kParallelValues = int64_t{1} << 22, kChunkValues = int64_t{1} << 20;

// Values for one tensor: the name decides the distribution (norm weights near 1, sinks and
// biases small, matrices uniform with a 1/sqrt(in) spread; quantized tensors store codes whose
// scale bytes put the dequantized spread at 1/sqrt(in)).
StEntry make_tensor(const TensorSpec& s, uint64_t seed) {
  const uint64_t s0 = seed ^ fnv1a(s.name);
  SplitMix64 rng{s0};
  StEntry t;
  t.name = s.name;
  t.dtype = s.dtype;
  t.shape = s.shape;
  const int64_t n = t.numel();
  switch (s.dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF4: {
      t.bytes.resize(static_cast<size_t>(stored_bytes(s.dtype, n)));
      if (n < kParallelValues) {
        fill_values(s, s0, 0, n, t.bytes.data());
      } else {  // (serial when called inside a parallel_for, reference/ops/numerics.h)
        parallel_for((n + kChunkValues - 1) / kChunkValues, [&](int64_t c) {
          fill_values(s, s0, c * kChunkValues, std::min(n, (c + 1) * kChunkValues), t.bytes.data());
        });
      }
      break;
    }
    case DType::kF8E8M0: {
      // The scales of a weight whose codes are ~U(-64, 64) (fp8, rms 64/sqrt(3)) or E2M1 codes of
      // ~U(-6, 6) (fp4, rms ~6/sqrt(3)), so that the dequantized rms is ~1/sqrt(in) (the weight's
      // `in` is 32 x the scale columns). The Engram table is an embedding, not a linear: its
      // target rms is that of embed.weight, 1/sqrt(3). With target = 2^e * r, e the nearest
      // exponent (r in [1/sqrt(2), sqrt(2))), each scale is 2^(e-1) or 2^(e+1): exactly
      // round(q n) low ones, q/4 + 4(1 - q) = r^2 (the mean square is the target's), at positions
      // shuffled by the tensor's stream. So every scale tensor holds two values in a random
      // pattern (a port that applies the wrong block's scale is caught), whatever the target.
      const bool fp4 = s.shape.size() == 2 && s.name.find("experts.") != std::string::npos &&
                       s.name.find("shared_experts") == std::string::npos;
      const double code_rms = (fp4 ? 6.0 : 64.0) / std::sqrt(3.0);
      const double w_in = 32.0 * static_cast<double>(s.shape.back());
      const double target_rms =
          ends_with(s.name, "engram.embed.scale") ? 1.0 / std::sqrt(3.0) : 1.0 / std::sqrt(w_in);
      int x = 0;
      const double m = std::frexp(target_rms / code_rms, &x);  // target = m 2^x, m in [0.5, 1)
      const bool below = m * m < 0.5;
      const int e = below ? x - 1 : x;
      const double r = below ? 2.0 * m : m;
      const double q = (4.0 - r * r) / 3.75;  // in (0.53, 0.94]
      const int64_t low = static_cast<int64_t>(std::floor(q * static_cast<double>(n) + 0.5));
      t.bytes.reserve(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) t.bytes.push_back(static_cast<uint8_t>(127 + e + (i < low ? -1 : 1)));
      for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates with the tensor's stream
        const int64_t j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
        std::swap(t.bytes[static_cast<size_t>(i)], t.bytes[static_cast<size_t>(j)]);
      }
      break;
    }
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      DSV41_FAIL("generate_weights: no integer tensors expected ('", s.name, "')");
  }
  return t;
}

}  // namespace

std::vector<StEntry> generate_weights(const ModelConfig& c, uint64_t seed) {
  // Sizes checked before anything is allocated (reference/ops/config_footprint.h, issue 35).
  check_fits_machine(c, "generated weights of config " + config_hash(c));
  const std::vector<TensorSpec> specs = expected_tensors(c);
  std::vector<StEntry> out(specs.size());
  std::vector<size_t> small;  // made over tensors; the large ones each over chunks of values
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool large = one_draw_per_value(specs[i].dtype) && Tensor<float>::count(specs[i].shape) >= kParallelValues;
    if (large) out[i] = make_tensor(specs[i], seed);
    else small.push_back(i);
  }
  parallel_for(static_cast<int64_t>(small.size()), [&](int64_t k) {
    const size_t i = small[static_cast<size_t>(k)];
    out[i] = make_tensor(specs[i], seed);
  });
  return out;
}

StEntry generate_tensor(const TensorSpec& spec, uint64_t seed) { return make_tensor(spec, seed); }

}  // namespace dsv41::reference::checkpoint
