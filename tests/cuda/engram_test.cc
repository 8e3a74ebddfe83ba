// tests/cuda/engram_test.cc: CudaOps::engram_lookup and CudaOps::engram_gate_residual
// (cuda/engram.cu) vs the reference ops, bit for bit: zero, one and odd token counts, one and
// several columns, the first and last table rows, every E4M3 code (NaN codes aside) and a range of
// E8M0 scales; gates over dims below 8 (torch's scalar sum path), odd dims and long rows, zero
// inputs (the 1e-6 clamp), large inputs (the sigmoid saturates: the exp's -104/100 cut-offs), both
// signs of the dot; an id outside the table raises the reference's error. EngramLookup.EveryCode-
// AndScale: all 256 codes (NaN codes too) under E8M0 scales from 0x00 to 0xFF (bf16 subnormal and
// overflowing products, NaN), fp32 output (CudaOps) and bf16 output (gpu::engram_lookup_bf16).
#include "cuda/kernels_bf16.h"
#include "reference/ops/engram.h"
#include "tests/cuda/cuda_test_util.h"

namespace dsv41::test {
namespace {

reference::EngramWeights random_table(int64_t rows, int64_t hd) {
  reference::EngramWeights w;
  w.table = reference::Tensor<uint8_t>({rows, hd}, "embed.weight");
  w.table_scale = reference::Tensor<uint8_t>({rows, hd / 32}, "embed.scale");
  std::uniform_int_distribution<int> code(0, 255), scale(112, 142);
  for (uint8_t& c : w.table.data()) {
    int v = code(rng());
    if ((v & 0x7F) == 0x7F) v &= 0xFE;  // not the E4M3 NaN codes
    c = static_cast<uint8_t>(v);
  }
  for (uint8_t& s : w.table_scale.data()) s = static_cast<uint8_t>(scale(rng()));
  return w;
}

TEST(EngramLookup, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t hd : {32, 96}) {
    const int64_t rows = 37;
    reference::EngramWeights w = random_table(rows, hd);
    for (int64_t k = 0; k < 256 && k < w.table.numel(); ++k) {
      w.table.data()[static_cast<size_t>(k)] = static_cast<uint8_t>((k & 0x7F) == 0x7F ? 0 : k);  // every code
    }
    for (int64_t T : {0, 1, 5}) {
      for (int64_t cols : {1, 6}) {
        reference::Tensor<int64_t> ids({T, cols}, "ids");
        std::uniform_int_distribution<int64_t> id(0, rows - 1);
        for (int64_t& v : ids.data()) v = id(rng());
        if (T > 0) {
          ids.at(0, 0) = 0;
          ids.at(T - 1, cols - 1) = rows - 1;
        }
        EXPECT_TRUE(same_bits(ref_ops().engram_lookup(w, static_cast<int>(hd), ids),
                              cuda_ops().engram_lookup(w, static_cast<int>(hd), ids)))
            << "hd " << hd << " T " << T << " cols " << cols;
        EXPECT_TRUE(same_bits(ref_ops().engram_lookup(w, static_cast<int>(hd), ids),
                              cuda_ops().engram_lookup(w, static_cast<int>(hd), cuda_ops().upload(ids))));
      }
    }
    reference::Tensor<int64_t> bad({1, 2}, "ids", 0);
    bad.at(0, 1) = rows;
    EXPECT_THROW(cuda_ops().engram_lookup(w, static_cast<int>(hd), bad), Error);
  }
}

void expect_same_gate(const reference::Tensor<float>& x, const reference::Tensor<float>& kv,
                      const reference::EngramWeights& w, const std::string& what) {
  EXPECT_TRUE(
      same_bits(ref_ops().engram_gate_residual(x, kv, w, 1e-6), cuda_ops().engram_gate_residual(x, kv, w, 1e-6)))
      << what;
}

TEST(EngramGateResidual, EqualsReferenceBitForBit) {
  DSV41_SKIP_WITHOUT_DEVICE();
  for (int64_t hc : {1, 4}) {
    for (int64_t dim : {1, 7, 64, 257, 2048}) {
      reference::EngramWeights w;
      w.q_weight = random_bf16({hc, dim}, 1.0f, "q_weight");
      w.k_weight = random_bf16({hc, dim}, 1.0f, "k_weight");
      for (int64_t T : {0, 1, 3}) {
        const std::string what = "hc " + std::to_string(hc) + " dim " + std::to_string(dim) + " T " + std::to_string(T);
        expect_same_gate(random_bf16({T, hc, dim}, 1.0f, "x"), random_bf16({T, (hc + 1) * dim}, 1.0f, "kv"), w, what);
        expect_same_gate(random_bf16({T, hc, dim}, 1.0f, "x"), random_bf16({T, (hc + 1) * dim}, 300.0f, "kv"), w,
                         what + " large kv");
      }
      // Zero hidden state: dot = 0, the clamp decides the magnitude.
      expect_same_gate(reference::Tensor<float>({2, hc, dim}, "x", 0.0f), random_bf16({2, (hc + 1) * dim}), w,
                       "zero x, dim " + std::to_string(dim));
    }
  }
  // Aligned h and key with weights of one sign: the dot is large, the sigmoid saturates near 1
  // (positive) or 0 (negated key).
  reference::EngramWeights w;
  w.q_weight = reference::Tensor<float>({2, 64}, "q_weight", 1.0f);
  w.k_weight = reference::Tensor<float>({2, 64}, "k_weight", 1.0f);
  reference::Tensor<float> x = random_bf16({2, 2, 64}, 1.0f, "x"), kv({2, 3 * 64}, "kv");
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t d = 0; d < 64; ++d) kv.at(t, c * 64 + d) = (t == 0 ? 1.0f : -1.0f) * x.at(t, c, d);
    }
    for (int64_t d = 0; d < 64; ++d) kv.at(t, 2 * 64 + d) = 0.5f;
  }
  expect_same_gate(x, kv, w, "saturated gates");
}

TEST(EngramLookup, EveryCodeAndScaleInBothStorages) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const int64_t hd = 256, rows = 16;
  reference::EngramWeights w;
  w.table = reference::Tensor<uint8_t>({rows, hd}, "embed.weight");
  w.table_scale = reference::Tensor<uint8_t>({rows, hd / 32}, "embed.scale");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < hd; ++d) w.table.at(r, d) = static_cast<uint8_t>((d + 37 * r) & 0xFF);  // every code
  }
  const uint8_t scales[] = {0x00, 0x01, 0x02, 0x06, 0x07, 0x08, 0x10, 0x5F, 0x7F, 0x80,
                            0xC0, 0xF0, 0xF7, 0xF8, 0xFE, 0xFF};  // 2^-127 .. 2^127, NaN
  for (int64_t i = 0; i < w.table_scale.numel(); ++i) {
    w.table_scale.data()[static_cast<size_t>(i)] = scales[static_cast<size_t>(i * 5) % sizeof scales];
  }
  for (int64_t T : {1, 7, 40}) {
    const int64_t cols = 3;
    reference::Tensor<int64_t> ids({T, cols}, "ids");
    std::uniform_int_distribution<int64_t> id(0, rows - 1);
    for (int64_t& v : ids.data()) v = id(rng());
    const reference::Tensor<float> want = ref_ops().engram_lookup(w, static_cast<int>(hd), ids);
    EXPECT_TRUE(same_bits(want, cuda_ops().engram_lookup(w, static_cast<int>(hd), ids))) << "T " << T;
    gpu::DeviceBuffer<uint8_t> dcodes(static_cast<size_t>(w.table.numel())),
        dscales(static_cast<size_t>(w.table_scale.numel()));
    gpu::DeviceBuffer<int64_t> dids(static_cast<size_t>(ids.numel()));
    gpu::DeviceBuffer<uint16_t> dout(static_cast<size_t>(want.numel()));
    dcodes.upload(w.table.data());
    dscales.upload(w.table_scale.data());
    dids.upload(ids.data());
    dout.poison();
    gpu::engram_lookup_bf16(dcodes.get(), dscales.get(), hd, dids.get(), T, cols, dout.get());
    const std::vector<uint16_t> got = dout.download();
    size_t bad = 0;
    while (bad < got.size() && uint32_t{got[bad]} << 16 == bits(want.data()[bad])) ++bad;
    EXPECT_EQ(bad, got.size()) << "T " << T << ": bf16 output differs first at " << bad;
  }
}

}  // namespace
}  // namespace dsv41::test
