#include "reference/ops/dspark.h"

#include <algorithm>

#include "base/error.h"
#include "reference/ops/numerics.h"

namespace dsv41::reference {

Tensor<float> hc_mean(const Tensor<float>& stream) {
  DSV41_CHECK(stream.rank() == 3 && stream.dim(1) > 0, "hc_mean: stream '", stream.name(), "' ",
              shape_string(stream.shape()), ", want [T, hc, dim]");
  const int64_t T = stream.dim(0), hc = stream.dim(1), dim = stream.dim(2);
  const float n = static_cast<float>(hc);
  Tensor<float> y({T, dim}, "main_hidden_part");
  for (int64_t t = 0; t < T; ++t) {
    float* out = y.row(t);
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.0f;
      for (int64_t i = 0; i < hc; ++i) sum += stream.at(t, i, d);  // fp32, copies in order
      out[d] = round_to_bf16(sum / n);
    }
  }
  return y;
}

Tensor<float> concat_cols(const std::vector<Tensor<float>>& parts) {
  DSV41_CHECK(!parts.empty(), "concat_cols: no parts");
  const int64_t T = parts.front().rank() == 2 ? parts.front().dim(0) : -1;
  int64_t width = 0;
  for (const Tensor<float>& p : parts) {
    DSV41_CHECK(p.rank() == 2 && p.dim(0) == T, "concat_cols: part '", p.name(), "' ", shape_string(p.shape()),
                ", want [", T, ", d]");
    width += p.dim(1);
  }
  Tensor<float> y({T, width}, "concat");
  for (int64_t t = 0; t < T; ++t) {
    float* out = y.row(t);
    for (const Tensor<float>& p : parts) out = std::copy(p.row(t), p.row(t) + p.dim(1), out);
  }
  return y;
}

Tensor<float> concat_rows(const std::vector<Tensor<float>>& parts) {
  DSV41_CHECK(!parts.empty(), "concat_rows: no parts");
  const int64_t d = parts.front().rank() == 2 ? parts.front().dim(1) : -1;
  int64_t n = 0;
  for (const Tensor<float>& p : parts) {
    DSV41_CHECK(p.rank() == 2 && p.dim(1) == d, "concat_rows: part '", p.name(), "' ", shape_string(p.shape()),
                ", want [n, ", d, "]");
    n += p.dim(0);
  }
  Tensor<float> y({n, d}, "stacked");
  auto out = y.data().begin();
  for (const Tensor<float>& p : parts) out = std::copy(p.data().begin(), p.data().end(), out);
  return y;
}

void add_markov_bias(Tensor<float>& logits, int64_t slot, const Tensor<float>& bias) {
  DSV41_CHECK(logits.rank() == 2 && bias.rank() == 2 && bias.dim(0) == 1 && bias.dim(1) == logits.dim(1),
              "add_markov_bias: logits ", shape_string(logits.shape()), ", bias ", shape_string(bias.shape()),
              ", want [block, vocab] and [1, vocab]");
  DSV41_CHECK(slot >= 0 && slot < logits.dim(0), "add_markov_bias: slot ", slot, " of a block of ", logits.dim(0));
  float* row = logits.row(slot);
  const float* b = bias.row(0);
  for (int64_t v = 0; v < logits.dim(1); ++v) row[v] += b[v];
}

Tensor<int32_t> dspark_index_rows(int64_t context_rows, int64_t block) {
  DSV41_CHECK(context_rows > 0 && block > 0, "dspark_index_rows: ", context_rows, " ring rows, block ", block);
  const int64_t n = context_rows + block;
  Tensor<int32_t> idxs({block, n}, "dspark_idxs");
  for (int64_t r = 0; r < block; ++r) {
    for (int64_t j = 0; j < n; ++j) idxs.at(r, j) = static_cast<int32_t>(j);
  }
  return idxs;
}

}  // namespace dsv41::reference
