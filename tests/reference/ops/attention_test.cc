// Sparse attention (reference/ops/attention.h) against the official CPU run (golden/oracle): the
// sparse_attn kernel vectors, every prefill and decode sparse_attn call recorded for layers 0, 2,
// 6 and 8, the window index rows, the concatenation with the compressed part, and the compressed
// KV cache's ownership checks.
#include "reference/ops/attention.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "formats/minifloat.h"
#include "formats/packed.h"
#include "golden/golden_io.h"
#include "reference/model/kv_cache.h"
#include "reference/ops/numerics.h"
#include "reference/seam/ops.h"
#include "reference/checkpoint/safetensors.h"

namespace dsv41::reference {
namespace {

const std::string kOracle = std::string(DSV41_SOURCE_DIR) + "/golden/oracle/";
constexpr float kSoftmaxScale = 0.08838834764831845f;  // head_dim 128 ^ -0.5 (the file's attr)
constexpr int kWindow = 64;                              // tiny config window_size
constexpr int64_t kPrefillLen = 333;
const int kLayers[] = {0, 2, 6, 8};

// Prefill sparse_attn outputs may differ from the official CPU run by 1 bf16 ulp on a few
// elements: torch evaluates exp with SLEEF (ours is libm's; both within 1 fp32 ulp) and sums the
// 64 probabilities of a block in a vectorized order (ours: double, rounded once). Measured on this
// oracle: 15 of 681984 prefill outputs differ, each by exactly 1 ulp (docs/attention.md). The
// budget allows 1 ulp and a bitwise-equal fraction of at least 99.99% (measured 99.9978%).
constexpr int kPrefillMaxUlp = 1;
constexpr double kPrefillMinEqualFraction = 0.9999;

std::string layer_name(int layer) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "layer%02d", layer);
  return buf;
}

Tensor<float> bf16_tensor(const golden::H5File& f, const std::string& name, int drop_leading = 1) {
  const golden::Array<uint16_t> a = f.read<uint16_t>(name);
  std::vector<int64_t> shape(a.shape.begin() + drop_leading, a.shape.end());
  std::vector<float> v(a.data.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = formats::bf16_decode(a.data[i]);
  return Tensor<float>(shape, std::move(v), name);
}

Tensor<int32_t> int_tensor(const golden::H5File& f, const std::string& name) {
  const golden::Array<int32_t> a = f.read<int32_t>(name);
  return Tensor<int32_t>(std::vector<int64_t>(a.shape.begin() + 1, a.shape.end()), a.data, name);
}

std::vector<float> sink_of(int layer) {
  static const checkpoint::safetensors::SafetensorsFile w =
      checkpoint::safetensors::SafetensorsFile::read(kOracle + "weights.safetensors");
  return w.get("layers." + std::to_string(layer) + ".attn.attn_sink").to_f32();
}

// Distance in bf16 steps between two bf16 values (monotone integer map of the bit patterns).
int64_t bf16_ulp(float a, float b) {
  const auto ord = [](float x) {
    const int64_t u = formats::bf16_encode(x);
    return (u & 0x8000) ? -(u & 0x7FFF) : u;
  };
  return std::llabs(ord(a) - ord(b));
}

struct Agreement {
  int64_t equal = 0, total = 0, max_ulp = 0;
  double fraction() const { return total ? static_cast<double>(equal) / total : 0.0; }
};

Agreement compare(const Tensor<float>& got, const Tensor<float>& want) {
  EXPECT_EQ(got.shape(), want.shape());
  Agreement a;
  bool nonzero = false;
  for (int64_t i = 0; i < want.numel() && got.shape() == want.shape(); ++i) {
    const float g = got.data()[static_cast<size_t>(i)], w = want.data()[static_cast<size_t>(i)];
    EXPECT_FALSE(std::isnan(g)) << "element " << i;
    nonzero |= g != 0.0f;
    ++a.total;
    if (formats::bf16_encode(g) == formats::bf16_encode(w)) ++a.equal;
    a.max_ulp = std::max(a.max_ulp, bf16_ulp(g, w));
  }
  EXPECT_TRUE(nonzero) << "output is all zero";
  return a;
}

TEST(SparseAttn, KernelVectorsAreBitExact) {
  const golden::H5File f(kOracle + "kernels.h5");
  const Tensor<float> q = bf16_tensor(f, "sparse_attn/q/bits");
  const Tensor<float> kv = bf16_tensor(f, "sparse_attn/kv/bits");
  const Tensor<int32_t> idx = int_tensor(f, "sparse_attn/topk_idxs/value");
  const std::vector<float> sink = f.read<float>("sparse_attn/sink/value").data;
  const Tensor<float> out = sparse_attn(q, kv, sink, idx, kSoftmaxScale);
  const Agreement a = compare(out, bf16_tensor(f, "sparse_attn/out/bits"));
  std::printf("[dsv41] kernels.h5 sparse_attn: %lld/%lld bitwise equal, max ulp %lld\n",
              static_cast<long long>(a.equal), static_cast<long long>(a.total),
              static_cast<long long>(a.max_ulp));
  EXPECT_EQ(a.equal, a.total);
  // Row 2 has only -1 indices: the output is exactly zero.
  for (int64_t h = 0; h < q.dim(1); ++h) {
    for (int64_t c = 0; c < q.dim(2); ++c) EXPECT_EQ(out.at(2, h, c), 0.0f);
  }
}

TEST(SparseAttn, PrefillMatchesOfficialRunWithinOneUlp) {
  const golden::H5File attn(kOracle + "prefill_attn.h5");
  const golden::H5File pre(kOracle + "prefill.h5");
  Agreement all;
  for (int layer : kLayers) {
    const std::string g = "prefill/" + layer_name(layer) + "/";
    const Tensor<float> out =
        sparse_attn(bf16_tensor(attn, g + "sparse_q/bits"), bf16_tensor(attn, g + "sparse_kv/bits"),
                    sink_of(layer), int_tensor(pre, g + "attn_topk_idxs/value"), kSoftmaxScale);
    const Agreement a = compare(out, bf16_tensor(attn, g + "sparse_out/bits"));
    std::printf("[dsv41] prefill %s sparse_attn: %lld/%lld bitwise equal (%.6f), max ulp %lld\n",
                layer_name(layer).c_str(), static_cast<long long>(a.equal),
                static_cast<long long>(a.total), a.fraction(), static_cast<long long>(a.max_ulp));
    all.equal += a.equal;
    all.total += a.total;
    all.max_ulp = std::max(all.max_ulp, a.max_ulp);
  }
  EXPECT_LE(all.max_ulp, kPrefillMaxUlp);
  EXPECT_GE(all.fraction(), kPrefillMinEqualFraction);
}

TEST(SparseAttn, DecodeStepsAreBitExact) {
  const golden::H5File dec(kOracle + "decode.h5");
  for (int step : {0, 7}) {
    for (int layer : kLayers) {
      const std::string g = "decode/step" + std::to_string(step) + "/" + layer_name(layer) + "/";
      const Tensor<float> out = sparse_attn(
          bf16_tensor(dec, g + "sparse_q/bits"), bf16_tensor(dec, g + "sparse_kv/bits"),
          sink_of(layer), int_tensor(dec, g + "attn_topk_idxs/value"), kSoftmaxScale);
      const Agreement a = compare(out, bf16_tensor(dec, g + "sparse_out/bits"));
      EXPECT_EQ(a.equal, a.total) << g << " max ulp " << a.max_ulp;
    }
  }
}

TEST(SparseAttn, ResultDoesNotDependOnThreadCount) {
  const golden::H5File f(kOracle + "kernels.h5");
  const Tensor<float> q = bf16_tensor(f, "sparse_attn/q/bits");
  const Tensor<float> kv = bf16_tensor(f, "sparse_attn/kv/bits");
  const Tensor<int32_t> idx = int_tensor(f, "sparse_attn/topk_idxs/value");
  const std::vector<float> sink = f.read<float>("sparse_attn/sink/value").data;
  set_reference_threads(1);
  const Tensor<float> one = sparse_attn(q, kv, sink, idx, kSoftmaxScale);
  set_reference_threads(3);
  const Tensor<float> three = sparse_attn(q, kv, sink, idx, kSoftmaxScale);
  set_reference_threads(0);
  EXPECT_EQ(one.data(), three.data());
}

TEST(SparseAttn, RejectsBadIndicesAndShapes) {
  Tensor<float> q({1, 2, 16}, "q", 0.5f);
  Tensor<float> kv({3, 16}, "kv", 0.25f);
  Tensor<int32_t> idx({1, 2}, "idx", 0);
  const std::vector<float> sink = {0.0f, 0.0f};
  idx.at(0, 1) = 3;  // one past the last KV row
  EXPECT_THROW(sparse_attn(q, kv, sink, idx, 1.0f), Error);
  idx.at(0, 1) = -2;
  EXPECT_THROW(sparse_attn(q, kv, sink, idx, 1.0f), Error);
  idx.at(0, 1) = -1;
  EXPECT_NO_THROW(sparse_attn(q, kv, sink, idx, 1.0f));
  EXPECT_THROW(sparse_attn(q, kv, {0.0f}, idx, 1.0f), Error);  // one sink for two heads
  EXPECT_THROW(sparse_attn(q, Tensor<float>({3, 8}, "kv8"), sink, idx, 1.0f), Error);
}

TEST(AttentionWindowIdxs, PrefillRowsMatchOfficialWindowPart) {
  const golden::H5File pre(kOracle + "prefill.h5");
  const Tensor<int32_t> win = window_topk_idxs_prefill(kWindow, 0, kPrefillLen);
  ASSERT_EQ(win.shape(), (std::vector<int64_t>{kPrefillLen, kWindow}));
  for (int layer : kLayers) {
    const Tensor<int32_t> rec = int_tensor(pre, "prefill/" + layer_name(layer) + "/attn_topk_idxs/value");
    for (int64_t t = 0; t < kPrefillLen; ++t) {
      for (int64_t j = 0; j < kWindow; ++j) ASSERT_EQ(win.at(t, j), rec.at(t, j)) << t << "," << j;
    }
  }
  // Short prefill: width = seqlen, entries beyond the query are -1.
  const Tensor<int32_t> small = window_topk_idxs_prefill(kWindow, 0, 3);
  EXPECT_EQ(small.data(), (std::vector<int32_t>{0, -1, -1, 0, 1, -1, 0, 1, 2}));
}

TEST(AttentionWindowIdxs, ChunkedPrefillRowsEqualUnchunkedPositions) {
  // A chunk starting at 100 over a KV tensor whose row 0 holds position 36 reads the same
  // positions as the unchunked prefill rows 100 .. 149.
  const Tensor<int32_t> full = window_topk_idxs_prefill(kWindow, 0, 150);
  const Tensor<int32_t> chunk = window_topk_idxs_prefill(kWindow, 100, 50, 36);
  for (int64_t t = 0; t < 50; ++t) {
    for (int64_t j = 0; j < kWindow; ++j) {
      const int32_t want = full.at(100 + t, j);
      EXPECT_EQ(chunk.at(t, j), want < 0 ? -1 : want - 36);
    }
  }
  EXPECT_THROW(window_topk_idxs_prefill(kWindow, 100, 50, 38), Error);  // position 37 missing
}

TEST(AttentionWindowIdxs, DecodeRingMatchesOfficialSteps) {
  const golden::H5File dec(kOracle + "decode.h5");
  for (int step = 0; step < 8; ++step) {
    const Tensor<int32_t> rec =
        int_tensor(dec, "decode/step" + std::to_string(step) + "/layer00/attn_topk_idxs/value");
    EXPECT_EQ(window_topk_idxs_decode(kWindow, kPrefillLen + step).data(), rec.data()) << step;
  }
  // Ring still filling: position 2 reads slots 0..2, oldest first after the empty slots.
  const Tensor<int32_t> early = window_topk_idxs_decode(4, 2);
  EXPECT_EQ(early.data(), (std::vector<int32_t>{-1, 0, 1, 2}));
}

TEST(AttentionConcat, WindowThenIndexerTopkIsTheRecordedRow) {
  const golden::H5File pre(kOracle + "prefill.h5");
  const golden::H5File dec(kOracle + "decode.h5");
  const Tensor<int32_t> win = window_topk_idxs_prefill(kWindow, 0, kPrefillLen);
  for (int layer : {2, 6, 8}) {
    const std::string g = "prefill/" + layer_name(layer) + "/";
    const Tensor<int32_t> cat = concat_topk_idxs(win, int_tensor(pre, g + "indexer_topk/value"));
    EXPECT_EQ(cat.data(), int_tensor(pre, g + "attn_topk_idxs/value").data()) << layer;
    for (int step : {0, 7}) {
      const std::string d = "decode/step" + std::to_string(step) + "/" + layer_name(layer) + "/";
      const Tensor<int32_t> dcat = concat_topk_idxs(window_topk_idxs_decode(kWindow, kPrefillLen + step),
                                                    int_tensor(dec, d + "indexer_topk/value"));
      EXPECT_EQ(dcat.data(), int_tensor(dec, d + "attn_topk_idxs/value").data()) << d;
    }
  }
}

TEST(AttentionConcat, KvRowsAreWindowThenCompressedCache) {
  const golden::H5File attn(kOracle + "prefill_attn.h5");
  const golden::H5File pre(kOracle + "prefill.h5");
  const Tensor<float> rec = bf16_tensor(attn, "prefill/layer02/sparse_kv/bits");  // [333 + 166, 128]
  const Tensor<float> cache = bf16_tensor(pre, "prefill/state/layer02/compress_kv_cache/bits");
  Tensor<float> window({kPrefillLen, 128}, "window");
  std::copy(rec.data().begin(), rec.data().begin() + window.numel(), window.data().begin());
  EXPECT_EQ(concat_kv_rows(window, cache).data(), rec.data());
}

TEST(AttentionCompressedKvCache, StoresPackedEntriesAndChecksOwnership) {
  model::PackedCache cache("compressed KV cache", formats::CacheFormat::kCompressedKvFp4, /*owner_layer=*/2, /*ratio=*/2,
                    /*head_dim=*/128, /*capacity=*/4);
  EXPECT_EQ(cache.entry_bytes(), 72);  // 64 nibble bytes + 8 E4M3 scales
  EXPECT_EQ(model::PackedCache("compressed KV cache", formats::CacheFormat::kCompressedKvFp4, 20, 1, 512, 1).entry_bytes(), 288);
  Tensor<float> rows({2, 128}, "latent");
  for (int64_t i = 0; i < rows.numel(); ++i) {
    rows.data()[static_cast<size_t>(i)] = formats::round_to_bf16(std::sin(0.37f * static_cast<float>(i)));
  }
  cache.write(seam::reference_ops(), 0, rows);
  std::vector<uint8_t> expect(72);
  formats::pack_compressed_kv(rows.row(1), 128, expect.data());
  EXPECT_EQ(std::vector<uint8_t>(cache.entry(1), cache.entry(1) + 72), expect);
  const Tensor<float> back = cache.read(seam::reference_ops(), 2, 2, 2);
  EXPECT_EQ(back.data(), qdq(formats::CacheFormat::kCompressedKvFp4, rows).data());
  EXPECT_THROW(cache.read(seam::reference_ops(), 4, 2, 2), Error);  // another kv source's consumer
  EXPECT_THROW(cache.read(seam::reference_ops(), 2, 1, 2), Error);  // wrong ratio
  EXPECT_THROW(cache.read(seam::reference_ops(), 2, 2, 3), Error);  // beyond what was written
  EXPECT_THROW(cache.write(seam::reference_ops(), 3, rows), Error); // a gap
  cache.write(seam::reference_ops(), 1, rows);                       // rewrite the tail: size 3
  EXPECT_EQ(cache.size(), 3);
}

}  // namespace
}  // namespace dsv41::reference
