#include "UnifiedAllocator.h"

#include "CudaRuntime.h"
#include "DriverHostMemory.h"
#include "HostRegistration.h"
#include "Text.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <new>
#include <mutex>
#include <unordered_map>
#include <vector>

#ifndef MFD_CLOEXEC
#include <sys/syscall.h>
#define MFD_CLOEXEC 0x0001U
#endif

namespace c10::unified {

struct Block {
  enum Kind { kCached, kExact, kForeign, kDriver };
  Kind kind;
  void* ptr = nullptr;
  size_t size = 0;      // bytes mapped (capacity)
  size_t requested = 0; // bytes the current owner asked for
  int fd = -1;          // memfd behind an exact block
  bool exported = false; // its memfd went to another process: never reused
  std::mutex map_mutex;
  std::atomic<bool> mapped{false};
  uint64_t mapped_generation = 0; // fork_generation() when mapped
  uint64_t generation = 0;        // fork_generation() when created
  uint64_t epoch = 0;             // forks seen (g_forks) when created or last cached
  std::unique_ptr<HostRegistration> registration;
  std::vector<c10::Stream> streams; // streams that may still touch it
  uint64_t streams_generation = 0;  // fork_generation() when `streams` were recorded
  c10::Storage keep;                // foreign pages' owner
  uint64_t driver_handle = 0;       // a driver block's allocation (DriverHostMemory.h)
};

namespace {

struct Pending {
  Block* block;
  std::vector<void*> events;
};

struct State {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<Block*>> free_lists;
  std::vector<Block*> large_free; // freed exact blocks, oldest first
  int64_t large_cached_bytes = 0;
  std::list<Pending> pending;
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t reserved = 0;
  int64_t foreign = 0;
  int64_t driver = 0;
  int64_t active_blocks = 0;
  int64_t cached_blocks = 0;
  int64_t num_alloc = 0;
  int64_t num_free = 0;
  int64_t num_shared_migrations = 0;
};

State& state() {
  static auto* s = new State(); // never destroyed: blocks may die at exit
  return *s;
}

// fork()s this process took part in, as parent or child. A block live at a
// fork is shared with the other process (MAP_SHARED), so it is never reused
// once freed: it would change the other process's tensor.
std::atomic<uint64_t> g_forks{0};

void after_fork_in_parent() {
  g_forks.fetch_add(1);
  // The free blocks were unmapped by the child: still ours to reuse.
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mutex);
  for (auto& kv : s.free_lists) {
    for (Block* b : kv.second) {
      b->epoch = g_forks.load();
    }
  }
  for (Block* b : s.large_free) {
    b->epoch = g_forks.load();
  }
}

void after_fork_in_child() {
  // Free blocks are shared with the parent, which may reuse them: forget
  // them (unmapping only our view). Pending events belong to the parent's
  // CUDA context.
  g_forks.fetch_add(1);
  auto& s = state();
  new (&s.mutex) std::mutex();
  for (auto& kv : s.free_lists) {
    for (Block* b : kv.second) {
      munmap(b->ptr, b->size);
      s.reserved -= static_cast<int64_t>(b->size);
      delete b;
    }
  }
  s.free_lists.clear();
  for (Block* b : s.large_free) {
    munmap(b->ptr, b->size);
    close(b->fd);
    s.reserved -= static_cast<int64_t>(b->size);
    delete b;
  }
  s.large_free.clear();
  s.large_cached_bytes = 0;
  s.cached_blocks = 0;
  for (auto& p : s.pending) {
    p.block->streams.clear();
    p.events.clear();
  }
}

const bool g_atfork = [] {
  pthread_atfork(nullptr, &after_fork_in_parent, &after_fork_in_child);
  return true;
}();

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

size_t size_class(size_t n) {
  size_t c = host_page_size();
  while (c < n) {
    c <<= 1;
  }
  return c;
}

int make_memfd() {
#ifdef SYS_memfd_create
  return static_cast<int>(syscall(SYS_memfd_create, "torch_direct", MFD_CLOEXEC));
#else
  return memfd_create("torch_direct", MFD_CLOEXEC);
#endif
}

std::string describe_errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + num(err) + ")";
}

Block* new_cached_block(size_t cls) {
  // MAP_SHARED: a fork()ed child sees the same pages, as it does for large blocks.
  void* p = mmap(nullptr, cls, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "torch_direct: cannot allocate ", num(cls),
              " bytes of unified memory: mmap failed: ", describe_errno(errno));
  auto* b = new Block();
  b->kind = Block::kCached;
  b->ptr = p;
  b->size = cls;
  b->generation = fork_generation();
  b->epoch = g_forks.load();
  return b;
}

// RAM + swap as the kernel reports them (/proc/meminfo), or 0 if unknown.
size_t host_memory_limit() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) {
    return 0;
  }
  char key[64];
  unsigned long long kb = 0;
  size_t total = 0;
  while (std::fscanf(f, "%63s %llu kB\n", key, &kb) == 2) {
    if (std::strcmp(key, "MemTotal:") == 0 || std::strcmp(key, "SwapTotal:") == 0) {
      total += static_cast<size_t>(kb) * 1024;
    }
  }
  std::fclose(f);
  return total;
}

Block* new_exact_block(size_t nbytes) {
  const size_t size = round_up(nbytes, host_page_size());
  // Shared memory is not bounded by overcommit: a request beyond the machine
  // would be killed by the OOM killer while the pages are reserved. Refuse it
  // here instead (TORCH_DIRECT_ALLOW_OVERCOMMIT=1 skips the check, e.g. on a
  // VM whose reported memory grows on demand).
  const char* allow = std::getenv("TORCH_DIRECT_ALLOW_OVERCOMMIT");
  if (allow == nullptr || std::strcmp(allow, "1") != 0) {
    const size_t limit = host_memory_limit();
    TORCH_CHECK(limit == 0 || size <= limit, "torch_direct: cannot allocate ", num(nbytes),
                " bytes (", num(nbytes >> 20), " MiB) of unified memory: the host has ",
                num(limit >> 20), " MiB of RAM and swap in all "
                "(set TORCH_DIRECT_ALLOW_OVERCOMMIT=1 to try anyway)");
  }
  int fd = make_memfd();
  TORCH_CHECK(fd >= 0, "torch_direct: cannot allocate ", num(nbytes),
              " bytes of unified memory: memfd_create failed: ",
              describe_errno(errno));
  // Reserve the pages now, so that a table larger than the machine can hold
  // fails here with a Python error instead of a SIGBUS on first touch.
  int rc = ftruncate(fd, static_cast<off_t>(size));
  if (rc == 0) {
    rc = posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (rc != 0) {
      errno = rc;
      rc = -1;
    }
  }
  if (rc != 0) {
    int err = errno;
    close(fd);
    TORCH_CHECK(false, "torch_direct: cannot allocate ", num(nbytes), " bytes (",
                num(nbytes >> 20), " MiB) of unified memory: the host could not "
                "reserve the pages: ", describe_errno(err));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    TORCH_CHECK(false, "torch_direct: cannot allocate ", num(nbytes), " bytes (",
                num(nbytes >> 20), " MiB) of unified memory: mmap failed: ",
                describe_errno(err));
  }
  auto* b = new Block();
  b->kind = Block::kExact;
  b->ptr = p;
  b->size = size;
  b->fd = fd;
  b->generation = fork_generation();
  b->epoch = g_forks.load();
  return b;
}

// Bytes of freed large blocks kept for reuse: TORCH_DIRECT_UNIFIED_CACHE_MB
// (0 turns the cache off), by default 1/16 of the host's RAM and at most 4 GiB.
size_t large_cache_limit() {
  static const size_t limit = [] {
    const char* env = std::getenv("TORCH_DIRECT_UNIFIED_CACHE_MB");
    if (env != nullptr && *env != '\0') {
      char* end = nullptr;
      const unsigned long long mb = std::strtoull(env, &end, 10);
      if (end != env && *end == '\0') {
        return static_cast<size_t>(mb) << 20;
      }
    }
    return std::min(host_memory_limit() / 16, size_t(4) << 30);
  }();
  return limit;
}

// Under the lock: the smallest cached large block that fits `nbytes` with at
// most 1/8 to spare, taken out of the cache; or nullptr.
Block* take_large_locked(State& s, size_t nbytes) {
  const size_t want = round_up(nbytes, host_page_size());
  const size_t most = want + want / 8;
  auto best = s.large_free.end();
  for (auto it = s.large_free.begin(); it != s.large_free.end(); ++it) {
    const size_t size = (*it)->size;
    if (size >= want && size <= most && (best == s.large_free.end() || size < (*best)->size)) {
      best = it;
    }
  }
  if (best == s.large_free.end()) {
    return nullptr;
  }
  Block* b = *best;
  s.large_free.erase(best);
  s.large_cached_bytes -= static_cast<int64_t>(b->size);
  s.cached_blocks -= 1;
  return b;
}

void destroy_block(Block* b) {
  b->registration.reset(); // unregister before the pages go away
  if (b->kind == Block::kDriver) {
    // The driver's mapping; a fork()ed child never had it (not inherited).
    if (b->generation == fork_generation()) {
      cuda::driver_host_free(cuda::DriverHostMapping{b->ptr, b->size, b->driver_handle, 0});
    }
  } else if (b->kind != Block::kForeign) {
    munmap(b->ptr, b->size);
  }
  if (b->fd >= 0) {
    close(b->fd);
  }
  delete b; // drops `keep` (a foreign owner) outside the allocator's lock
}

// Under the lock: a free block with no pending GPU work either returns to the
// cache or is handed back for destruction.
void release_locked(State& s, Block* b, std::vector<Block*>& to_destroy) {
  b->streams.clear();
  // A block live at a fork() (in the parent or the child) is shared with the
  // other process, which may still use it: never hand it out again here, just
  // drop our mapping.
  const bool ours = b->generation == fork_generation() && b->epoch == g_forks.load();
  if (b->kind == Block::kCached && ours) {
    s.free_lists[b->size].push_back(b);
    s.cached_blocks += 1;
  } else if (b->kind == Block::kExact && ours && !b->exported && b->size <= large_cache_limit()) {
    // Kept (still registered) for the next request of about its size: a
    // fresh large block costs a page reservation and a registration.
    s.large_free.push_back(b);
    s.large_cached_bytes += static_cast<int64_t>(b->size);
    s.cached_blocks += 1;
    while (static_cast<size_t>(s.large_cached_bytes) > large_cache_limit()) {
      Block* old = s.large_free.front();
      s.large_free.erase(s.large_free.begin());
      s.large_cached_bytes -= static_cast<int64_t>(old->size);
      s.cached_blocks -= 1;
      s.reserved -= static_cast<int64_t>(old->size);
      to_destroy.push_back(old);
    }
  } else {
    s.reserved -= b->kind != Block::kForeign ? static_cast<int64_t>(b->size) : 0;
    to_destroy.push_back(b);
  }
}

void map_block(Block* b) {
  const uint64_t gen = fork_generation();
  if (b->mapped.load(std::memory_order_acquire) && b->mapped_generation == gen) {
    return;
  }
  std::lock_guard<std::mutex> g(b->map_mutex);
  if (b->mapped.load(std::memory_order_relaxed) && b->mapped_generation == gen) {
    return;
  }
  TORCH_CHECK(b->kind != Block::kDriver, "torch_direct: driver-mapped unified memory is not "
              "inherited by a fork()ed child; it is usable only in the process that allocated it");
  b->registration = register_host_range(b->ptr, b->size);
  void* dev = cuda::device_pointer(b->ptr);
  TORCH_CHECK(dev == b->ptr,
              "torch_direct: this GPU maps registered host memory at a different "
              "address than the host's; unified tensors need a GPU and driver "
              "that can use host pointers directly (64-bit UVA)");
  b->mapped_generation = gen;
  b->mapped.store(true, std::memory_order_release);
}

void maybe_eager_map(Block* b) {
  // Registering costs the same now or at first GPU use; doing it now keeps
  // the first gather's timing clean, but only once this process uses CUDA
  // (registering would otherwise create a context and break fork()).
  if (cuda::context_initialized()) {
    map_block(b);
  }
}

Block* block_of(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &UnifiedAllocator::raw_delete) {
    return nullptr;
  }
  return static_cast<Block*>(ptr.get_context());
}

// Under the lock: the freed blocks whose GPU work has ended leave the pending
// list, to the cache or into `to_destroy`, which the caller destroys once the
// lock is dropped (destroying a foreign block drops its owner's storage).
// `oldest_only` stops at the first block still in use, so that a free walks
// only what it can release (the list is in free order, and most frees wait on
// one stream, whose events end in that order); an allocation walks it all.
void take_finished_locked(
    State& s,
    std::vector<Block*>& to_destroy,
    bool oldest_only = false) {
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    bool done = true;
    for (void* ev : it->events) {
      if (!cuda::event_done(ev)) {
        done = false;
        break;
      }
    }
    if (done) {
      for (void* ev : it->events) {
        cuda::event_destroy(ev);
      }
      release_locked(s, it->block, to_destroy);
      it = s.pending.erase(it);
    } else if (oldest_only) {
      return;
    } else {
      ++it;
    }
  }
}

void destroy_all(const std::vector<Block*>& blocks) {
  for (Block* b : blocks) {
    destroy_block(b);
  }
}

} // namespace

c10::DataPtr UnifiedAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, unified_device());
  }
  auto& s = state();
  Block* b = nullptr;
  std::vector<Block*> finished;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    take_finished_locked(s, finished);
    if (nbytes <= kSmallBlockLimit) {
      auto& list = s.free_lists[size_class(nbytes)];
      if (!list.empty()) {
        b = list.back();
        list.pop_back();
        s.cached_blocks -= 1;
      }
    } else {
      b = take_large_locked(s, nbytes);
    }
  }
  destroy_all(finished);
  bool fresh = false;
  if (b == nullptr) {
    b = nbytes <= kSmallBlockLimit ? new_cached_block(size_class(nbytes))
                                   : new_exact_block(nbytes);
    fresh = true;
  }
  b->requested = nbytes;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    if (fresh) {
      s.reserved += static_cast<int64_t>(b->size);
    }
    s.allocated += static_cast<int64_t>(nbytes);
    s.peak = std::max(s.peak, s.allocated);
    s.active_blocks += 1;
    s.num_alloc += 1;
  }
  if (fresh) {
    maybe_eager_map(b);
  }
  return c10::DataPtr(b->ptr, b, &UnifiedAllocator::raw_delete, unified_device());
}

void UnifiedAllocator::raw_delete(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  auto& s = state();
  std::vector<Block*> to_destroy;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    // Earlier frees whose GPU work has ended go now, not at the next
    // allocation: a foreign block keeps its pages registered until released.
    // A deleter must not throw: where an event cannot be queried (a sticky
    // CUDA error) the blocks stay pending, and the next allocation reports it.
    try {
      take_finished_locked(s, to_destroy, /*oldest_only=*/true);
    } catch (const std::exception&) {
    }
    s.num_free += 1;
    s.active_blocks -= 1;
    if (b->kind == Block::kForeign) {
      s.foreign -= static_cast<int64_t>(b->size);
    } else {
      s.allocated -= static_cast<int64_t>(b->requested);
    }
    if (b->kind == Block::kDriver) {
      s.driver -= static_cast<int64_t>(b->size);
    }
    std::vector<void*> events;
    if (b->streams_generation != fork_generation()) {
      b->streams.clear(); // the parent's streams: a forked child cannot wait on them
    }
    for (const auto& st : b->streams) {
      // Only a stream with work still queued needs an event: an idle one has
      // finished every read of this block. A deleter must not throw. If the
      // stream cannot be queried or the event recorded, the CUDA context is
      // unusable (a sticky error): no kernel can read the block any more, so
      // it is released without waiting.
      try {
        if (!cuda::stream_idle(st)) {
          events.push_back(cuda::record_event(st));
        }
      } catch (const std::exception&) {
      }
    }
    if (events.empty()) {
      release_locked(s, b, to_destroy);
    } else {
      s.pending.push_back(Pending{b, std::move(events)});
    }
  }
  for (Block* d : to_destroy) {
    destroy_block(d);
  }
}

void UnifiedAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) {
    std::memcpy(dest, src, count);
  }
}

c10::DataPtr UnifiedAllocator::alias_foreign(void* ptr, size_t nbytes, c10::Storage keep) {
  auto* b = new Block();
  b->kind = Block::kForeign;
  b->ptr = ptr;
  b->size = nbytes;
  b->requested = nbytes;
  b->keep = std::move(keep);
  try {
    // Pinning in place is an explicit request: do it now, in chunks.
    b->registration = register_host_range(ptr, nbytes);
    b->mapped_generation = fork_generation();
    b->mapped = true;
  } catch (...) {
    delete b;
    throw;
  }
  auto& s = state();
  {
    std::lock_guard<std::mutex> g(s.mutex);
    s.foreign += static_cast<int64_t>(nbytes);
    s.active_blocks += 1;
    s.num_alloc += 1;
  }
  return c10::DataPtr(ptr, b, &UnifiedAllocator::raw_delete, unified_device());
}

c10::DataPtr UnifiedAllocator::allocate_driver_mapped(size_t nbytes) {
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, unified_device());
  }
  cuda::DriverHostMapping m;
  const std::string why = cuda::driver_host_alloc(nbytes, &m);
  TORCH_CHECK(why.empty(), "torch_direct: cannot allocate ", num(nbytes), " bytes (", num(nbytes >> 20),
              " MiB) of driver-mapped unified memory: ", why);
  auto* b = new Block();
  b->kind = Block::kDriver;
  b->ptr = m.ptr;
  b->size = m.size;
  b->requested = nbytes;
  b->driver_handle = m.handle;
  b->generation = fork_generation();
  b->epoch = g_forks.load();
  b->mapped_generation = fork_generation(); // mapped for every GPU by the driver itself
  b->mapped = true;
  auto& s = state();
  {
    std::lock_guard<std::mutex> g(s.mutex);
    s.reserved += static_cast<int64_t>(b->size);
    s.driver += static_cast<int64_t>(b->size);
    s.allocated += static_cast<int64_t>(nbytes);
    s.peak = std::max(s.peak, s.allocated);
    s.active_blocks += 1;
    s.num_alloc += 1;
  }
  return c10::DataPtr(b->ptr, b, &UnifiedAllocator::raw_delete, unified_device());
}

c10::DataPtr UnifiedAllocator::import_shared(int fd, size_t nbytes) {
  struct stat st {};
  TORCH_CHECK(fstat(fd, &st) == 0, "torch_direct: cannot import shared unified memory: fstat: ",
              describe_errno(errno));
  const size_t size = static_cast<size_t>(st.st_size);
  TORCH_CHECK(nbytes <= size, "torch_direct: shared unified block holds ", num(size),
              " bytes but ", num(nbytes), " were expected");
  if (size == 0) {
    return c10::DataPtr(nullptr, unified_device());
  }
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  TORCH_CHECK(own >= 0, "torch_direct: cannot import shared unified memory: dup: ",
              describe_errno(errno));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(own);
    TORCH_CHECK(false, "torch_direct: cannot map ", num(size),
                " bytes of shared unified memory: ", describe_errno(err));
  }
  auto* b = new Block();
  b->kind = Block::kExact;
  b->ptr = p;
  b->size = size;
  b->requested = nbytes;
  b->fd = own;
  b->exported = true; // the sender's pages: never handed out again here
  auto& s = state();
  {
    std::lock_guard<std::mutex> g(s.mutex);
    s.reserved += static_cast<int64_t>(size);
    s.allocated += static_cast<int64_t>(nbytes);
    s.peak = std::max(s.peak, s.allocated);
    s.active_blocks += 1;
    s.num_alloc += 1;
  }
  maybe_eager_map(b);
  return c10::DataPtr(p, b, &UnifiedAllocator::raw_delete, unified_device());
}

std::pair<int, size_t> UnifiedAllocator::share(c10::StorageImpl* storage) {
  Block* b = block_of(storage->data_ptr());
  if (storage->nbytes() == 0 || b == nullptr) {
    TORCH_CHECK(storage->nbytes() == 0, "torch_direct: this storage was not made by the unified allocator");
    return {-1, 0};
  }
  TORCH_CHECK(b->kind != Block::kDriver,
              "torch_direct: driver-mapped unified memory (torch_direct.driver_mapped) cannot be "
              "shared with another process; share a copy made with .to('unified') instead");
  TORCH_CHECK(b->kind != Block::kForeign,
              "torch_direct: a tensor pinned in place (pin_inplace) aliases a CPU "
              "tensor's own memory and cannot be moved into shared memory without "
              "breaking that alias. Call share_memory_() on the CPU tensor before "
              "pin_inplace(), or send the CPU tensor and pin it in the receiving process.");
  if (b->kind == Block::kExact) {
    std::lock_guard<std::mutex> g(state().mutex);
    b->exported = true; // the receiver maps these pages: never reuse them
    return {b->fd, b->size};
  }
  // A small cached block: move its bytes into a shared block, keep identity.
  const size_t nbytes = storage->nbytes();
  synchronize_users(storage->data_ptr());
  Block* nb = new_exact_block(nbytes);
  nb->requested = nbytes;
  std::memcpy(nb->ptr, b->ptr, nbytes);
  {
    auto& s = state();
    std::lock_guard<std::mutex> g(s.mutex);
    s.reserved += static_cast<int64_t>(nb->size);
    s.allocated += static_cast<int64_t>(nbytes);
    s.active_blocks += 1;
    s.num_alloc += 1;
    s.num_shared_migrations += 1;
    nb->exported = true;
  }
  storage->set_data_ptr_noswap(
      c10::DataPtr(nb->ptr, nb, &UnifiedAllocator::raw_delete, unified_device()));
  return {nb->fd, nb->size};
}

void* UnifiedAllocator::ensure_mapped(const c10::DataPtr& ptr) {
  Block* b = static_cast<Block*>(ptr.get_context());
  if (ptr.get() == nullptr || !cuda::available()) {
    return ptr.get();
  }
  TORCH_CHECK(b != nullptr && block_of(ptr) == b, "torch_direct: not a unified block");
  check_alive(ptr);
  map_block(b);
  return ptr.get();
}

void UnifiedAllocator::check_alive(const c10::DataPtr& ptr) const {
  Block* b = block_of(ptr);
  if (b != nullptr && b->kind == Block::kDriver) {
    TORCH_CHECK(b->generation == fork_generation(),
                "torch_direct: driver-mapped unified memory is not inherited by a fork()ed child "
                "(the driver maps it for its own process only); copy the tensor with "
                ".to('unified') before forking, or read it in the parent");
    return;
  }
  if (b == nullptr || b->kind != Block::kForeign) {
    return;
  }
  TORCH_CHECK(b->keep.data_ptr().get() == b->ptr && b->keep.nbytes() >= b->size,
              "torch_direct: the CPU tensor behind this pin_inplace() alias was resized or "
              "moved (resize_, share_memory_, set_ ...), so the pages the alias points to "
              "were freed. Pin the tensor again after changing its storage.");
}

bool UnifiedAllocator::is_mapped(const c10::DataPtr& ptr) const {
  Block* b = block_of(ptr);
  return b != nullptr && b->mapped.load() && b->mapped_generation == fork_generation();
}

void UnifiedAllocator::record_stream(const c10::DataPtr& ptr, c10::Stream stream) {
  Block* b = block_of(ptr);
  if (b == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> g(state().mutex);
  if (b->streams_generation != fork_generation()) {
    b->streams.clear(); // recorded by the parent before a fork()
    b->streams_generation = fork_generation();
  }
  for (const auto& s : b->streams) {
    if (s == stream) {
      return;
    }
  }
  b->streams.push_back(stream);
}

void UnifiedAllocator::synchronize_users(const c10::DataPtr& ptr) {
  Block* b = block_of(ptr);
  if (b == nullptr) {
    return;
  }
  std::vector<c10::Stream> streams;
  {
    std::lock_guard<std::mutex> g(state().mutex);
    // Streams of the parent of a fork(): its GPU work is not this process's
    // to wait for (a forked child cannot use the parent's CUDA context).
    if (b->streams_generation == fork_generation()) {
      streams = b->streams;
    }
  }
  for (const auto& s : streams) {
    cuda::stream_synchronize(s);
  }
}

c10::Storage UnifiedAllocator::foreign_owner(const c10::DataPtr& ptr) const {
  Block* b = block_of(ptr);
  TORCH_CHECK(b != nullptr && b->kind == Block::kForeign,
              "torch_direct: this unified tensor was not pinned in place");
  return b->keep;
}

bool UnifiedAllocator::owns(const c10::DataPtr& ptr) const {
  return block_of(ptr) != nullptr;
}

std::string UnifiedAllocator::kind_of(const c10::DataPtr& ptr) const {
  Block* b = block_of(ptr);
  if (b == nullptr) {
    return "";
  }
  switch (b->kind) {
    case Block::kCached: return "cached";
    case Block::kExact: return "exact";
    case Block::kForeign: return "foreign";
    case Block::kDriver: return "driver";
  }
  return "";
}

std::map<std::string, int64_t> UnifiedAllocator::stats() {
  auto& s = state();
  std::vector<Block*> finished;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    take_finished_locked(s, finished);
  }
  destroy_all(finished); // so that the figures below no longer count them
  std::lock_guard<std::mutex> g(s.mutex);
  return {
      {"allocated_bytes", s.allocated},
      {"allocated_bytes.peak", s.peak},
      {"reserved_bytes", s.reserved},
      {"pinned_in_place_bytes", s.foreign},
      {"driver_mapped_bytes", s.driver},
      {"pinned_bytes", static_cast<int64_t>(registered_bytes())},
      {"pinned_registrations", static_cast<int64_t>(registration_count())},
      {"active_blocks", s.active_blocks},
      {"cached_blocks", s.cached_blocks},
      {"cached_large_bytes", s.large_cached_bytes},
      {"pending_free_blocks", static_cast<int64_t>(s.pending.size())},
      {"num_alloc", s.num_alloc},
      {"num_free", s.num_free},
      {"num_shared_migrations", s.num_shared_migrations},
  };
}

void UnifiedAllocator::empty_cache() {
  auto& s = state();
  std::vector<Block*> to_destroy;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    take_finished_locked(s, to_destroy);
    for (auto& kv : s.free_lists) {
      for (Block* b : kv.second) {
        s.reserved -= static_cast<int64_t>(b->size);
        to_destroy.push_back(b);
      }
      kv.second.clear();
    }
    for (Block* b : s.large_free) {
      s.reserved -= static_cast<int64_t>(b->size);
      to_destroy.push_back(b);
    }
    s.large_free.clear();
    s.large_cached_bytes = 0;
    s.cached_blocks = 0;
  }
  for (Block* b : to_destroy) {
    destroy_block(b);
  }
}

void UnifiedAllocator::reset_peak() {
  auto& s = state();
  std::lock_guard<std::mutex> g(s.mutex);
  s.peak = s.allocated;
}

UnifiedAllocator* get_allocator() {
  static UnifiedAllocator allocator;
  return &allocator;
}

// c10::GetAllocator(unified) serves storages made without a tensor
// (torch.UntypedStorage(n, device="unified"), deserialization).
namespace {
const bool g_registered = [] {
  c10::SetAllocator(kUnifiedDeviceType, get_allocator());
  return true;
}();
} // namespace

} // namespace c10::unified
