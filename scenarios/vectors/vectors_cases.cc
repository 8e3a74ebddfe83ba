// scenarios/vectors/vectors_cases.cc
//
// The conformance vector cases (scenarios/vectors/vectors.h): the case machinery (CaseSet: names, seeds,
// generated weights, expected outputs by the reference port) and the dense ops: the linears
// (fp8, fp4, bf16, fp32, grouped), rms_norm, rope_rows, the cache formats (qdq, write_entries,
// read_entries) and the compressor (a group split across two calls, the state resumed).
#include <cmath>

#include "base/error.h"
#include "formats/minifloat.h"
#include "reference/ops/kv_quant.h"
#include "reference/seam/ops.h"
#include "reference/ops/rope.h"
#include "reference/checkpoint/weights.h"
#include "scenarios/vectors/vectors.h"
#include "scenarios/vectors/vectors_internal.h"

namespace dsv41::scenarios::vectors {

using reference::DType;
using reference::Tensor;
namespace st = reference::checkpoint::safetensors;

namespace vectors_detail {

namespace {

uint64_t mix(uint64_t x) {  // SplitMix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ULL;
  return h;
}

}  // namespace

Tensor<float> CaseRng::bf16(const std::vector<int64_t>& shape, double scale, const std::string& name) {
  Tensor<float> t(shape, name);
  for (float& v : t.data()) v = formats::round_to_bf16(static_cast<float>(scale * uniform()));
  return t;
}

CaseSet::CaseSet(std::string size, uint64_t seed)
    : size_(std::move(size)), seed_(seed), config_(vector_size_config(size_)) {}

VectorCase CaseSet::begin(const std::string& op, const std::string& variant, const std::string& description,
                          const std::string& adversarial) {
  VectorCase c;
  c.name = size_ + "." + op + (variant.empty() ? "" : "." + variant);
  c.op = op;
  c.size = size_;
  c.seed = mix(seed_ ^ fnv1a(c.name));
  c.description = description;
  c.adversarial = adversarial;
  c.tolerance = 0;
  c.tolerance_origin =
      "stated: bit-exact; the reference is deterministic and the op's semantics are exact given equal inputs "
      "(docs/conform.md, docs/numerics.md)";
  return c;
}

void CaseSet::finish(VectorCase c) {
  const st::SafetensorsFile in = st::SafetensorsFile::from_entries(c.name, c.tensors, vector_metadata(c));
  for (st::Entry& out : run_vector_case(reference::seam::reference_ops(), in)) {
    if (out.dtype == DType::kF32) {
      for (const float v : out.to_f32()) DSV41_CHECK(!std::isnan(v), "vectors: case ", c.name, " gives NaN in ", out.name);
    }
    c.tensors.push_back(std::move(out));
  }
  cases_.push_back(std::move(c));
}

std::vector<st::Entry> CaseSet::last_outputs() const {
  DSV41_CHECK(!cases_.empty(), "vectors: no case finished yet");
  std::vector<st::Entry> out;
  for (const st::Entry& e : cases_.back().tensors) {
    if (e.name.rfind("out.", 0) == 0) out.push_back(e);
  }
  return out;
}

void CaseSet::add_weight(VectorCase& c, const std::string& as, const std::string& ckpt, DType dtype, int64_t out,
                         int64_t in) const {
  st::Entry w = reference::checkpoint::generate_tensor({ckpt + ".weight", dtype, {out, in}}, c.seed);
  w.name = "in." + as + ".weight";
  c.tensors.push_back(std::move(w));
  if (dtype == DType::kF8E4M3 || dtype == DType::kF4) {
    const std::vector<int64_t> shape =
        dtype == DType::kF4 ? std::vector<int64_t>{out, in / 32} : std::vector<int64_t>{(out + 31) / 32, (in + 31) / 32};
    st::Entry s = reference::checkpoint::generate_tensor({ckpt + ".scale", DType::kF8E8M0, shape}, c.seed);
    s.name = "in." + as + ".scale";
    c.tensors.push_back(std::move(s));
  }
}

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// A ratio > 0 layer of the config (its first), and its ratio.
int compressed_layer(const reference::ModelConfig& c, int ratio) {
  for (size_t l = 0; l < c.compress_ratios.size(); ++l) {
    if (c.compress_ratios[l] == ratio) return static_cast<int>(l);
  }
  DSV41_FAIL("vectors: the config has no layer of ratio ", ratio);
}

void add_linear_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t T = s.tokens();
  struct L {
    const char* op;
    const char* variant;
    std::string ckpt;
    DType dtype;
    int64_t out, in;
    const char* what;
  };
  const int kv_layer = compressed_layer(c, 2);
  std::vector<L> ls = {
      {"linear", "fp8", "layers.0.attn.wkv", DType::kF8E4M3, c.head_dim, c.dim,
       "y = bf16(x W^T), W F8_E4M3 with E8M0 block scales (128-element blocks of 32 x 32 scales), x quantized per "
       "the official act_quant"},
      {"linear", "fp4", "layers.0.ffn.experts.0.w1", DType::kF4, c.moe_inter_dim, c.dim,
       "y = bf16(x W^T), W packed E2M1 (two per byte, element 2k low nibble) with E8M0 scales per 32 inputs"},
      {"linear", "bf16", "layers." + str(kv_layer) + ".attn.indexer.weights_proj", DType::kBF16, c.index_n_heads, c.dim,
       "y = bf16(x W^T), W bf16"},
      {"linear_fp32", "compressor", "layers." + str(kv_layer) + ".attn.compressor.wgate", DType::kF32, c.head_dim, c.dim,
       "y = x W^T in fp32 (fma chain in index order), not rounded: the ratio-2 compressor's projections"},
  };
  if (!s.released()) {
    ls.push_back({"linear_fp32", "head", "head", DType::kF32, c.vocab_size, c.dim, "the fp32 head: logits = x W^T"});
  }
  for (const L& l : ls) {
    VectorCase v = s.begin(l.op, l.variant, l.what, "");
    CaseRng rng(v.seed);
    Tensor<float> x = rng.bf16({T, l.in}, 2.0, "x");
    for (int64_t i = 0; i < l.in; ++i) x.at(0, i) = 0.0f;  // an all-zero row (act_quant's zero amax)
    v.adversarial = "row 0 is all zeros (the activation block's amax is 0)";
    v.tensors.push_back(f32_entry("in.x", x));
    s.add_weight(v, "w", l.ckpt, l.dtype, l.out, l.in);
    s.finish(std::move(v));
  }
  if (!s.released()) {  // wo_a: [G * o_lora, H * D / G] bf16 (67 MB at released dims)
    VectorCase v = s.begin("grouped_linear", "wo_a", "per group g: y_g = bf16(x_g W_g^T), W bf16 [G * o_lora, H*D/G]", "");
    CaseRng rng(v.seed);
    v.tensors.push_back(f32_entry("in.x", rng.bf16({T, c.n_heads * c.head_dim}, 1.0, "x")));
    s.add_weight(v, "w", "layers.0.attn.wo_a", DType::kBF16, int64_t{c.o_groups} * c.o_lora_rank,
                 int64_t{c.n_heads} * c.head_dim / c.o_groups);
    v.params["groups"] = str(c.o_groups);
    s.finish(std::move(v));
  }
}

void add_norm_rope_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t T = s.tokens();
  {
    VectorCase v = s.begin("rms_norm", "", "y = bf16(weight * (x * rsqrt(mean(x^2) + eps)))",
                           "row 0 is all zeros (rsqrt of eps = 1e-20 alone)");
    CaseRng rng(v.seed);
    Tensor<float> x = rng.bf16({T, c.dim}, 3.0, "x");
    for (int64_t i = 0; i < c.dim; ++i) x.at(0, i) = 0.0f;
    v.tensors.push_back(f32_entry("in.x", x));
    Tensor<float> w({c.dim}, "weight");
    for (float& e : w.data()) e = formats::round_to_bf16(static_cast<float>(1.0 + 0.25 * rng.uniform()));
    v.tensors.push_back(f32_entry("in.weight", w));
    v.params["eps"] = real_string(c.norm_eps);
    s.finish(std::move(v));
  }
  const int ratio = 2;
  for (const bool compressed : {false, true}) {
    const reference::RopeParams p =
        reference::rope_params(c, compressed ? reference::RopeKind::kCompressed : reference::RopeKind::kWindow);
    VectorCase v = s.begin(
        "rope_rows", compressed ? "compressed_inverse" : "window",
        compressed ? "the conjugate rotation (the attention output's tail) with the compressed layers' theta and YaRN, "
                     "compressed rows at positions first_pos + t * ratio"
                   : "RoPE on the last rope_dim channels of every head, the window layers' theta, no YaRN",
        compressed ? "positions near max_seq_len, stride = the compression ratio, inverse"
                   : "positions near max_seq_len (the table's last rows)");
    CaseRng rng(v.seed);
    const int64_t heads = c.n_heads;
    const int64_t stride = compressed ? ratio : 1;
    const int64_t first = p.max_seq_len - T * stride;
    v.tensors.push_back(f32_entry("in.x", rng.bf16({T, heads * c.head_dim}, 1.0, "x")));
    v.params = {{"heads", str(heads)},          {"first_pos", str(first)},
                {"pos_stride", str(stride)},    {"inverse", compressed ? "1" : "0"},
                {"rope_dim", str(p.rope_dim)},  {"max_seq_len", str(p.max_seq_len)},
                {"original_seq_len", str(p.original_seq_len)}, {"base", real_string(p.base)},
                {"factor", real_string(p.factor)}, {"beta_fast", str(p.beta_fast)},
                {"beta_slow", str(p.beta_slow)}};
    s.finish(std::move(v));
  }
}

// The cache formats: values per entry of each.
struct FormatCase {
  formats::CacheFormat format;
  int64_t dim;
};

std::vector<FormatCase> formats_of(const reference::ModelConfig& c) {
  return {{formats::CacheFormat::kWindowKvFp8, c.head_dim},
          {formats::CacheFormat::kCompressedKvFp4, c.head_dim},
          {formats::CacheFormat::kIndexKeysFp4, c.index_head_dim},
          {formats::CacheFormat::kBf16, c.head_dim}};
}

// Rows with the formats' edge cases: row 0 all zeros, row 1 with one large value per block (the
// scale's rounding), the rest ordinary.
Tensor<float> cache_rows(CaseRng& rng, int64_t n, int64_t dim) {
  Tensor<float> x = rng.bf16({n, dim}, 1.0, "rows");
  for (int64_t i = 0; i < dim; ++i) x.at(0, i) = 0.0f;
  if (n > 1) {
    for (int64_t i = 0; i < dim; i += 32) x.at(1, i) = formats::round_to_bf16(448.0f * 3.0f);
  }
  return x;
}

void add_cache_cases(CaseSet& s) {
  const auto& c = s.config();
  const int64_t W = c.window_size;
  for (const FormatCase& f : formats_of(c)) {
    const std::string fmt = formats::info(f.format).name;
    const int64_t eb = formats::entry_bytes(f.format, static_cast<int>(f.dim));
    {
      VectorCase v = s.begin("qdq", fmt, "the values a cache of this format returns: unpack(pack(x)) per row",
                             "row 0 all zeros, row 1 one large value per 32-block (1344: the scale's rounding)");
      CaseRng rng(v.seed);
      v.tensors.push_back(f32_entry("in.x", cache_rows(rng, 6, f.dim)));
      v.params["format"] = fmt;
      s.finish(std::move(v));
    }
    // A window ring of W entries: 6 rows written at the slots of positions 3W - 3 .. 3W + 2
    // (slot = position % W), so the writes wrap from slot W - 3 to slot 2.
    std::vector<int64_t> slots;
    for (int64_t p = 3 * W - 3; p < 3 * W + 3; ++p) slots.push_back(p % W);
    {
      VectorCase v = s.begin("write_entries", fmt, "packs row i into entry entries[i]; other entries keep their bytes",
                             "window wrap-around: entries W-3, W-2, W-1, 0, 1, 2 of a ring of W; the storage starts "
                             "with random bytes the op must not touch");
      CaseRng rng(v.seed);
      Tensor<uint8_t> storage({W, eb}, "storage");
      for (uint8_t& b : storage.data()) b = static_cast<uint8_t>(rng.below(256));
      v.tensors.push_back(u8_entry("in.storage", storage));
      v.tensors.push_back(i64_entry("in.entries", {static_cast<int64_t>(slots.size())}, slots));
      v.tensors.push_back(f32_entry("in.rows", cache_rows(rng, static_cast<int64_t>(slots.size()), f.dim)));
      v.params["format"] = fmt;
      s.finish(std::move(v));
    }
    {
      VectorCase v = s.begin("read_entries", fmt, "entries dequantized -> [n, dim] bf16 values",
                             "oldest-first ring order across the wrap (W-3 .. W-1, 0 .. 2), a repeated entry");
      CaseRng rng(v.seed);
      Tensor<uint8_t> storage({W, eb}, "storage");
      std::vector<int64_t> all(static_cast<size_t>(W));
      for (int64_t i = 0; i < W; ++i) all[static_cast<size_t>(i)] = i;
      reference::write_entries(storage, f.format, all, cache_rows(rng, W, f.dim));
      std::vector<int64_t> read = slots;
      read.push_back(slots.front());
      v.tensors.push_back(u8_entry("in.storage", storage));
      v.tensors.push_back(i64_entry("in.entries", {static_cast<int64_t>(read.size())}, read));
      v.params = {{"cache_format", fmt}, {"cache_dim", str(f.dim)}, {"cache_count", str(W)}};
      s.finish(std::move(v));
    }
  }
}

// The ratio-2 compressor across a chunk boundary and a resume: part 1 feeds positions 0..4 (groups
// 0, 1 complete, position 4 waits in the state); part 2 starts from part 1's out.kv_state /
// out.score_state (serialized and restored) and feeds positions 5..8 (group 2 = positions 4 | 5
// completes across the boundary, group 3, position 8 waits).
void add_compress_cases(CaseSet& s) {
  const auto& c = s.config();
  const int ratio = 2;
  const int64_t D = c.head_dim;
  Tensor<float> kv_state({ratio, D}, "kv_state", 0.0f);
  Tensor<float> score_state({ratio, D}, "score_state", -INFINITY);
  struct Part {
    const char* variant;
    int64_t start, T;
    const char* adversarial;
  };
  const Part parts[] = {
      {"split_part1", 0, 5, "a group split across chunks: position 4 (group 2's first half) is left in the state"},
      {"split_part2_resume", 5, 4,
       "resume boundary: the state is part 1's out.kv_state / out.score_state, serialized and restored; group 2 "
       "completes with position 5; the state's unwritten slot holds score -inf"},
  };
  for (const Part& p : parts) {
    VectorCase v = s.begin("compress", p.variant,
                           "ratio-2 pooling: per channel a softmax over the group's scores weighs its kv rows; the "
                           "trailing partial group waits in the state (slot = position % ratio)",
                           p.adversarial);
    CaseRng rng(v.seed);
    v.tensors.push_back(f32_entry("in.kv", rng.bf16({p.T, D}, 2.0, "kv")));
    v.tensors.push_back(f32_entry("in.score", rng.bf16({p.T, D}, 4.0, "score")));
    v.tensors.push_back(f32_entry("in.kv_state", kv_state));
    v.tensors.push_back(f32_entry("in.score_state", score_state));
    v.params = {{"start_pos", str(p.start)}, {"ratio", str(ratio)}};
    s.finish(std::move(v));
    // The next part resumes from this part's expected state.
    const st::SafetensorsFile out = st::SafetensorsFile::from_entries("part", s.last_outputs());
    kv_state = get_f32(out, "out.kv_state");
    score_state = get_f32(out, "out.score_state");
  }
}

}  // namespace

void add_dense_cases(CaseSet& s) {
  add_linear_cases(s);
  add_norm_rope_cases(s);
  add_cache_cases(s);
  add_compress_cases(s);
}

}  // namespace vectors_detail

std::vector<VectorCase> make_vector_cases(const std::string& size, uint64_t seed) {
  vectors_detail::CaseSet s(size, seed);
  vectors_detail::add_dense_cases(s);
  vectors_detail::add_model_cases(s);
  return s.take();
}

}  // namespace dsv41::scenarios::vectors
