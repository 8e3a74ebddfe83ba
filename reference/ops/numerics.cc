#include "reference/ops/numerics.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace dsv41::reference {
namespace {

std::atomic<int> g_threads{0};

int default_threads() {
  if (const char* env = std::getenv("DSV41_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    DSV41_CHECK(end != env && *end == '\0' && v >= 1 && v <= 1024,
                "DSV41_THREADS must be an integer in [1, 1024], got '", env, "'");
    return static_cast<int>(v);
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

// The persistent workers of parallel_for. One job at a time (callers queue on job_mutex_); a job
// is split into `parts` contiguous chunks: the caller runs chunk 0, workers 1.. take the others.
// The split is the one the old per-call threads used; results never depend on it (numerics.h).
class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  void run(int64_t n, int parts, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> job(job_mutex_);
    ensure_workers(parts - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    run_part(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  static bool inside_worker() { return in_pool_; }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

 private:
  Pool() = default;

  void ensure_workers(int needed) {
    while (static_cast<int>(workers_.size()) < needed) {
      const int id = static_cast<int>(workers_.size()) + 1;  // part 0 is the caller's
      uint64_t seen;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        seen = generation_;
      }
      workers_.emplace_back([this, id, seen] { work(id, seen); });
    }
  }

  void run_part(int part) {
    const int64_t begin = n_ * part / parts_, end = n_ * (part + 1) / parts_;
    const bool was_inside = in_pool_;
    in_pool_ = true;  // a nested parallel_for runs serially
    try {
      for (int64_t i = begin; i < end; ++i) (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    in_pool_ = was_inside;
  }

  void work(int id, uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (id >= parts_) continue;  // this job needs fewer workers
      }
      run_part(id);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  std::mutex job_mutex_;  // one job at a time
  std::mutex mutex_;      // the job's fields
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  static thread_local bool in_pool_;
};

thread_local bool Pool::in_pool_ = false;

}  // namespace

DSV41_FMA_CLONES
float fma_dot_f32(const float* a, const float* b, int64_t stride, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i * stride], acc);
  return acc;
}

DSV41_FMA_CLONES
void fma_dot_f32_x4(const float* a, const float* const* b, int64_t stride, int64_t n, float* out) {
  float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = a[i];
    acc0 = std::fma(x, b[0][i * stride], acc0);
    acc1 = std::fma(x, b[1][i * stride], acc1);
    acc2 = std::fma(x, b[2][i * stride], acc2);
    acc3 = std::fma(x, b[3][i * stride], acc3);
  }
  out[0] = acc0;
  out[1] = acc1;
  out[2] = acc2;
  out[3] = acc3;
}

int reference_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : default_threads();
}

void set_reference_threads(int n) {
  DSV41_CHECK(n >= 0 && n <= 1024, "thread count must be in [0, 1024], got ", n);
  g_threads.store(n);
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::min<int64_t>(reference_threads(), n);
  if (workers <= 1 || Pool::inside_worker()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::get().run(n, static_cast<int>(workers), fn);
}

}  // namespace dsv41::reference
