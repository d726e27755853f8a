#include "HostRegistration.h"

#include "CudaRuntime.h"
#include "Text.h"

#include <c10/util/Exception.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <new>

#include <cstdlib>
#include <map>
#include <mutex>

namespace c10::unified {
namespace {

struct Interval {
  uintptr_t end;
  size_t refs;
  bool owned; // registered by us (else by someone else: never unregistered)
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<uintptr_t, Interval>& registry() {
  static auto* r = new std::map<uintptr_t, Interval>(); // outlives static dtors
  return *r;
}
size_t g_owned_bytes = 0;
size_t g_owned_count = 0;
std::atomic<uint64_t> g_generation{0};

void after_fork_in_child() {
  // The child inherits the parent's table but none of its CUDA state.
  new (&registry_mutex()) std::mutex();
  registry().clear();
  g_owned_bytes = 0;
  g_owned_count = 0;
  g_generation.fetch_add(1);
}

const bool g_atfork_installed = [] {
  pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  return true;
}();

void release_locked(uintptr_t start) {
  auto& reg = registry();
  auto it = reg.find(start);
  if (it == reg.end()) {
    return;
  }
  if (--it->second.refs == 0) {
    if (it->second.owned) {
      cuda::host_unregister(reinterpret_cast<void*>(start));
      g_owned_bytes -= it->second.end - start;
      g_owned_count -= 1;
    }
    reg.erase(it);
  }
}

} // namespace

size_t host_page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t register_chunk_bytes() {
  static const size_t chunk = [] {
    size_t mb = 1024;
    if (const char* env = std::getenv("TORCH_DIRECT_REGISTER_CHUNK_MB")) {
      long v = std::strtol(env, nullptr, 10);
      if (v > 0) {
        mb = static_cast<size_t>(v);
      }
    }
    return mb << 20;
  }();
  return chunk;
}

uint64_t fork_generation() {
  return g_generation.load();
}

HostRegistration::~HostRegistration() {
  if (generation_ != g_generation.load()) {
    return; // made before a fork(): the child never registered these pages
  }
  std::lock_guard<std::mutex> g(registry_mutex());
  for (auto start : intervals_) {
    release_locked(start);
  }
}

std::unique_ptr<HostRegistration> register_host_range(void* ptr, size_t size) {
  if (!cuda::available() || size == 0) {
    return nullptr;
  }
  const uintptr_t page = host_page_size();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr) & ~(page - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(ptr) + size + page - 1) & ~(page - 1);

  auto handle = std::make_unique<HostRegistration>();
  handle->generation_ = g_generation.load();
  std::lock_guard<std::mutex> g(registry_mutex());
  auto& reg = registry();

  auto take = [&](uintptr_t start) {
    auto& iv = reg.at(start);
    iv.refs += 1;
    handle->intervals_.push_back(start);
    handle->bytes_ += iv.end - start;
  };
  auto add_new = [&](uintptr_t lo, uintptr_t hi) {
    const size_t chunk = register_chunk_bytes();
    for (uintptr_t c = lo; c < hi;) {
      const uintptr_t ce = std::min<uintptr_t>(hi, c + chunk);
      std::string err = cuda::host_register(reinterpret_cast<void*>(c), ce - c);
      if (!err.empty() && err != "already registered") {
        const size_t asked = end - begin;
        // Roll back what this call took before reporting.
        for (auto start : handle->intervals_) {
          release_locked(start);
        }
        handle->intervals_.clear();
        TORCH_CHECK(false, "torch_direct: cannot pin ", num(asked), " bytes (",
                    num(asked >> 20), " MiB) of host memory at ",
                    addr(reinterpret_cast<void*>(begin)), ": the CUDA driver said '",
                    err, "' while registering ", num(ce - c), " bytes at ",
                    addr(reinterpret_cast<void*>(c)),
                    ". Check the locked-memory limit (ulimit -l) and free host memory.");
      }
      const bool owned = err.empty();
      reg.emplace(c, Interval{ce, 0, owned});
      if (owned) {
        g_owned_bytes += ce - c;
        g_owned_count += 1;
      }
      take(c);
      c = ce;
    }
  };

  uintptr_t cursor = begin;
  // The first interval that may overlap: the one starting at or before begin.
  auto it = reg.upper_bound(begin);
  if (it != reg.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > begin) {
      it = prev;
    }
  }
  while (cursor < end) {
    if (it == reg.end() || it->first >= end) {
      add_new(cursor, end);
      break;
    }
    if (it->first > cursor) {
      const uintptr_t next_start = it->first;
      add_new(cursor, next_start);
      cursor = next_start;
      it = reg.find(next_start);
      continue;
    }
    // it covers cursor
    const uintptr_t start = it->first;
    const uintptr_t iv_end = it->second.end;
    take(start);
    cursor = iv_end;
    it = reg.upper_bound(start);
  }
  return handle;
}

size_t registered_run(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(registry_mutex());
  auto& reg = registry();
  auto it = reg.upper_bound(p);
  if (it == reg.begin()) {
    return 0;
  }
  --it;
  return p < it->second.end ? static_cast<size_t>(it->second.end - p) : 0;
}

size_t registered_bytes() {
  std::lock_guard<std::mutex> g(registry_mutex());
  return g_owned_bytes;
}

size_t registration_count() {
  std::lock_guard<std::mutex> g(registry_mutex());
  return g_owned_count;
}

} // namespace c10::unified
