#pragma once
// Split [0, n) into chunks and run them on several threads.
//
// at::parallel_for cannot be used from this code: with PyTorch's OpenMP
// build its body is an inline `#pragma omp parallel`, which an object built
// without -fopenmp (an extension) runs on one thread. This runs chunk 0 on the
// calling thread and the others on PyTorch's inter-op pool (at::launch), and
// rethrows the first exception a chunk raised.

#include <ATen/Parallel.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>

namespace at::native::unified {

// At most max_threads chunks (0: at::get_num_threads()), each of at least
// `grain` items.
template <typename F>
void parallel_chunks(int64_t n, int64_t grain, int64_t max_threads, const F& fn) {
  if (n <= 0) {
    return;
  }
  const int64_t threads = max_threads > 0 ? max_threads : at::get_num_threads();
  int64_t chunks = std::max<int64_t>(1, std::min(threads, (n + grain - 1) / std::max<int64_t>(grain, 1)));
  const int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  int64_t left = chunks - 1;
  std::exception_ptr error;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = c * per;
    const int64_t e = std::min(n, b + per);
    at::launch([&, b, e] {
      std::exception_ptr err;
      try {
        fn(b, e);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> g(m);
      if (err && !error) {
        error = err;
      }
      if (--left == 0) {
        cv.notify_one();
      }
    });
  }
  std::exception_ptr mine;
  try {
    fn(int64_t{0}, std::min(n, per));
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return left == 0; });
  if (mine) {
    std::rethrow_exception(mine);
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

} // namespace at::native::unified
