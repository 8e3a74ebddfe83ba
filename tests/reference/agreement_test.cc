// Agreement of the whole reference forward with the official code (golden/oracle): the tiny
// config, the oracle weights and tokens, a 333-token prefill and 8 one-token decode steps.
//
// 1. Teacher-forced, layer by layer, against the default run (prefill_streams.h5, decode.h5):
//    every layer gets the official input stream, and the official top-k, candidate mask and
//    expert choices (the selections are discrete: a near-tie flipped by one ulp upstream would
//    otherwise hide every later comparison). What remains is each layer's own numerical error.
// 2. Free-running against the tie-rule run (tie_lowest_index.h5): measured and printed; the
//    bound is a regression bound (docs/agreement.md explains why selections flip).
// Tolerances are named below with their origin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "formats/minifloat.h"
#include "golden/golden_io.h"
#include "reference/model.h"
#include "reference/weights.h"

namespace dsv41::reference {
namespace {

const std::string kOracle = DSV41_SOURCE_DIR "/golden/oracle/";

// Layer output streams (bf16), teacher-forced. Origin: measured on this oracle (docs/agreement.md):
// the mHC mixes are an fp32 GEMM over hc*dim = 1024 whose MKL order cannot be reproduced (44% of
// the mixes bit-equal, <= 22 fp32 ulp), and torch's SLEEF exp in sparse_attn (15 of 681984
// prefill outputs 1 bf16 ulp off); both reach the stream as occasional 1-2 bf16 ulp differences.
// Measured: NMSE <= 2.2e-7, >= 99.79% bit-equal, <= 2 bf16 ulp (prefill); decode bit-exact but
// for 3 layer-steps of one token each. The bounds are the target (NMSE 1e-6, 2 ulp).
constexpr double kStreamMaxNmse = 1e-6;
constexpr double kStreamMaxUlps = 2.0;  // bf16 ulps of the row maximum
constexpr double kStreamMinEqualFraction = 0.99;
// Logits given the official final stream: the fp32 head GEMM (K = dim) as an FMA chain here and
// in MKL's order there. Measured NMSE <= 9.7e-14; bound: a few fp32 ulp of each logit.
constexpr double kLogitMaxNmse = 1e-12;

std::string lname(int l) {
  char b[16];
  std::snprintf(b, sizeof b, "layer%02d", l);
  return b;
}

std::vector<float> bf16_values(const golden::Array<uint16_t>& a) {
  std::vector<float> v;
  v.reserve(a.size());
  for (uint16_t b : a.data) v.push_back(formats::bf16_decode(b));
  return v;
}

// Compressor partial-group state (fp32): the decode GEMV order (see check_final_caches), in
// fp32 ulps of the slot's largest value. A dim-long fp32 sum in another order errs by up to
// ~dim * 2^-24 * sum|x w|, which has no bound in terms of the result; measured on this oracle:
// 3 to 8 ulps of the slot max. The bound is 4x the worst measured value.
constexpr double kCompressorStateMaxUlps = 32.0;

struct Diff {
  double nmse = 0, max_abs = 0, equal_fraction = 0;
  double max_row_ulps = 0;  // max over rows of max|d| / (bf16 ulp of the row's max |ref|)
};

// Rows of `row` elements (a token's vector, per stream copy).
Diff compare(const std::vector<float>& got, const std::vector<float>& ref, size_t row) {
  EXPECT_EQ(got.size(), ref.size());
  Diff d;
  double num = 0, den = 0;
  size_t equal = 0;
  bool nonzero = false;
  for (size_t r0 = 0; r0 < ref.size() && r0 < got.size(); r0 += row) {
    double rmax = 0, dmax = 0;
    for (size_t i = r0; i < r0 + row && i < ref.size(); ++i) {
      EXPECT_FALSE(std::isnan(got[i])) << "NaN at " << i;
      nonzero |= got[i] != 0.0f;
      const double e = double{got[i]} - ref[i];
      num += e * e;
      den += double{ref[i]} * ref[i];
      dmax = std::max(dmax, std::fabs(e));
      rmax = std::max(rmax, std::fabs(double{ref[i]}));
      equal += f32_bits(got[i]) == f32_bits(ref[i]) ? 1 : 0;
    }
    d.max_abs = std::max(d.max_abs, dmax);
    if (rmax > 0) {
      const double ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(rmax))) - 7);
      d.max_row_ulps = std::max(d.max_row_ulps, dmax / ulp);
    }
  }
  EXPECT_TRUE(nonzero) << "all-zero output";
  d.nmse = den > 0 ? num / den : num;
  d.equal_fraction = ref.empty() ? 1.0 : static_cast<double>(equal) / ref.size();
  return d;
}

// One step of the official run: where its data lives.
struct OracleStep {
  const golden::H5File* streams;  // in_stream / out_stream source
  const golden::H5File* items;    // selections and logits
  std::string prefix;             // "prefill/" or "decode/stepK/"
  int64_t offset;                 // window rows in front of the compressed rows
};

class TeacherForced : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    config_ = new ModelConfig(load_config_file(kOracle + "config.json"));
    prefill_ = new golden::H5File(kOracle + "prefill.h5");
    streams_ = new golden::H5File(kOracle + "prefill_streams.h5");
    decode_ = new golden::H5File(kOracle + "decode.h5");
    const auto map = prefill_->read<int64_t>("prefill/state/engram/token_map/value");
    model_ = new Model(*config_, ModelWeights::load(kOracle + "weights.safetensors", *config_), map.data);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete decode_;
    delete streams_;
    delete prefill_;
    delete config_;
  }

  // Installs hooks that force the official inputs and selections of `step`, and records the
  // layer output streams and the final norm output.
  void force(const OracleStep& step) {
    const ModelConfig& c = *config_;
    ForwardHooks h;
    h.tensor = [this, step, &c](Component what, int layer, Tensor<float>& v) {
      if (what == Component::kInStream) {
        if (layer == 0) {
          const std::vector<float> e = bf16_values(step.streams->read<uint16_t>(step.prefix + "embed/bits"));
          const int64_t T = v.dim(0), hc = v.dim(1), dim = v.dim(2);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < hc; ++i) std::copy(e.begin() + t * dim, e.begin() + (t + 1) * dim, v.row(t, i));
        } else {
          v.data() = bf16_values(step.streams->read<uint16_t>(step.prefix + lname(layer - 1) + "/out_stream/bits"));
        }
      } else if (what == Component::kInPre && layer > 0) {
        v.data() = step.items->read<float>(step.prefix + lname(layer - 1) + "/next_pre/value").data;
      } else if (what == Component::kOutStream) {
        out_streams_[layer] = v.data();
      }
      (void)c;
    };
    h.index = [step](Component what, int layer, Tensor<int32_t>& v) {
      if (what == Component::kTopk) {
        const auto ref = step.items->read<int32_t>(step.prefix + lname(layer) + "/indexer_topk/value");
        ASSERT_EQ(static_cast<int64_t>(ref.size()), v.numel());
        for (size_t i = 0; i < ref.size(); ++i) {
          v.data()[i] = ref.data[i] < 0 ? -1 : static_cast<int32_t>(ref.data[i] - step.offset);
        }
      } else if (what == Component::kExperts) {
        const auto ref = step.items->read<int64_t>(step.prefix + lname(layer) + "/gate_indices/value");
        ASSERT_EQ(static_cast<int64_t>(ref.size()), v.numel());
        for (size_t i = 0; i < ref.size(); ++i) v.data()[i] = static_cast<int32_t>(ref.data[i]);
      }
    };
    h.mask = [step](Component what, int layer, Tensor<uint8_t>& v) {
      if (what != Component::kCandidates) return;
      const auto ref = step.items->read<uint8_t>(step.prefix + lname(layer) + "/candidates/value");
      ASSERT_EQ(static_cast<int64_t>(ref.size()), v.numel());
      v.data() = ref.data;
    };
    model_->set_hooks(std::move(h));
  }

  void check_step(const OracleStep& step, const StepRecord& rec, const std::string& logits_path) {
    for (int l = 0; l < config_->n_layers; ++l) {
      const std::vector<float> ref =
          bf16_values(step.streams->read<uint16_t>(step.prefix + lname(l) + "/out_stream/bits"));
      const Diff d = compare(out_streams_.at(l), ref, static_cast<size_t>(config_->dim));
      std::printf("%-14s %s out_stream: nmse %.2e max|d| %.3g (%.2f bf16 ulp of row max) bit-equal %.5f\n",
                  step.prefix.c_str(), lname(l).c_str(), d.nmse, d.max_abs, d.max_row_ulps,
                  d.equal_fraction);
      EXPECT_LE(d.nmse, kStreamMaxNmse) << step.prefix << lname(l);
      EXPECT_GE(d.equal_fraction, kStreamMinEqualFraction) << step.prefix << lname(l);
      EXPECT_LE(d.max_row_ulps, kStreamMaxUlps) << step.prefix << lname(l);
    }
    const auto ref_logits = step.items->read<float>(logits_path);
    const Diff d = compare(rec.logits, ref_logits.data, ref_logits.size());
    std::printf("%-14s logits: nmse %.2e max|d| %.3g (%.4f bf16 ulp of row max)\n", step.prefix.c_str(),
                d.nmse, d.max_abs, d.max_row_ulps);
    EXPECT_LE(d.nmse, kLogitMaxNmse) << step.prefix;
  }

  // The caches after the last step against decode/final_state: values bit for bit (the packed
  // entries decode to exactly the official bf16 cache values), compressor states exactly.
  void check_final_caches(const ModelState& s) {
    const std::string base = "decode/final_state/";
    int64_t compared = 0;
    for (int l = 0; l < config_->n_layers; ++l) {
      const LayerState& ls = s.layers[static_cast<size_t>(l)];
      const auto ring = decode_->read<uint16_t>(base + lname(l) + "/window_kv_cache/bits");
      expect_bits(ls.window_kv.read_all(reference_ops()).data(), ring, lname(l) + " window_kv_cache");
      compared += static_cast<int64_t>(ring.size());
      if (ls.compressed_kv) {
        const auto ref = decode_->read<uint16_t>(base + lname(l) + "/compress_kv_cache/bits");
        expect_bits(ls.compressed_kv->read(reference_ops(), l, ls.compressed_kv->ratio(), ref.dim(1)).data(), ref, lname(l) + " compress_kv_cache");
        compared += static_cast<int64_t>(ref.size());
      }
      if (ls.index_keys) {
        const auto ref = decode_->read<uint16_t>(base + lname(l) + "/index_k_cache/bits");
        expect_bits(ls.index_keys->read(reference_ops(), l, ls.index_keys->ratio(), ref.dim(1)).data(), ref, lname(l) + " index_k_cache");
        compared += static_cast<int64_t>(ref.size());
      }
      if (ls.compressor) {
        // fp32 wkv/wgate rows of the last decode steps: torch's one-row GEMV sums in an order
        // the reference does not reproduce (its multi-row GEMM it does: prefill states match).
        for (const char* what : {"compressor_kv_state", "compressor_score_state"}) {
          const auto ref = decode_->read<float>(base + lname(l) + "/" + what + "/value");
          const std::vector<float>& got = std::string(what) == "compressor_kv_state" ? ls.compressor->kv.data()
                                                                                    : ls.compressor->score.data();
          ASSERT_EQ(got.size(), ref.size());
          const size_t row = static_cast<size_t>(config_->head_dim);
          double worst = 0;  // max |d| in fp32 ulps of the slot's max |value|
          for (size_t r0 = 0; r0 < got.size(); r0 += row) {
            double rmax = 0, dmax = 0;
            for (size_t i = r0; i < r0 + row; ++i) {
              rmax = std::max(rmax, std::fabs(double{ref.data[i]}));
              dmax = std::max(dmax, std::fabs(double{got[i]} - ref.data[i]));
            }
            if (rmax > 0) worst = std::max(worst, dmax / std::ldexp(1.0, static_cast<int>(std::floor(std::log2(rmax))) - 23));
          }
          std::printf("%s %s: max %.2f fp32 ulp of the slot max\n", lname(l).c_str(), what, worst);
          EXPECT_LE(worst, kCompressorStateMaxUlps) << lname(l) << " " << what;
        }
      }
    }
    std::printf("final caches: %lld bf16 values compared bit for bit\n", static_cast<long long>(compared));
  }

  static void expect_bits(const std::vector<float>& got, const golden::Array<uint16_t>& ref, const std::string& what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    size_t differ = 0, first = ref.size();
    bool nonzero = false;
    for (size_t i = 0; i < ref.size(); ++i) {
      nonzero |= got[i] != 0.0f;
      if (formats::bf16_encode(got[i]) != ref.data[i]) {
        if (differ++ == 0) first = i;
      }
    }
    EXPECT_TRUE(nonzero) << what << " is all zero";
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << ref.size() << " values differ, first at " << first;
  }

  static ModelConfig* config_;
  static golden::H5File *prefill_, *streams_, *decode_;
  static Model* model_;
  std::map<int, std::vector<float>> out_streams_;
};

ModelConfig* TeacherForced::config_ = nullptr;
golden::H5File* TeacherForced::prefill_ = nullptr;
golden::H5File* TeacherForced::streams_ = nullptr;
golden::H5File* TeacherForced::decode_ = nullptr;
Model* TeacherForced::model_ = nullptr;

TEST_F(TeacherForced, EveryLayerOfPrefillAndDecodeMatchesTheOfficialRun) {
  ModelState s = model_->new_state();
  const auto tokens = prefill_->read<int64_t>("prefill/tokens/value");
  const OracleStep p{streams_, prefill_, "prefill/", static_cast<int64_t>(tokens.size())};
  force(p);
  const StepRecord r0 = model_->prefill(s, tokens.data);
  check_step(p, r0, "prefill/logits_last/value");
  for (int k = 0; k < 8; ++k) {
    const std::string prefix = "decode/step" + std::to_string(k) + "/";
    const OracleStep d{decode_, decode_, prefix, config_->window_size};
    force(d);
    const auto tok = decode_->read<int64_t>(prefix + "input_token/value");
    const StepRecord r = model_->decode(s, tok.data[0]);
    check_step(d, r, prefix + "logits/value");
  }
  check_final_caches(s);
}

}  // namespace
}  // namespace dsv41::reference

namespace dsv41::reference {
namespace {

// Free-running against the tie-rule run: nothing forced. A selection that sits at a near-tie
// (index scores are bf16, expert scores fp32) flips on a 1-ulp upstream difference and changes
// everything after it, so this is a measurement with regression bounds (docs/agreement.md):
// measured NMSE <= 0.084 per step and the argmax equal at 7 of 9 steps.
constexpr double kFreeRunMaxNmse = 0.2;
constexpr int kFreeRunMinArgmaxAgree = 6;

TEST(FreeRunning, LogitsAgainstTheTieRuleRun) {
  const ModelConfig c = load_config_file(kOracle + "config.json");
  golden::H5File prefill(kOracle + "prefill.h5"), decode(kOracle + "decode.h5");
  golden::H5File tie(kOracle + "tie_lowest_index.h5");
  const auto tokens = prefill.read<int64_t>("prefill/tokens/value");
  const auto map = prefill.read<int64_t>("prefill/state/engram/token_map/value");
  Model m(c, ModelWeights::load(kOracle + "weights.safetensors", c), map.data);
  ModelState s = m.new_state();
  int agree = 0;
  for (int k = -1; k < 8; ++k) {
    StepRecord r;
    std::string ref_path;
    if (k < 0) {
      r = m.prefill(s, tokens.data);
      ref_path = "prefill/logits_last/value";
    } else {
      const std::string p = "decode/step" + std::to_string(k) + "/";
      r = m.decode(s, decode.read<int64_t>(p + "input_token/value").data[0]);
      ref_path = p + "logits/value";
    }
    const auto ref = tie.read<float>(ref_path);
    const Diff d = compare(r.logits, ref.data, ref.size());
    const auto argmax = [](const std::vector<float>& v) {
      return std::max_element(v.begin(), v.end()) - v.begin();
    };
    const bool same = argmax(r.logits) == argmax(ref.data);
    agree += same ? 1 : 0;
    std::printf("free-running step %d: nmse %.3g max|d| %.3g argmax %s\n", k + 1, d.nmse, d.max_abs,
                same ? "equal" : "differs");
    EXPECT_LE(d.nmse, kFreeRunMaxNmse) << ref_path;
  }
  EXPECT_GE(agree, kFreeRunMinArgmaxAgree);
}

}  // namespace
}  // namespace dsv41::reference
