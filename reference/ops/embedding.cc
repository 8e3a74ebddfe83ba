#include "reference/ops/embedding.h"

#include <algorithm>

#include "base/error.h"

namespace dsv41::reference {

Tensor<float> embed(const std::vector<int64_t>& tokens, const Tensor<float>& table, int64_t hc) {
  DSV41_CHECK(table.rank() == 2 && hc > 0, "embed: table '", table.name(), "' ", shape_string(table.shape()),
              ", hc ", hc);
  const int64_t T = static_cast<int64_t>(tokens.size()), vocab = table.dim(0), dim = table.dim(1);
  Tensor<float> stream({T, hc, dim}, "stream");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = tokens[static_cast<size_t>(t)];
    DSV41_CHECK(id >= 0 && id < vocab, "embed: token ", t, " = ", id, " is outside the vocab [0, ", vocab, ")");
    const float* e = table.row(id);
    for (int64_t i = 0; i < hc; ++i) std::copy(e, e + dim, stream.row(t, i));
  }
  return stream;
}

}  // namespace dsv41::reference
