// reference/ops/rope.h
//
// Rotary position embedding as the official precompute_freqs_cis / apply_rotary_emb compute it.
//
// Table (precompute_freqs_cis(rd, seqlen, original_seq_len, base, factor, beta_fast, beta_slow)),
// for i in [0, rd/2), every step in fp32 unless marked:
//   e_i      = fl32((float)(2i) / (float)rd)
//   p_i      = fl32(base_f ** e_i)         base_f = (float)base; the power is the correctly
//                                          rounded fp32 value (pow in double, rounded once)
//   f_i      = 1.0f / p_i
//   YaRN, only when original_seq_len > 0 (doubles, as Python computes them):
//     corr(r) = rd * ln(original_seq_len / (r * 2 * pi)) / (2 * ln(base))
//     low     = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), rd - 1)
//     ramp_i  = clamp(((float)i - (float)low) / (float)max(high - low, 0.001), 0, 1)   fp32
//     smooth  = 1 - ramp_i
//     f_i     = (f_i / (float)factor) * (1 - smooth) + f_i * smooth                   fp32
//   angle    = fl32((float)pos * f_i)      pos in [0, seqlen)
//   cos, sin = std::cos(angle), std::sin(angle) on float (libm cosf / sinf; torch.polar)
// Apply (apply_rotary_emb, interleaved pairs of the rd-wide tail): for each pair (a, b) = (x[2i],
// x[2i+1]) and (c, s) = (cos, sin) of the position (s negated for the inverse, the conjugate):
//   x[2i]   = bf16(fl32(a * c) - fl32(b * s))
//   x[2i+1] = bf16(fl32(a * s) + fl32(b * c))
// (torch's complex64 multiply: two rounded products, one rounded sum, no FMA; then copy_ into
// the bf16 tensor rounds to nearest even).
//
// Layer kinds: ratio > 0 layers (kCompressed) use compress_rope_theta with YaRN when
// original_seq_len > 0; ratio-0 layers and DSpark blocks (kWindow) use rope_theta without YaRN.
// Both tables span positions [0, max_seq_len).
//
// Exactness: cos/sin of all four kernels.h5 tables (tiny and released settings, 81920 pairs) and
// kernels.h5 rope/apply_y, apply_y_inverse are bit-identical (rope_test.cc). The table depends on
// the platform libm's cosf/sinf: glibc's (>= 2.28, the one torch on Linux calls) reproduces the
// oracle; correctly rounded cos/sin would differ in ~1% of entries by 1 ulp.
//
// Example:
//   RopeTable rope = RopeTable::for_layer(c, layer);
//   rope.apply(q.row(t, h) + (head_dim - rope.rope_dim()), position, /*inverse=*/false);
//   rope_rows(q, n_heads, rope, start_pos, 1, /*inverse=*/false);   // every head of every row
#pragma once

#include <cstdint>
#include <vector>

#include "reference/ops/config.h"
#include "reference/ops/tensor.h"

namespace dsv41::reference {

enum class RopeKind : uint8_t {
  kWindow,      // rope_theta, no YaRN: ratio-0 layers and DSpark blocks
  kCompressed,  // compress_rope_theta, YaRN when original_seq_len > 0: ratio > 0 layers
};
const char* name(RopeKind k);

// The arguments of precompute_freqs_cis.
struct RopeParams {
  int64_t rope_dim = 0;          // rd: even, > 0
  int64_t max_seq_len = 0;       // positions [0, max_seq_len)
  int64_t original_seq_len = 0;  // > 0 enables YaRN
  double base = 0.0;             // theta
  double factor = 1.0;           // YaRN factor
  int64_t beta_fast = 32;
  int64_t beta_slow = 1;
};

// precompute_freqs_cis' arguments for a layer kind of config c.
RopeParams rope_params(const ModelConfig& c, RopeKind kind);

class RopeTable {
 public:
  RopeTable() = default;
  explicit RopeTable(const RopeParams& p);

  static RopeTable make(const ModelConfig& c, RopeKind kind) { return RopeTable(rope_params(c, kind)); }
  // kCompressed when compress_ratios[layer] > 0, else kWindow.
  static RopeTable for_layer(const ModelConfig& c, int layer);

  const RopeParams& params() const { return params_; }
  int64_t rope_dim() const { return params_.rope_dim; }
  int64_t max_seq_len() const { return params_.max_seq_len; }

  // freqs: [rd/2] fp32 (after YaRN).
  const std::vector<float>& freqs() const { return freqs_; }
  // cos / sin of position pos: [rd/2] fp32 (the real / imaginary part of freqs_cis[pos]).
  const float* cos(int64_t pos) const;
  const float* sin(int64_t pos) const;

  // Rotates the rd-wide tail of one row in place at `position` (inverse: the conjugate).
  // x_tail: [rd] bf16 values in, bf16 values out.
  void apply(float* x_tail, int64_t position, bool inverse = false) const;

 private:
  void check_position(int64_t pos) const;

  RopeParams params_;
  std::vector<float> freqs_;  // [rd/2] fp32
  std::vector<float> cos_;    // [max_seq_len, rd/2] fp32
  std::vector<float> sin_;    // [max_seq_len, rd/2] fp32
};

// RoPE on the last rope_dim channels of each of `heads` vectors per row, in place: row t is at
// position first_pos + t * pos_stride (a compressed row j of ratio r: first_pos = j0 * r,
// pos_stride = r); inverse: the conjugate rotation (the attention output's tail).
// x: [T, heads * width] bf16 (width = x.dim(1) / heads >= rope_dim) -> same, bf16.
void rope_rows(Tensor<float>& x, int64_t heads, const RopeTable& rope, int64_t first_pos, int64_t pos_stride,
               bool inverse);

}  // namespace dsv41::reference
