// tests/cuda/determinism_test.cc: issue 17 deliverable 4. The `cuda` backend (reference::model::Model over
// gpu::CudaOps, what scenarios/runner/backend.cc's "cuda" runs) gives the same bits
//   - run to run: the same session twice, each on a fresh Model (fresh device mirrors), and across
//     processes (the test prints an FNV-1a hash of session A's bits; bench/run.sh runs the binary
//     twice and compares the lines);
//   - for any batch composition of concurrent sessions: session A alone, then A interleaved with
//     sessions B and C in two different orders, with B and C prefilled in different chunkings and
//     decoded through decode_batch in different compositions ({B, A, C}, {A}, {C, A}, ...).
// Compared bit for bit: every logit of every step of A (all positions: set_full_logits), the
// recorded selections (top-k, candidates, Engram ids, experts) and every cache of A at the end.
// Also B's caches and last logits after its two chunkings (forward_chunk documents that any
// chunking of a sequence gives the same bits). Today decode_batch runs its rows one after the other
// (reference/model/model.cc), so "composition" means interleaving and order; a batched kernel must keep
// this test passing.
#include <cstdio>

#include "reference/model/model.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/oracle_model.h"

namespace dsv41::test {
namespace {

// The bits a session produced: per step the full logits and selections, then its caches.
struct SessionBits {
  std::vector<reference::model::StepRecord> steps;
  std::vector<reference::model::CacheView> caches;
};

void expect_same_step(const reference::model::StepRecord& a, const reference::model::StepRecord& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  ASSERT_FALSE(a.logits.empty()) << what;
  bool nonzero = false;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_FALSE(std::isnan(a.logits[i])) << what << ": NaN logit " << i;
    nonzero = nonzero || a.logits[i] != 0.0f;
    ASSERT_EQ(bits(a.logits[i]), bits(b.logits[i])) << what << ": first differing logit " << i;
  }
  ASSERT_TRUE(nonzero) << what << ": all logits zero";
  EXPECT_TRUE(same_bits(a.all_logits, b.all_logits)) << what << ": all_logits";
  const auto same = [&](const auto& x, const auto& y, const char* name) {
    ASSERT_EQ(x.size(), y.size()) << what << " " << name;
    for (const auto& [l, t] : x) EXPECT_TRUE(same_bits(t, y.at(l))) << what << " " << name << " layer " << l;
  };
  same(a.topk, b.topk, "topk");
  same(a.candidates, b.candidates, "candidates");
  same(a.engram_ids, b.engram_ids, "engram_ids");
  same(a.experts, b.experts, "experts");
}

void expect_same_caches(const std::vector<reference::model::CacheView>& a, const std::vector<reference::model::CacheView>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].kind, b[i].kind) << what;
    EXPECT_EQ(a[i].entries, b[i].entries) << what << " " << a[i].kind << " layer " << a[i].layer;
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << what << " " << a[i].kind << " layer " << a[i].layer;
  }
}

void expect_same(const SessionBits& a, const SessionBits& b, const std::string& what) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    expect_same_step(a.steps[i], b.steps[i], what + ", step " + std::to_string(i));
  }
  expect_same_caches(a.caches, b.caches, what + ", caches");
}

uint64_t fnv1a(const SessionBits& s) {
  uint64_t h = 1469598103934665603ull;
  const auto eat = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& r : s.steps) {
    eat(r.logits.data(), r.logits.size() * sizeof(float));
    eat(r.all_logits.data().data(), r.all_logits.data().size() * sizeof(float));
  }
  for (const auto& c : s.caches) eat(c.bytes.data(), c.bytes.size());
  return h;
}

// Session A's schedule: a 48-token prefill, a chunk of 2, three decode steps (the same in every run).
const std::vector<int64_t> kChunk = {5, 17};
const std::vector<int64_t> kDecode = {3, 250, 9};
std::vector<int64_t> prompt(int which) { return oracle_tokens(which * 90, 48); }  // A 0, B 1, C 2

std::unique_ptr<reference::model::Model> cuda_model() {
  const OracleModel& o = oracle_model();
  auto m = std::make_unique<reference::model::Model>(o.config, o.model->weights(), o.token_map, cuda_ops());
  m->set_full_logits(true);
  return m;
}

SessionBits run_alone(const reference::model::Model& m) {
  SessionBits a;
  reference::model::ModelState s = m.new_state();
  a.steps.push_back(m.prefill(s, prompt(0)));
  a.steps.push_back(m.forward_chunk(s, kChunk));
  for (int64_t t : kDecode) a.steps.push_back(m.decode(s, t));
  a.caches = m.cache_views(s);
  return a;
}

// A, B, C interleaved. order 0 and 1 differ in every choice: B's and C's prefill chunking, the
// order of the chunk steps, and which sessions share each decode_batch call (in which order).
// Returns A's bits; b_out gets B's last step and caches.
SessionBits run_mixed(const reference::model::Model& m, int order, SessionBits* b_out) {
  std::vector<reference::model::ModelState> st;
  for (int i = 0; i < 3; ++i) st.push_back(m.new_state());
  reference::model::ModelState &A = st[0], &B = st[1], &C = st[2];
  SessionBits a, b;
  const auto chunks = [&](reference::model::ModelState& s, const std::vector<int64_t>& p, std::vector<size_t> cuts) {
    size_t at = 0;
    reference::model::StepRecord last;
    for (size_t n : cuts) {
      last = m.forward_chunk(s, std::vector<int64_t>(p.begin() + at, p.begin() + at + n));
      at += n;
    }
    return last;
  };
  // Decode one step for the sessions `who` (indices into st), grouped as `groups` says.
  const auto decode_groups = [&](size_t step, const std::vector<std::vector<int>>& groups) {
    for (const auto& g : groups) {
      std::vector<reference::model::ModelState> batch;
      std::vector<int64_t> tokens;
      for (int i : g) batch.push_back(std::move(st[i])), tokens.push_back(kDecode[step] + i);
      std::vector<reference::model::StepRecord> r = m.decode_batch(batch, tokens);
      for (size_t j = 0; j < g.size(); ++j) {
        st[g[j]] = std::move(batch[j]);
        if (g[j] == 0) a.steps.push_back(std::move(r[j]));
        if (g[j] == 1) b.steps.push_back(std::move(r[j]));
      }
    }
  };
  const std::vector<int64_t> chunk_b = {kChunk[0] + 1, kChunk[1] + 1}, chunk_c = {kChunk[0] + 2, kChunk[1] + 2};
  if (order == 0) {
    chunks(B, prompt(1), {20, 28});
    a.steps.push_back(m.prefill(A, prompt(0)));
    chunks(C, prompt(2), {48});
    m.forward_chunk(C, chunk_c);
    a.steps.push_back(m.forward_chunk(A, kChunk));
    m.forward_chunk(B, chunk_b);
    decode_groups(0, {{1, 0, 2}});
    decode_groups(1, {{0}, {2, 1}});
    decode_groups(2, {{2, 1, 0}});
  } else {
    chunks(C, prompt(2), {16, 16, 16});
    chunks(B, prompt(1), {1, 47});
    a.steps.push_back(m.prefill(A, prompt(0)));
    a.steps.push_back(m.forward_chunk(A, kChunk));
    m.forward_chunk(B, chunk_b);
    m.forward_chunk(C, chunk_c);
    decode_groups(0, {{0, 1}, {2}});
    decode_groups(1, {{1, 2, 0}});
    decode_groups(2, {{2, 0}, {1}});
  }
  a.caches = m.cache_views(A);
  b.caches = m.cache_views(B);
  if (b_out != nullptr) *b_out = std::move(b);
  return a;
}

TEST(CudaDeterminism, SameBitsRunToRun) {
  DSV41_SKIP_WITHOUT_DEVICE();
  SessionBits first, second;
  {
    const auto m = cuda_model();
    first = run_alone(*m);
  }
  {
    const auto m = cuda_model();  // a fresh Model: fresh device mirrors of the weights
    second = run_alone(*m);
  }
  expect_same(first, second, "session A, second run");
  const auto m = cuda_model();
  expect_same(first, run_alone(*m), "session A, third run");
  // Across processes: bench/run.sh compares this line between two runs of the binary.
  std::printf("session A bits fnv1a64=%016llx\n", static_cast<unsigned long long>(fnv1a(first)));
}

TEST(CudaDeterminism, SameBitsForAnyBatchCompositionOfConcurrentSessions) {
  DSV41_SKIP_WITHOUT_DEVICE();
  const auto m = cuda_model();
  const SessionBits alone = run_alone(*m);
  SessionBits b0, b1;
  const SessionBits mixed0 = run_mixed(*m, 0, &b0);
  const SessionBits mixed1 = run_mixed(*m, 1, &b1);
  expect_same(alone, mixed0, "session A interleaved with B and C (order 0)");
  expect_same(alone, mixed1, "session A interleaved with B and C (order 1)");
  // B: its last decode step and caches, after two different chunkings and compositions.
  ASSERT_EQ(b0.steps.size(), kDecode.size());
  ASSERT_EQ(b1.steps.size(), kDecode.size());
  for (size_t i = 0; i < kDecode.size(); ++i) {
    expect_same_step(b0.steps[i], b1.steps[i], "session B decode " + std::to_string(i));
  }
  expect_same_caches(b0.caches, b1.caches, "session B caches");
}

}  // namespace
}  // namespace dsv41::test
