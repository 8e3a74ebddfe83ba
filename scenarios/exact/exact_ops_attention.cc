// compress (softmax pooling), index_scores and sparse_attn of the exact evaluation
// (scenarios/exact/exact_eval.h); bounds docs/cuda.md "Tolerances with their origin".
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "formats/cache_format.h"
#include "scenarios/exact/exact_internal.h"

namespace dsv41::scenarios::exact {
namespace {

using reference::Tensor;
const double kInf = std::numeric_limits<double>::infinity();

// Ratio-r pooling per channel: w_t = softmax_t(s_t), latent = sum_t kv_t w_t exact. Computed:
// d_t = fl(s_t - m), e_t = expf(d_t) (<= 1 ulp: rel 2u), z = fp32 sum of r terms, w_t = fl(e_t / z),
// latent = fp32 sum of r rounded products. With eps_e = max_t exp(u |d_t|)(1 + 2u) - 1 and
// eps_w = (1 + eps_e)(1 + u) / ((1 - eps_e)(1 - gamma_{r-1})) - 1:
// |err| <= ((1 + eps_w)(1 + gamma_r) - 1) sum_t |kv_t| w_t; then bf16.
OpCase compress_case(const std::string& inputs, const Tensor<float>& kv, const Tensor<float>& score, int ratio) {
  const int64_t T = kv.dim(0), dim = kv.dim(1), G = T / ratio;
  OpCase c;
  c.op = "compress";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = ratio;
  c.row = dim;
  c.out = kBf16;
  c.precisions = "kv, score fp32; fp32 softmax (expf), fp32 products and sums";
  c.formula = "((1+eps_w)(1+gamma_r(u32))-1) sum|kv w| + ulp_bf16/2 (eps_w from expf 1 ulp, docs/cuda.md)";
  const double u = kU32;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t ch = 0; ch < dim; ++ch) {
      float m = score.at(g * ratio, ch);
      for (int t = 1; t < ratio; ++t) m = std::max(m, score.at(g * ratio + t, ch));
      Exact z = 0, y = 0, mag = 0;
      double eps_e = 0;
      std::vector<Exact> e(static_cast<size_t>(ratio));
      for (int t = 0; t < ratio; ++t) {
        const Exact d = exact_of(score.at(g * ratio + t, ch)) - exact_of(m);
        e[static_cast<size_t>(t)] = mp::exp(d);
        z += e[static_cast<size_t>(t)];
        eps_e = std::max(eps_e, std::exp(u * std::fabs(to_double(d))) * (1 + 2 * u) - 1);
      }
      for (int t = 0; t < ratio; ++t) {
        const Exact w = e[static_cast<size_t>(t)] / z;
        y += exact_of(kv.at(g * ratio + t, ch)) * w;
        mag += mp::abs(exact_of(kv.at(g * ratio + t, ch))) * w;
      }
      const double eps_w = (1 + eps_e) * (1 + u) / ((1 - eps_e) * (1 - gamma(ratio - 1, u))) - 1;
      c.exact.push_back(y);
      c.bound.push_back(finish_bound(y, ((1 + eps_w) * (1 + gamma(ratio, u)) - 1) * to_double(mag), kBf16));
    }
  }
  c.run = [kv, score, ratio, dim](const reference::seam::Ops& ops) {
    Tensor<float> kv_state = ops.upload(Tensor<float>({ratio, dim}, "kv_state"));
    Tensor<float> score_state =
        ops.upload(Tensor<float>({ratio, dim}, "score_state", -std::numeric_limits<float>::infinity()));
    reference::CompressedLatents l = ops.compress(ops.upload(kv), ops.upload(score), 0, ratio, kv_state, score_state);
    return ops.download(std::move(l.latent)).data();
  };
  return c;
}

// An index_keys cache of `keys` (packed by the reference) and its values (the exact decode).
struct KeyCache {
  Tensor<uint8_t> bytes;
  Tensor<float> values;  // [N, Di] the dequantized keys
};
KeyCache make_key_cache(const Tensor<float>& keys) {
  const int64_t N = keys.dim(0), Di = keys.dim(1);
  const auto f = formats::CacheFormat::kIndexKeysFp4;
  KeyCache k{Tensor<uint8_t>({N, formats::entry_bytes(f, static_cast<int>(Di))}, "index_keys"), {}};
  std::vector<int64_t> entries(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) entries[static_cast<size_t>(i)] = i;
  reference::seam::reference_ops().write_entries(k.bytes, f, entries, keys);
  k.values = reference::seam::reference_ops().read_entries(reference::CacheRows{f, Di, N, &k.bytes}, entries);
  return k;
}

// Semantics (reference/ops/indexer.h) with the bf16 steps applied exactly: dot = bf16(q.k),
// term = bf16(relu(dot) w), score = sum_h term (final bf16 excluded); -inf beyond reach.
// Computed dot: double sum (gamma_Di(u64) S) -> fp32 -> bf16: an interval through the two
// roundings; term: fp32 product -> bf16, the interval again; the fp32 sum over Hi heads:
// |err| <= sum_h dev_h + gamma_{Hi-1}(u32) sum_h max|term_h|, dev_h = the interval's largest
// distance from the exact term; then bf16.
OpCase index_scores_case(const std::string& inputs, const Tensor<float>& q, const Tensor<float>& keys,
                         const Tensor<float>& weights, const std::vector<int64_t>& reach) {
  const int64_t T = q.dim(0), Hi = q.dim(1), Di = q.dim(2);
  const KeyCache cache = make_key_cache(keys);
  const int64_t N = keys.dim(0);
  OpCase c;
  c.op = "index_scores";
  c.inputs = inputs;
  c.adversarial = inputs != "random";
  c.reduction = Di * Hi;
  c.row = N;
  c.out = kBf16;
  c.precisions = "q, k FP4-QDQ bf16, w bf16; dot double -> fp32 -> bf16, term fp32 -> bf16, fp32 sum over heads";
  c.formula = "sum_h dev_h + gamma_{Hi-1}(u32) sum_h|term_h| + ulp_bf16/2 (dev_h: interval through the bf16 steps)";
  const std::vector<Format> to_bf16{kF32, kBf16};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      if (n >= reach[static_cast<size_t>(t)]) {
        c.exact.push_back(Exact(-kInf));
        c.bound.push_back(0.0);
        continue;
      }
      Exact score = 0, dev = 0, mag = 0;
      for (int64_t h = 0; h < Hi; ++h) {
        Exact dot = 0, s = 0;
        for (int64_t i = 0; i < Di; ++i) {
          const Exact p = exact_of(q.at(t, h, i)) * exact_of(cache.values.at(n, i));
          dot += p;
          s += mp::abs(p);
        }
        const Exact r = Exact(gamma(Di, kU64)) * s;
        const Exact w = exact_of(weights.at(t, h));
        const Exact term = round_to(std::max<Exact>(round_to(dot, kBf16), Exact(0)) * w, kBf16);
        Exact lo = std::max<Exact>(round_chain(dot - r, to_bf16), Exact(0)) * w;
        Exact hi = std::max<Exact>(round_chain(dot + r, to_bf16), Exact(0)) * w;
        if (lo > hi) std::swap(lo, hi);
        lo = round_chain(lo, to_bf16);
        hi = round_chain(hi, to_bf16);
        score += term;
        dev += std::max<Exact>(mp::abs(lo - term), mp::abs(hi - term));
        mag += std::max<Exact>(mp::abs(lo), mp::abs(hi));
      }
      c.exact.push_back(score);
      c.bound.push_back(finish_bound(score, to_double(dev) + gamma(std::max<int64_t>(Hi - 1, 1), kU32) * to_double(mag), kBf16));
    }
  }
  const Tensor<uint8_t> bytes = cache.bytes;
  c.run = [q, bytes, weights, reach, N, Di](const reference::seam::Ops& ops) {
    const Tensor<uint8_t> dev_bytes = ops.upload(bytes);
    const reference::CacheRows rows{formats::CacheFormat::kIndexKeysFp4, Di, N, &dev_bytes};
    return ops.download(ops.index_scores(ops.upload(q), rows, ops.upload(weights), reach)).data();
  };
  return c;
}

// Per [T, N] position of a top-k: 1 certainly in, -1 certainly out, 0 either (topk_membership of
// the intervals exact score +- its bound; a position outside `pool`, when it has rank 2: -inf).
std::vector<int8_t> sure_topk(const OpCase& scores, int64_t T, int64_t N, int k, const Tensor<uint8_t>& pool) {
  const bool pooled = pool.rank() == 2;
  DSV41_CHECK(!pooled || (pool.dim(0) == T && pool.dim(1) == N), "exact: a top-k pool of the wrong shape");
  std::vector<int8_t> sure;  // [T, N]
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> lo(static_cast<size_t>(N)), hi(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(t * N + n);
      const bool out = pooled && pool.at(t, n) == 0;
      lo[static_cast<size_t>(n)] = out ? -kInf : to_double(scores.exact[i]) - scores.bound[i];
      hi[static_cast<size_t>(n)] = out ? -kInf : to_double(scores.exact[i]) + scores.bound[i];
    }
    const std::vector<int8_t> m = topk_membership(lo, hi, k);
    sure.insert(sure.end(), m.begin(), m.end());
  }
  return sure;
}

// Per row of a side's top-k [T, >= 0] (-1 padding): 1 when it misses a position certainly in or
// takes one certainly out (`sure`, sure_topk), else 0.
std::vector<float> selection_flags(const Tensor<int32_t>& top, const std::vector<int8_t>& sure, int64_t T, int64_t N) {
  std::vector<float> flags(static_cast<size_t>(T), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<bool> chosen(static_cast<size_t>(N), false);
    for (int64_t j = 0; j < top.dim(1); ++j) {
      if (top.at(t, j) >= 0) chosen[static_cast<size_t>(top.at(t, j))] = true;
    }
    for (int64_t n = 0; n < N; ++n) {
      const int8_t su = sure[static_cast<size_t>(t * N + n)];
      if ((su == 1 && !chosen[static_cast<size_t>(n)]) || (su == -1 && chosen[static_cast<size_t>(n)])) {
        flags[static_cast<size_t>(t)] = 1.0f;
      }
    }
  }
  return flags;
}

// A selection case: per query row one output, the row's selection_flags, exact 0, bound 0.
OpCase selection_case(const char* op, const OpCase& scores, int64_t T, int64_t N, const char* precisions) {
  OpCase c;
  c.op = op;
  c.flags = true;
  c.inputs = scores.inputs;
  c.adversarial = scores.adversarial;
  c.reduction = N;
  c.out = kF32;
  c.precisions = precisions;
  c.formula = "tie-aware: certainly-in positions chosen, certainly-out ones not (0 = correct)";
  c.exact.assign(static_cast<size_t>(T), Exact(0));
  c.bound.assign(static_cast<size_t>(T), 0.0);
  return c;
}

// index_topk of each side's OWN index_scores (the pipeline an order-variant indexer runs), compared
// tie-aware: per query row one output, 1 when the selection misses a position certainly in the
// top k or takes one certainly out (intervals: exact score +- its bound), exact 0, bound 0.
OpCase index_topk_case(const OpCase& scores, const Tensor<float>& q, const Tensor<float>& keys,
                       const Tensor<float>& weights, const std::vector<int64_t>& reach, int k) {
  const int64_t T = q.dim(0), N = keys.dim(0);
  const std::vector<int8_t> sure = sure_topk(scores, T, N, k, Tensor<uint8_t>());
  OpCase c = selection_case("index_topk", scores, T, N, "the side's own bf16 index scores; top-k, lower position wins ties");
  const Tensor<uint8_t> bytes = make_key_cache(keys).bytes;
  c.run = [q, bytes, weights, reach, N, T, k, sure](const reference::seam::Ops& ops) {
    const Tensor<uint8_t> dev_bytes = ops.upload(bytes);
    const reference::CacheRows rows{formats::CacheFormat::kIndexKeysFp4, q.dim(2), N, &dev_bytes};
    const Tensor<float> s = ops.index_scores(ops.upload(q), rows, ops.upload(weights), reach);
    return selection_flags(ops.download(ops.index_topk(s, reach, k)), sure, T, N);
  };
  return c;
}

// index_select, the fused selection of one index layer (Ops::index_select: a backend may score and
// select without a [T, N] score matrix), judged as index_topk_case judges the composition (positions
// outside `pool`, when given, are -inf: never chosen).
OpCase index_select_case(const OpCase& scores, const Tensor<float>& q, const Tensor<float>& keys,
                         const Tensor<float>& weights, const std::vector<int64_t>& reach, int k,
                         const Tensor<uint8_t>& pool) {
  const int64_t T = q.dim(0), N = keys.dim(0);
  const bool pooled = pool.rank() == 2;
  const std::vector<int8_t> sure = sure_topk(scores, T, N, k, pool);
  OpCase c = selection_case("index_select", scores, T, N,
                            "fused: the side's own index scores (never materialised), top-k, lower position wins ties");
  c.inputs += pooled ? ", pool" : "";
  const Tensor<uint8_t> bytes = make_key_cache(keys).bytes;
  c.run = [q, bytes, weights, reach, N, T, k, sure, pool, pooled](const reference::seam::Ops& ops) {
    const Tensor<uint8_t> dev_bytes = ops.upload(bytes);
    const reference::CacheRows rows{formats::CacheFormat::kIndexKeysFp4, q.dim(2), N, &dev_bytes};
    const Tensor<uint8_t> dev_pool = pooled ? ops.upload(pool) : Tensor<uint8_t>();
    reference::IndexSelectSpec spec;
    spec.index_topk = k;
    spec.pool = pooled ? &dev_pool : nullptr;
    return selection_flags(ops.download(ops.index_select(ops.upload(q), rows, ops.upload(weights), reach, spec).topk),
                           sure, T, N);
  };
  return c;
}

// A candidate pool [T, N] keeping every other block of 8 positions, so that each row's pool holds at
// least k reachable positions (asserted: else the top-k would have to take -inf positions).
Tensor<uint8_t> every_other_block(int64_t T, int64_t N, const std::vector<int64_t>& reach, int k) {
  Tensor<uint8_t> pool({T, N}, "pool");
  for (int64_t t = 0; t < T; ++t) {
    int64_t kept = 0;
    for (int64_t n = 0; n < N; ++n) {
      pool.at(t, n) = (n / 8) % 2 == 0 ? 1 : 0;
      kept += pool.at(t, n) && n < reach[static_cast<size_t>(t)];
    }
    DSV41_CHECK(kept >= k, "exact: index_select pool of row ", t, " keeps ", kept, " reachable positions, fewer than ", k);
  }
  return pool;
}

}  // namespace

void add_attention_cases(Sizes sizes, uint64_t seed, std::vector<OpCase>& out) {
  const bool small = sizes == Sizes::kSmall;
  {
    Draws d(seed, "compress");
    const int64_t T = small ? 64 : 8, dim = 128;
    Tensor<float> kv({T, dim}, "kv"), score({T, dim}, "score");
    for (float& v : kv.data()) v = d.f32(1.0);
    for (float& v : score.data()) v = d.f32(2.0);
    out.push_back(compress_case("random", kv, score, 2));
    Tensor<float> tied = score;  // equal scores in every group: weights 1/2 each
    for (int64_t t = 1; t < T; t += 2) std::copy(tied.row(t - 1), tied.row(t - 1) + dim, tied.row(t));
    out.push_back(compress_case("ties", kv, tied, 2));
    Tensor<float> wide = score;  // one weight near 1, the other down to e^-80
    for (float& v : wide.data()) v *= 20.0f;
    out.push_back(compress_case("wide", kv, wide, 2));
  }
  {
    Draws d(seed, "index_scores");
    const int64_t T = small ? 8 : 4, Hi = 8, Di = 64, N = small ? 256 : 32;
    auto qdq = [](const Tensor<float>& x) { return reference::seam::reference_ops().qdq(formats::CacheFormat::kIndexKeysFp4, x); };
    const Tensor<float> q = qdq(bf16_tensor(d, {T, Hi, Di}, 1.0, "q"));
    const Tensor<float> keys = bf16_tensor(d, {N, Di}, 1.0, "keys");
    const Tensor<float> w = bf16_tensor(d, {T, Hi}, 0.05, "weights");
    std::vector<int64_t> reach(static_cast<size_t>(T), N);
    reach[0] = N / 2;
    const int k = small ? 64 : 8;
    out.push_back(index_scores_case("random", q, keys, w, reach));
    const OpCase random_scores = out.back();
    out.push_back(index_topk_case(random_scores, q, keys, w, reach, k));
    out.push_back(index_select_case(random_scores, q, keys, w, reach, k, Tensor<uint8_t>()));
    out.push_back(index_select_case(random_scores, q, keys, w, reach, k / 2, every_other_block(T, N, reach, k / 2)));
    // Ties: every key equal, so every reachable score of a row is the same value.
    Tensor<float> same = keys;
    for (int64_t n = 1; n < N; ++n) std::copy(same.row(0), same.row(0) + Di, same.row(n));
    out.push_back(index_scores_case("ties", q, same, w, reach));
    const OpCase tied_scores = out.back();
    out.push_back(index_topk_case(tied_scores, q, same, w, reach, k));
    out.push_back(index_select_case(tied_scores, q, same, w, reach, k, Tensor<uint8_t>()));
  }
  {
    Draws d(seed, "sparse_attn");
    const int64_t T = small ? 4 : 2, H = 4, D = small ? 512 : 128, N = small ? 320 : 96;
    const int64_t K = small ? 300 : 90;  // blocks of 64: several online-softmax rescales
    const Tensor<float> q = bf16_tensor(d, {T, H, D}, 1.0, "q");
    const Tensor<float> kv = bf16_tensor(d, {N, D}, 1.0, "kv");
    Tensor<float> sink({H}, "sink");
    for (float& v : sink.data()) v = d.f32(1.0);
    Tensor<int32_t> idxs({T, K}, "idxs");
    for (int32_t& v : idxs.data()) {
      const uint64_t b = d.bits();
      v = b % 7 == 0 ? -1 : static_cast<int32_t>((b >> 8) % static_cast<uint64_t>(N));
    }
    for (int64_t j = 0; j < K; ++j) idxs.at(T - 1, j) = -1;  // a row with no index: output 0
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    out.push_back(sparse_attn_case("random", q, kv, sink, idxs, scale));
    // Peaked: scores up to ~8 apart, the running max rising from block to block.
    out.push_back(sparse_attn_case("peaked", q, kv, sink, idxs, scale * 8.0f));
    Tensor<float> zq({T, H, D}, "q");  // all scores 0: exact ties, p = 1
    out.push_back(sparse_attn_case("ties", zq, kv, sink, idxs, scale));
  }
}

}  // namespace dsv41::scenarios::exact
