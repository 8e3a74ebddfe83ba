// reference/ops/rope.cc
//
// precompute_freqs_cis and apply_rotary_emb (rope.h states every rounding step).
#include "reference/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "base/error.h"
#include "formats/minifloat.h"

namespace dsv41::reference {
namespace {

// YaRN: the dimension whose wavelength makes `rotations` turns over the training context,
// in double exactly as the official Python expression evaluates it.
double corrected_dim(const RopeParams& p, int64_t rotations) {
  const double turns = static_cast<double>(rotations * 2) * std::numbers::pi;
  return static_cast<double>(p.rope_dim) * std::log(static_cast<double>(p.original_seq_len) / turns) /
         (2.0 * std::log(p.base));
}

// freqs: [rd/2] fp32, before positions (rope.h, "Table").
std::vector<float> base_freqs(const RopeParams& p) {
  const int64_t half = p.rope_dim / 2;
  const float base_f = static_cast<float>(p.base);
  const float rd_f = static_cast<float>(p.rope_dim);
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / rd_f;  // arange(0, rd, 2, fp32) / rd
    // base ** e in fp32: the correctly rounded power (double pow, one rounding to fp32).
    const float power = static_cast<float>(std::pow(static_cast<double>(base_f), static_cast<double>(e)));
    f[static_cast<size_t>(i)] = 1.0f / power;
  }
  if (p.original_seq_len > 0) {
    const int64_t low = std::max<int64_t>(static_cast<int64_t>(std::floor(corrected_dim(p, p.beta_fast))), 0);
    const int64_t high =
        std::min<int64_t>(static_cast<int64_t>(std::ceil(corrected_dim(p, p.beta_slow))), p.rope_dim - 1);
    // max(high - low, 1e-3): an integer when >= 1, else the Python float 0.001; used as fp32.
    const float span = high - low >= 1 ? static_cast<float>(high - low) : static_cast<float>(1e-3);
    const float factor = static_cast<float>(p.factor);
    for (int64_t i = 0; i < half; ++i) {
      float ramp = (static_cast<float>(i) - static_cast<float>(low)) / span;
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      const float fi = f[static_cast<size_t>(i)];
      const float extrapolated = (fi / factor) * (1.0f - smooth);
      const float kept = fi * smooth;
      f[static_cast<size_t>(i)] = extrapolated + kept;
    }
  }
  return f;
}

}  // namespace

const char* name(RopeKind k) { return k == RopeKind::kWindow ? "window" : "compressed"; }

RopeParams rope_params(const ModelConfig& c, RopeKind kind) {
  RopeParams p;
  p.rope_dim = c.rope_head_dim;
  p.max_seq_len = c.max_seq_len;
  p.factor = c.rope_factor;
  p.beta_fast = c.beta_fast;
  p.beta_slow = c.beta_slow;
  if (kind == RopeKind::kCompressed) {
    p.original_seq_len = c.original_seq_len;
    p.base = c.compress_rope_theta;
  } else {
    p.original_seq_len = 0;  // the official code disables YaRN on sliding-window-only layers
    p.base = c.rope_theta;
  }
  return p;
}

RopeTable RopeTable::for_layer(const ModelConfig& c, int layer) {
  DSV41_CHECK(layer >= 0 && layer < static_cast<int>(c.compress_ratios.size()), "rope: layer ", layer,
              " outside the ", c.compress_ratios.size(), " entries of compress_ratios");
  const RopeKind kind = c.compress_ratios[static_cast<size_t>(layer)] > 0 ? RopeKind::kCompressed
                                                                            : RopeKind::kWindow;
  return make(c, kind);
}

RopeTable::RopeTable(const RopeParams& p) : params_(p) {
  DSV41_CHECK(p.rope_dim > 0 && p.rope_dim % 2 == 0, "rope: rope_dim must be even and positive, got ",
              p.rope_dim);
  DSV41_CHECK(p.max_seq_len > 0 && p.max_seq_len <= (int64_t{1} << 24), "rope: max_seq_len=",
              p.max_seq_len, " outside [1, 2^24] (positions must be exact in fp32)");
  DSV41_CHECK(p.base > 1.0 && std::isfinite(p.base), "rope: base (theta) must be finite and > 1, got ", p.base);
  DSV41_CHECK(p.original_seq_len >= 0, "rope: original_seq_len=", p.original_seq_len, " is negative");
  if (p.original_seq_len > 0) {
    DSV41_CHECK(p.factor > 0.0 && p.beta_fast > 0 && p.beta_slow > 0, "rope: YaRN needs factor > 0 and ",
                "beta_fast, beta_slow > 0, got factor=", p.factor, " beta_fast=", p.beta_fast,
                " beta_slow=", p.beta_slow);
  }
  freqs_ = base_freqs(p);
  const int64_t half = p.rope_dim / 2;
  cos_.resize(static_cast<size_t>(p.max_seq_len * half));
  sin_.resize(cos_.size());
  for (int64_t pos = 0; pos < p.max_seq_len; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      // torch.outer(arange(seqlen), freqs): int64 position times fp32 frequency, in fp32.
      const float angle = static_cast<float>(pos) * freqs_[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(pos * half + i)] = std::cos(angle);  // float overloads: cosf
      sin_[static_cast<size_t>(pos * half + i)] = std::sin(angle);  // and sinf
    }
  }
}

void RopeTable::check_position(int64_t pos) const {
  DSV41_CHECK(pos >= 0 && pos < params_.max_seq_len, "rope: position ", pos, " outside [0, ",
              params_.max_seq_len, ")");
}

const float* RopeTable::cos(int64_t pos) const {
  check_position(pos);
  return cos_.data() + pos * (params_.rope_dim / 2);
}

const float* RopeTable::sin(int64_t pos) const {
  check_position(pos);
  return sin_.data() + pos * (params_.rope_dim / 2);
}

void RopeTable::apply(float* x_tail, int64_t position, bool inverse) const {
  const float* c = cos(position);
  const float* s = sin(position);
  for (int64_t i = 0; i < params_.rope_dim / 2; ++i) {
    const float a = x_tail[2 * i], b = x_tail[2 * i + 1];
    const float sn = inverse ? -s[i] : s[i];  // conj(freqs_cis)
    const float ac = a * c[i], bs = b * sn, as = a * sn, bc = b * c[i];
    x_tail[2 * i] = formats::round_to_bf16(ac - bs);
    x_tail[2 * i + 1] = formats::round_to_bf16(as + bc);
  }
}

void rope_rows(Tensor<float>& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t pos_stride,
               bool inverse) {
  DSV41_CHECK(x.rank() == 2 && heads > 0 && x.dim(1) % heads == 0, "rope_rows: '", x.name(), "' ",
              shape_string(x.shape()), " is not [T, ", heads, " * width]");
  const int64_t T = x.dim(0), width = x.dim(1) / heads, rd = rope.rope_dim();
  DSV41_CHECK(width >= rd, "rope_rows: vectors of ", width, " channels, rope_dim ", rd);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) rope.apply(x.row(t) + h * width + (width - rd), first_pos + t * pos_stride, inverse);
  }
}

}  // namespace dsv41::reference
