// tests/cuda/deferred_checks_test.cc: the deferred input checks of the CUDA ops table
// (DSV41_CUDA_DEFER_CHECKS, cuda/deferred_checks.h) and the host-sync counter (gpu::host_sync_counts).
//   host (no device needed): the switch's parsing; PendingChecks' bookkeeping and its error.
//   device (skips without one), on CudaMode::kProduction with prepared weights:
//     (a) a decode-like chain of linears (F8 production, F4 and BF16 exact, fp32) gives the same bits
//         with deferral on as off;
//     (b) with deferral on, a non-bf16 / non-finite input raises no error at the linear, the later
//         ops run, and the next download throws an Error naming the linear (and the ops work on
//         after it); the same for qdq's non-finite row; with deferral off the linear itself throws;
//     (c) the host syncs a linear costs: 1 each with deferral off (its status readback), 0 with it
//         on (a prepared weight, a device input), and the download that resolves them costs only itself.
// Random data: DSV41_SEED=<n> reproduces a run (the seed is printed).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/deferred_checks.h"
#include "formats/cache_format.h"
#include "reference/checkpoint/weights.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/error_of.h"

namespace dsv41::test {
namespace {

using reference::DType;
using reference::LinearWeight;
using reference::Tensor;

// ---- host ----

TEST(DeferChecksSwitch, Parses) {
  EXPECT_FALSE(gpu::parse_defer_checks(nullptr));
  EXPECT_FALSE(gpu::parse_defer_checks(""));
  EXPECT_FALSE(gpu::parse_defer_checks("0"));
  EXPECT_TRUE(gpu::parse_defer_checks("1"));
  for (const char* bad : {"yes", "2", "on", " 1"}) {
    try {
      gpu::parse_defer_checks(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DSV41_CUDA_DEFER_CHECKS"), std::string::npos) << e.what();
    }
  }
}

TEST(PendingChecks, SlotsInOrderAndCleared) {
  gpu::PendingChecks p(3);
  EXPECT_EQ(p.add("a"), 0);
  EXPECT_EQ(p.add("b"), 1);
  EXPECT_EQ(p.pending(), 2);
  EXPECT_FALSE(p.full());
  const int none[2] = {0, 0};
  EXPECT_NO_THROW(p.resolve(none, 2));
  EXPECT_EQ(p.pending(), 0);
  EXPECT_EQ(p.add("c"), 0);  // slots start over after a resolution
}

TEST(PendingChecks, NamesTheFirstFailedAndForgetsAll) {
  gpu::PendingChecks p(4);
  p.add("linear 'layers.0.attn.wq_a' (F8_E4M3): first");
  p.add("linear 'layers.3.attn.wq_b' (F8_E4M3): second");
  p.add("qdq of 'kv': third");
  const int flags[3] = {0, 1, 7};
  try {
    p.resolve(flags, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layers.3.attn.wq_b"), std::string::npos) << m;
    EXPECT_EQ(m.find("layers.0.attn.wq_a"), std::string::npos) << m;
    EXPECT_NE(m.find("deferred check"), std::string::npos) << m;
    EXPECT_NE(m.find("1 later check"), std::string::npos) << m;
    EXPECT_NE(m.find("DSV41_CUDA_DEFER_CHECKS=0"), std::string::npos) << m;
  }
  EXPECT_EQ(p.pending(), 0);
}

TEST(PendingChecks, FullAndMismatchThrow) {
  gpu::PendingChecks p(2);
  p.add("a");
  p.add("b");
  EXPECT_TRUE(p.full());
  EXPECT_THROW(p.add("c"), Error);
  const int flags[1] = {0};
  EXPECT_THROW(p.resolve(flags, 1), Error);  // 1 flag for 2 checks
  EXPECT_THROW(gpu::PendingChecks(0), Error);
}

// ---- device ----

// Four weights registered with prepare() (as a model's are): F8 [512, 256] (the production GEMM),
// F4 [256, 512] (exact block-scaled), BF16 [256, 256] (exact, bf16 check) and F8 [64, 256] for
// linear_fp32 (no check). prepare() finds them in the slots of an otherwise empty ModelWeights.
struct Weights {
  reference::checkpoint::ModelWeights m;
  Weights() {
    m.head = random_weight(DType::kF8E4M3, 512, 256);
    m.head.name = "layers.3.attn.wq_a";
    m.dspark.main_proj = random_weight(DType::kF4, 256, 512);
    m.dspark.main_proj.name = "layers.3.ffn.w2";
    m.dspark.markov_head = random_weight(DType::kBF16, 256, 256);
    m.dspark.markov_head.name = "layers.3.attn.wo_b";
    m.dspark.confidence_proj = random_weight(DType::kF8E4M3, 64, 256);
    m.dspark.confidence_proj.name = "layers.3.ffn.gate";
  }
  const LinearWeight& f8() const { return m.head; }
  const LinearWeight& f4() const { return m.dspark.main_proj; }
  const LinearWeight& bf16() const { return m.dspark.markov_head; }
  const LinearWeight& fp32() const { return m.dspark.confidence_proj; }
};

// A CudaOps of its own (production), with `w` prepared and deferral as asked.
struct Backend {
  gpu::CudaOps ops{gpu::CudaMode::kProduction};
  const Weights& w;
  Backend(const Weights& weights, bool defer) : w(weights) {
    ops.prepare(w.m, {});
    ops.set_defer_checks(defer);
  }
  ~Backend() { ops.release(w.m, {}); }
};

// The chain: x [T, 256] -> F8 -> [T, 512] -> F4 -> [T, 256] -> BF16 -> [T, 256] -> fp32 F8 -> [T, 64];
// every intermediate downloaded at the end (the only synchronizations).
std::vector<Tensor<float>> chain(const Backend& b, const Tensor<float>& x_host, int rounds) {
  const gpu::CudaOps& ops = b.ops;
  std::vector<Tensor<float>> dev_out;
  Tensor<float> x = ops.upload(x_host);
  for (int r = 0; r < rounds; ++r) {
    Tensor<float> y1 = ops.linear(x, b.w.f8());
    Tensor<float> y2 = ops.linear(y1, b.w.f4());
    Tensor<float> y3 = ops.linear(y2, b.w.bf16());
    Tensor<float> y4 = ops.linear_fp32(y3, b.w.fp32());
    dev_out.push_back(y1);
    dev_out.push_back(y2);
    dev_out.push_back(y3);
    dev_out.push_back(y4);
    x = y3;
  }
  std::vector<Tensor<float>> out;
  for (Tensor<float>& t : dev_out) out.push_back(ops.download(std::move(t)));
  return out;
}

TEST(DeferredChecks, SameBitsAsSynchronous) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Weights w;
  for (int64_t T : {1, 4}) {
    const Tensor<float> x = random_bf16({T, 256}, 1.0f, "x");
    const Backend off(w, false), on(w, true);
    const std::vector<Tensor<float>> a = chain(off, x, 3), b = chain(on, x, 3);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      bool nonzero = false, finite = true;
      for (float v : a[i].data()) {
        nonzero = nonzero || v != 0.0f;
        finite = finite && std::isfinite(v);
      }
      EXPECT_TRUE(nonzero && finite) << "T " << T << " output " << i << ": all zero or not finite";
      EXPECT_TRUE(same_bits(a[i], b[i])) << "T " << T << " output " << i;
    }
  }
}

TEST(DeferredChecks, BadLinearInputRaisesAtTheNextDownload) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Weights w;
  Tensor<float> bad_value = random_bf16({2, 256}, 1.0f, "x");
  bad_value.data()[300] = 1.0f + 0x1p-12f;  // not a bf16 value
  Tensor<float> bad_block = random_bf16({2, 256}, 1.0f, "x");
  bad_block.data()[40] = std::numeric_limits<float>::infinity();  // a non-finite act_quant block
  for (const Tensor<float>* x : {&bad_value, &bad_block}) {
    {  // off: the linear itself raises the reference's error
      const Backend off(w, false);
      const std::string m = error_of([&] { off.ops.linear(off.ops.upload(*x), w.f8()); });
      EXPECT_NE(m.find("layers.3.attn.wq_a"), std::string::npos) << m;
      EXPECT_EQ(m.find("deferred"), std::string::npos) << m;
    }
    const Backend on(w, true);
    Tensor<float> y1, y3;
    ASSERT_NO_THROW({
      y1 = on.ops.linear(on.ops.upload(*x), w.f8());  // no error yet: the check is pending
      y3 = on.ops.linear(on.ops.linear(y1, w.f4()), w.bf16());  // later ops run on what they got
    });
    const std::string m = error_of([&] { on.ops.download(y3); });
    EXPECT_NE(m.find("linear 'layers.3.attn.wq_a' (F8_E4M3)"), std::string::npos) << m;
    EXPECT_NE(m.find("deferred check"), std::string::npos) << m;
    // Resolved: the backend goes on (a good input, no error).
    const Tensor<float> good = random_bf16({2, 256}, 1.0f, "x");
    EXPECT_NO_THROW(on.ops.download(on.ops.linear(on.ops.upload(good), w.f8())));
    EXPECT_NO_THROW(on.ops.resolve_checks());
  }
  {  // a non-bf16 input of the exact BF16 linear, resolved by resolve_checks()
    const Backend on(w, true);
    Tensor<float> x = random_bf16({1, 256}, 1.0f, "x");
    x.data()[5] = 0.1f;
    ASSERT_NO_THROW(on.ops.linear(on.ops.upload(x), w.bf16()));
    const std::string m = error_of([&] { on.ops.resolve_checks(); });
    EXPECT_NE(m.find("linear 'layers.3.attn.wo_b' (BF16)"), std::string::npos) << m;
  }
}

TEST(DeferredChecks, NonFiniteQdqRowRaisesAtTheNextDownload) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Weights w;
  Tensor<float> x = random_bf16({3, 512}, 1.0f, "kv");
  x.data()[700] = std::numeric_limits<float>::quiet_NaN();
  const formats::CacheFormat f = formats::CacheFormat::kCompressedKvFp4;
  {
    const Backend off(w, false);
    EXPECT_THROW(off.ops.qdq(f, off.ops.upload(x)), Error);
  }
  const Backend on(w, true);
  Tensor<float> y;
  ASSERT_NO_THROW(y = on.ops.qdq(f, on.ops.upload(x)));
  const std::string m = error_of([&] { on.ops.download(y); });
  EXPECT_NE(m.find("qdq of 'kv'"), std::string::npos) << m;
}

TEST(DeferredChecks, SyncsPerLinear) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const Weights w;
  const Tensor<float> x_host = random_bf16({1, 256}, 1.0f, "x");
  constexpr int kRounds = 4;  // each: 3 checked linears (F8, F4, BF16) and one fp32 (checks nothing)
  int64_t per_mode[2] = {0, 0};
  for (bool defer : {false, true}) {
    const Backend b(w, defer);
    Tensor<float> x = b.ops.upload(x_host);
    // First use: the F8 codes are encoded, the check slots made (one-off synchronizations).
    b.ops.download(b.ops.linear_fp32(b.ops.linear(b.ops.linear(b.ops.linear(x, w.f8()), w.f4()), w.bf16()), w.fp32()));
    std::vector<Tensor<float>> fp32_out;
    const int64_t s0 = gpu::host_sync_count();
    for (int r = 0; r < kRounds; ++r) {
      x = b.ops.linear(b.ops.linear(b.ops.linear(x, w.f8()), w.f4()), w.bf16());  // [1, 256]
      fp32_out.push_back(b.ops.linear_fp32(x, w.fp32()));                         // [1, 64]
    }
    const int64_t s1 = gpu::host_sync_count();
    const Tensor<float> y = b.ops.download(x);
    const int64_t s2 = gpu::host_sync_count();
    per_mode[defer ? 1 : 0] = s1 - s0;
    EXPECT_EQ(s2 - s1, 1) << "the download that resolves the checks (defer " << defer << ")";
    bool nonzero = false;
    for (float v : y.data()) nonzero = nonzero || v != 0.0f;
    EXPECT_TRUE(nonzero);
    std::printf("defer %d: %lld host syncs for %d linears (%d checked), then 1 for the download\n", defer ? 1 : 0,
                static_cast<long long>(s1 - s0), kRounds * 4, kRounds * 3);
  }
  EXPECT_EQ(per_mode[0], kRounds * 3);  // one status readback per checked linear
  EXPECT_EQ(per_mode[1], 0);            // none: the checks wait for the download
}

}  // namespace
}  // namespace dsv41::test
