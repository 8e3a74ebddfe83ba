#include "reference/numerics.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "formats/error.h"

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

}  // namespace

float dot_f64_f32(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(acc);
}

float dot_f64_f32_strided(const float* a, const float* b, int64_t stride, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i * stride]);
  return static_cast<float>(acc);
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
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = n * w / workers;
    const int64_t end = n * (w + 1) / workers;
    pool.emplace_back([&, begin, end] {
      try {
        for (int64_t i = begin; i < end; ++i) fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace dsv41::reference
