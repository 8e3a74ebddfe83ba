// The linear ops of the exact evaluation (scenarios/exact/exact_eval.h): linear per weight dtype
// (F8_E4M3, F4 E2M1, BF16, F32), linear_fp32 (the MoE gate and the head logits) and
// grouped_linear. Exact products by Eigen over Exact; bounds docs/cuda.md "Tolerances with their
// origin".
#include <algorithm>
#include <string>
#include <vector>

#include "reference/ops/linear.h"
#include "scenarios/exact/exact_internal.h"
#include "scenarios/judge/fp8_mma_bound.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::DType;
using reference::LinearWeight;
using reference::Tensor;

struct Dims {
  int64_t T, in, out;
};

}  // namespace

LinearWeight random_weight(Draws& d, DType dtype, int64_t out, int64_t in, const std::string& name) {
  LinearWeight w;
  w.name = name;
  w.dtype = dtype;
  w.out = out;
  w.in = in;
  w.w.resize(static_cast<size_t>(out * in));
  const double bf16_scale = 1.0 / std::sqrt(static_cast<double>(in));
  for (float& v : w.w) {
    v = dtype == DType::kF8E4M3 ? d.e4m3() : dtype == DType::kF4 ? d.e2m1()
        : dtype == DType::kBF16 ? d.bf16(bf16_scale) : d.f32(bf16_scale);
  }
  if (dtype == DType::kF8E4M3) {
    w.scale.resize(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)));
    for (float& s : w.scale) s = d.pow2(-10, -6);
  } else if (dtype == DType::kF4) {
    w.scale.resize(static_cast<size_t>(out * (in / 32)));
    for (float& s : w.scale) s = d.pow2(-6, -3);
  }
  return w;
}

namespace {

float weight_scale(const LinearWeight& w, int64_t o, int64_t b) {
  if (w.dtype == DType::kF8E4M3) return w.scale[static_cast<size_t>((o / 32) * ((w.in + 31) / 32) + b)];
  return w.scale[static_cast<size_t>(o * (w.in / 32) + b)];
}

// Cancellation: the second half of each x row repeats the first, the second half of each weight
// row (and its scales) negates the first, except one element: the exact result is that element's
// product alone, while the sum of magnitudes is large.
void make_cancelling(Tensor<float>& x, LinearWeight& w, Draws& d) {
  const int64_t half = w.in / 2;
  for (int64_t t = 0; t < x.dim(0); ++t) {
    for (int64_t k = 0; k < half; ++k) x.at(t, half + k) = x.at(t, k);
  }
  for (int64_t o = 0; o < w.out; ++o) {
    float* row = w.w.data() + o * w.in;
    for (int64_t k = 0; k < half; ++k) row[half + k] = -row[k];
    row[half + (o % half)] = w.dtype == DType::kF8E4M3 ? d.e4m3() : w.dtype == DType::kF4 ? d.e2m1() : row[0];
  }
  if (w.dtype == DType::kF8E4M3) {
    const int64_t nbk = (w.in + 31) / 32;
    for (int64_t ob = 0; ob < (w.out + 31) / 32; ++ob) {
      for (int64_t b = 0; b < nbk / 2; ++b) w.scale[ob * nbk + nbk / 2 + b] = w.scale[ob * nbk + b];
    }
  } else if (w.dtype == DType::kF4) {
    const int64_t nbk = w.in / 32;
    for (int64_t o = 0; o < w.out; ++o) {
      for (int64_t b = 0; b < nbk / 2; ++b) w.scale[o * nbk + nbk / 2 + b] = w.scale[o * nbk + b];
    }
  }
}

// fp8 / fp4: act_quant (a semantic rounding: the spec's quantizer, reference::act_quant_row), then
// y = sum_b a_s[b] w_s[o, b] p_b with p_b the exact 32-wide block dot. Computed: p_b rounded once
// to fp32 (exact products, exact double sum), scaled by powers of two (exact), nb = in/32 blocks
// accumulated in fp32 in any order: |err| <= gamma_nb(u32) sum_b |scaled p_b|; then bf16.
OpCase quantized_case(const std::string& inputs, const Tensor<float>& x, const LinearWeight& w) {
  const int64_t T = x.dim(0), in = w.in, out = w.out, nb = in / 32;
  std::vector<float> codes(static_cast<size_t>(T * in)), ascale(static_cast<size_t>(T * nb));
  for (int64_t t = 0; t < T; ++t) reference::act_quant_row(x.row(t), in, codes.data() + t * in, ascale.data() + t * nb);
  const ExactMatrix xq = exact_matrix(codes.data(), T, in), wm = exact_matrix(w.w.data(), out, in);
  ExactMatrix y = ExactMatrix::Zero(T, out), mag = ExactMatrix::Zero(T, out);
  for (int64_t b = 0; b < nb; ++b) {
    const ExactMatrix p = xq.middleCols(b * 32, 32) * wm.middleCols(b * 32, 32).transpose();  // [T, out]
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < out; ++o) {
        const Exact s = p(t, o) * exact_of(ascale[static_cast<size_t>(t * nb + b)]) * exact_of(weight_scale(w, o, b));
        y(t, o) += s;
        mag(t, o) += mp::abs(s);
      }
    }
  }
  OpCase c;
  c.op = std::string("linear ") + (w.dtype == DType::kF8E4M3 ? "F8" : "F4");
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = in;
  c.row = out;
  c.precisions = "x bf16 -> act_quant E4M3 x E8M0/32; w " + std::string(w.dtype == DType::kF8E4M3 ? "E4M3" : "E2M1") +
                 " x E8M0; block dot exact -> fp32; fp32 acc over in/32 blocks";
  c.formula = "gamma_{in/32}(u32) sum_b|s_b p_b| + ulp_bf16/2";
  c.out = kBf16;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      c.exact.push_back(y(t, o));
      c.bound.push_back(derived_bound(Accumulation::kQuantizedBlocks, in, to_double(mag(t, o)), y(t, o), kBf16));
    }
  }
  if (w.dtype == DType::kF8E4M3) {  // the production linear's bound (fp8 tensor cores)
    std::vector<judge::Fp8Block> blocks(static_cast<size_t>(nb));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t b = 0; b < nb; ++b) {
          const float* a = codes.data() + t * in + b * 32;
          const float* wv = w.w.data() + o * in + b * 32;
          double p = 0;  // exact: products of E4M3 values are multiples of 2^-18 below 2^18
          for (int i = 0; i < 32; ++i) p += static_cast<double>(a[i]) * wv[i];
          blocks[static_cast<size_t>(b)] = {static_cast<double>(ascale[static_cast<size_t>(t * nb + b)]) *
                                                weight_scale(w, o, b),
                                            p, judge::fp8_mma_block_error(a, wv, 32)};
        }
        c.tensor_core_bound.push_back(judge::fp8_mma_linear_bound(blocks, to_double(y(t, o))));
      }
    }
  }
  c.run = [x, w](const reference::seam::Ops& ops) { return ops.download(ops.linear(ops.upload(x), w)).data(); };
  return c;
}

// bf16 weights: a double sum of exact products (gamma_n(u64)), rounded to fp32 then bf16.
// fp32 weights (linear with an F32 weight, linear_fp32): an fp32 FMA chain, n roundings.
OpCase dense_case(const std::string& op, const std::string& inputs, const Tensor<float>& x, const LinearWeight& w,
                  bool fp32_path) {
  const int64_t T = x.dim(0), in = w.in, out = w.out;
  const ExactMatrix xm = exact_matrix(x.data().data(), T, in), wm = exact_matrix(w.w.data(), out, in);
  const ExactMatrix y = xm * wm.transpose();
  const ExactMatrix mag = abs_of(xm) * abs_of(wm).transpose();
  const bool bf16_out = !fp32_path && w.dtype != DType::kF32;
  OpCase c;
  c.op = op;
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = in;
  c.row = out;
  c.out = bf16_out ? kBf16 : kF32;
  if (bf16_out) {
    c.precisions = "x bf16, w bf16; double acc -> fp32 -> bf16";
    c.formula = "g S + u32 (|y| + g S) + ulp_bf16/2, g = gamma_n(u64), S = sum|x w|";
  } else {
    c.precisions = "x fp32/bf16, w " + std::string(reference::dtype_name(w.dtype)) + "; fp32 FMA acc";
    c.formula = "gamma_n(u32) sum|x w| (fp32 out, no final rounding)";
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      c.exact.push_back(y(t, o));
      c.bound.push_back(bf16_out ? derived_bound(Accumulation::kF64ToF32, in, to_double(mag(t, o)), y(t, o), kBf16)
                                 : derived_bound(Accumulation::kF32Fma, in, to_double(mag(t, o)), y(t, o), kF32));
    }
  }
  if (fp32_path) {
    c.run = [x, w](const reference::seam::Ops& ops) { return ops.download(ops.linear_fp32(ops.upload(x), w)).data(); };
  } else {
    c.run = [x, w](const reference::seam::Ops& ops) { return ops.download(ops.linear(ops.upload(x), w)).data(); };
  }
  return c;
}

// grouped_linear: per group a bf16 linear of width w.in over its rows of w.
OpCase grouped_case(Draws& d, Dims dims, int groups) {
  const int64_t width = dims.in / groups, rows = dims.out / groups;
  const Tensor<float> x = bf16_tensor(d, {dims.T, dims.in}, 1.0, "x");
  const LinearWeight w = random_weight(d, DType::kBF16, dims.out, width, "wo_a");
  const ExactMatrix xm = exact_matrix(x.data().data(), dims.T, dims.in), wm = exact_matrix(w.w.data(), dims.out, width);
  OpCase c;
  c.op = "grouped_linear";
  c.inputs = "random";
  c.reduction = width;
  c.row = dims.out;
  c.out = kBf16;
  c.precisions = "x bf16, w bf16; double acc -> fp32 -> bf16";
  c.formula = "as linear BF16 with n = in / groups";
  std::vector<Exact> y(static_cast<size_t>(dims.T * dims.out));
  std::vector<double> b(y.size());
  for (int g = 0; g < groups; ++g) {
    const ExactMatrix xg = xm.middleCols(g * width, width), wg = wm.middleRows(g * rows, rows);
    const ExactMatrix yg = xg * wg.transpose(), mg = abs_of(xg) * abs_of(wg).transpose();
    for (int64_t t = 0; t < dims.T; ++t) {
      for (int64_t j = 0; j < rows; ++j) {
        const size_t i = static_cast<size_t>(t * dims.out + g * rows + j);
        y[i] = yg(t, j);
        b[i] = derived_bound(Accumulation::kF64ToF32, width, to_double(mg(t, j)), yg(t, j), kBf16);
      }
    }
  }
  c.exact = std::move(y);
  c.bound = std::move(b);
  c.run = [x, w, groups](const reference::seam::Ops& ops) {
    return ops.download(ops.grouped_linear(ops.upload(x), w, groups)).data();
  };
  return c;
}

}  // namespace

void exact_quantized_row(const float* x, const LinearWeight& w, std::vector<Exact>& y, std::vector<Exact>& mag,
                         std::vector<double>* tc) {
  const int64_t nb = w.in / 32;
  std::vector<float> codes(static_cast<size_t>(w.in)), ascale(static_cast<size_t>(nb));
  reference::act_quant_row(x, w.in, codes.data(), ascale.data());
  y.assign(static_cast<size_t>(w.out), Exact(0));
  mag.assign(static_cast<size_t>(w.out), Exact(0));
  if (tc) tc->assign(static_cast<size_t>(w.out), 0.0);
  for (int64_t o = 0; o < w.out; ++o) {
    const float* row = w.w.data() + o * w.in;
    for (int64_t b = 0; b < nb; ++b) {
      Exact p = 0;
      for (int64_t k = b * 32; k < b * 32 + 32; ++k) p += exact_of(codes[static_cast<size_t>(k)]) * exact_of(row[k]);
      const double scale = static_cast<double>(ascale[static_cast<size_t>(b)]) * weight_scale(w, o, b);
      const Exact s = p * exact_of(ascale[static_cast<size_t>(b)]) * exact_of(weight_scale(w, o, b));
      y[static_cast<size_t>(o)] += s;
      mag[static_cast<size_t>(o)] += mp::abs(s);
      if (tc && w.dtype == DType::kF8E4M3) {
        (*tc)[static_cast<size_t>(o)] += scale * judge::fp8_mma_block_error(codes.data() + b * 32, row + b * 32, 32);
      }
    }
  }
}

void add_linear_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const bool small = sizes == Sizes::kSmall;
  const Dims q{small ? 8 : 4, small ? 2048 : 256, small ? 96 : 64};     // a projection
  const Dims head{2, small ? 2048 : 256, small ? 2048 : 1024};          // the head: [vocab, dim]
  const int64_t long_in = small ? 16384 : 4096;                         // long reductions
  for (DType dt : {DType::kF8E4M3, DType::kF4}) {
    const std::string tag = dt == DType::kF8E4M3 ? "F8" : "F4";
    Draws d(seed, "linear " + tag);
    out.push_back(quantized_case("random", bf16_tensor(d, {q.T, q.in}, 1.0, "x"), random_weight(d, dt, q.out, q.in, "w")));
    Tensor<float> xl = bf16_tensor(d, {2, long_in}, 1.0, "x");
    out.push_back(quantized_case("long", xl, random_weight(d, dt, 32, long_in, "w")));
    Tensor<float> xc = bf16_tensor(d, {q.T, q.in}, 1.0, "x");
    LinearWeight wc = random_weight(d, dt, 32, q.in, "w");
    make_cancelling(xc, wc, d);
    out.push_back(quantized_case("cancel", xc, wc));
  }
  {
    Draws d(seed, "linear BF16");
    out.push_back(dense_case("linear BF16", "random", bf16_tensor(d, {q.T, q.in}, 1.0, "x"),
                             random_weight(d, DType::kBF16, q.out, q.in, "w"), false));
    out.push_back(dense_case("linear BF16", "long", bf16_tensor(d, {2, long_in}, 1.0, "x"),
                             random_weight(d, DType::kBF16, 16, long_in, "w"), false));
    Tensor<float> xc = bf16_tensor(d, {q.T, q.in}, 1.0, "x");
    LinearWeight wc = random_weight(d, DType::kBF16, 16, q.in, "w");
    make_cancelling(xc, wc, d);
    out.push_back(dense_case("linear BF16", "cancel", xc, wc, false));
  }
  {
    Draws d(seed, "linear F32");
    out.push_back(dense_case("linear F32", "random", bf16_tensor(d, {q.T, q.in}, 1.0, "x"),
                             random_weight(d, DType::kF32, q.out, q.in, "w"), false));
    Tensor<float> xc = bf16_tensor(d, {q.T, q.in}, 1.0, "x");
    LinearWeight wc = random_weight(d, DType::kF32, 16, q.in, "w");
    make_cancelling(xc, wc, d);
    out.push_back(dense_case("linear F32", "cancel", xc, wc, false));
  }
  {
    Draws d(seed, "linear_fp32");
    Tensor<float> x({q.T, q.in}, "x");
    for (float& v : x.data()) v = d.f32(1.0);
    out.push_back(dense_case("linear_fp32 (gate)", "random", x, random_weight(d, DType::kBF16, q.out, q.in, "gate"), true));
    out.push_back(dense_case("linear_fp32 (head)", "random", bf16_tensor(d, {head.T, head.in}, 1.0, "x"),
                             random_weight(d, DType::kF32, head.out, head.in, "head"), true));
    out.push_back(dense_case("linear_fp32 (head)", "long", bf16_tensor(d, {1, long_in}, 1.0, "x"),
                             random_weight(d, DType::kF32, 64, long_in, "head"), true));
  }
  {
    Draws d(seed, "grouped_linear");
    out.push_back(grouped_case(d, {q.T, q.in, q.out}, 2));
  }
}

}  // namespace dsv41::scenarios::exact
