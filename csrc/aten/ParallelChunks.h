#pragma once
// Split [0, n) into chunks and run them on several threads.
//
// at::parallel_for cannot be used from this code: with PyTorch's OpenMP
// build its body is an inline `#pragma omp parallel`, which an object built
// without -fopenmp (an extension) runs on one thread. This runs chunk 0 on the
// calling thread and the others on a pool of our own, and rethrows the first
// exception a chunk raised.
//
// Not PyTorch's inter-op pool (at::launch): it is sized to the physical cores
// by default, fewer than the threads asked for on a machine with SMT, and a
// gather that asks for 16 threads then runs in two waves on 8 (on the H200
// machine the hybrid gather's CPU part moved rows at about half the rate of
// index_select on 16 OpenMP threads).
//
// The pool holds the threads of every call running at once: two loader
// threads that each gather with 6 threads get 5 pool threads each, not 5
// between them (a pool sized to the largest call queued one call's chunks
// behind the other's, so that each ran on about 3.5 threads). The pool grows
// to the most threads that running calls have asked for together; an
// outgrown pool is shut down (its threads joined) once the last call that
// runs on it ends, so that a process keeps one pool's threads. The experimental cpu_pool_size=largest sizes it to
// the largest single call instead, as before (for experiments).
//
// With the experimental cpu_pool_nice=k, the pool's threads that run a call's
// chunks first take the niceness of the calling thread plus k (at most 19), so
// that the kernel's scheduler gives a core to the caller's other threads (a
// training loop that launches GPU work) before them; the calling thread keeps
// its own. Unset, their niceness is left as it is. Lowering a thread's
// niceness again (a smaller k later) needs CAP_SYS_NICE.

#include <ATen/Parallel.h>
#include <c10/core/thread_pool.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <unordered_map>

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "Experimental.h"

namespace at::native::unified {

struct ChunkPoolState {
  std::mutex m;
  c10::ThreadPool* pool = nullptr;  // the newest: new calls run on it
  int64_t running = 0;              // pool threads asked for by the calls running now
  // calls running on each pool (the newest and outgrown ones still in use)
  std::unordered_map<c10::ThreadPool*, int64_t> users;
};

inline ChunkPoolState& chunk_pool_state() {
  static ChunkPoolState* s = [] {
    auto* st = new ChunkPoolState();
    // A forked child has none of the parent's pool threads (and the lock may
    // have been held by one of them): it starts a pool of its own.
    pthread_atfork(nullptr, nullptr, [] {
      auto* child = &chunk_pool_state();
      new (&child->m) std::mutex();
      child->pool = nullptr;  // the parent's pool objects are leaked in the child
      child->running = 0;
      new (&child->users) std::unordered_map<c10::ThreadPool*, int64_t>();
    });
    return st;
  }();
  return *s;
}

// Set on the pool's threads: a chunk that calls parallel_chunks again runs
// its work inline instead of waiting on the pool it occupies.
inline bool& in_chunk_worker() {
  static thread_local bool flag = false;
  return flag;
}

// Whether the pool holds one call's threads only (experimental cpu_pool_size=largest).
inline bool pool_sized_to_largest_call() {
  const auto v = torch_direct::experimental::get("cpu_pool_size");
  TORCH_CHECK(!v || *v == "concurrent" || *v == "largest", torch_direct::experimental::kVariable,
              ": cpu_pool_size must be concurrent or largest, not '", *v, "'");
  return v && *v == "largest";
}

// A call's claim on `workers` pool threads, held while its chunks run: the pool
// it gives has at least as many threads as the calls holding claims asked for
// together. A pool that a larger one replaced is deleted (its idle threads
// joined) when its last claim ends, outside the lock; the newest pool is never
// deleted (no teardown at exit). Claims are made on calling threads only (a
// pool thread's nested call runs inline), so no pool joins its own thread.
class PoolClaim {
 public:
  PoolClaim(int64_t workers, bool largest_only) : workers_(workers) {
    ChunkPoolState& st = chunk_pool_state();
    c10::ThreadPool* outgrown = nullptr;
    {
      std::lock_guard<std::mutex> g(st.m);
      st.running += workers_;
      const int64_t want = largest_only ? workers_ : st.running;
      if (st.pool == nullptr || static_cast<int64_t>(st.pool->size()) < want) {
        if (st.pool != nullptr && st.users.count(st.pool) == 0) {
          outgrown = st.pool;  // idle: nothing runs on it
        }
        st.pool = new c10::ThreadPool(static_cast<int>(want), -1, [] { in_chunk_worker() = true; });
      }
      pool_ = st.pool;
      ++st.users[pool_];
    }
    delete outgrown;
  }
  ~PoolClaim() {
    ChunkPoolState& st = chunk_pool_state();
    c10::ThreadPool* outgrown = nullptr;
    {
      std::lock_guard<std::mutex> g(st.m);
      st.running -= workers_;
      auto it = st.users.find(pool_);
      if (--it->second == 0) {
        st.users.erase(it);
        if (pool_ != st.pool) {
          outgrown = pool_;
        }
      }
    }
    delete outgrown;
  }
  PoolClaim(const PoolClaim&) = delete;
  PoolClaim& operator=(const PoolClaim&) = delete;
  c10::ThreadPool& pool() { return *pool_; }

 private:
  int64_t workers_;
  c10::ThreadPool* pool_ = nullptr;
};

// The niceness a call's pool threads are to take (cpu_pool_nice: the calling
// thread's plus k, at most 19), or -100 to leave theirs as it is. Read on the
// calling thread.
inline int pool_nice_wanted() {
  // one read of the setting (-1: not given), so that a change between two reads cannot mix them
  const int64_t more = torch_direct::experimental::get_int("cpu_pool_nice", -1, 0);
  if (more < 0) {
    return -100;
  }
  TORCH_CHECK(more <= 19, "TORCH_DIRECT_EXPERIMENTAL: cpu_pool_nice must be an integer from 0 to 19, not ", more);
  errno = 0;
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  TORCH_CHECK(errno == 0, "cpu_pool_nice: could not read the calling thread's niceness: ", std::strerror(errno));
  return static_cast<int>(std::min<int64_t>(19, mine + more));
}

// On a pool thread: take niceness `want` (unless -100), a system call only
// when it changes.
inline void take_pool_nice(int want) {
  static thread_local int current = -100;
  if (want == -100 || want == current) {
    return;
  }
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  if (setpriority(PRIO_PROCESS, tid, want) != 0) {
    const int err = errno;
    TORCH_CHECK(false, "cpu_pool_nice: could not set a pool thread's niceness to ", want, ": ", std::strerror(err),
                err == EACCES || err == EPERM ? " (making a thread less nice again needs CAP_SYS_NICE)" : "");
  }
  current = want;
}

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
  if (chunks == 1 || in_chunk_worker()) {
    fn(int64_t{0}, n);
    return;
  }
  const int nice = pool_nice_wanted();
  PoolClaim claim(chunks - 1, pool_sized_to_largest_call());  // released after the wait below
  std::mutex m;
  std::condition_variable cv;
  int64_t left = chunks - 1;
  std::exception_ptr error;
  c10::ThreadPool& pool = claim.pool();
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = c * per;
    const int64_t e = std::min(n, b + per);
    pool.run([&, b, e] {
      std::exception_ptr err;
      try {
        take_pool_nice(nice);
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
