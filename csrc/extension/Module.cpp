// The extension's Python module: registers the unified backend with stock
// PyTorch (hooks, boxed fallback; the per-op kernels are registered by the
// generated RegisterUnified.cpp) and exposes the runtime to torch_direct.

#include "../aten/Claims.h"
#include "../aten/GatherBindings.h"
#include "../aten/HybridSplit.h"
#include "../aten/ParallelChunks.h"
#include "../aten/Placement.h"
#include "../aten/Sharing.h"
#include "../aten/UnifiedKernels.h"
#include "../runtime/AcceleratorHook.h"
#include "../runtime/UnifiedHooks.h"
#include "../../c10_allocator/CudaRuntime.h"
#include "../../c10_allocator/HostRegistration.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <torch/extension.h>
#include <torch/library.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

namespace {

namespace alloc = c10::unified;
using at::native::unified::is_unified;

py::tuple share(const at::Tensor& u) {
  auto h = at::native::unified::share(u);
  return py::make_tuple(h.fd, h.mapped_bytes, h.storage_nbytes);
}

// Structured ops (and the others Fallback.cpp lists) are routed to the
// fallback explicitly.
int64_t claim_structured_ops() {
  return at::native::unified::claim_structured_ops(c10::DispatchKey::PrivateUse1);
}

// Autograd through unified operands (Autograd.cpp); after claim_structured_ops.
int64_t claim_autograd_ops() {
  return at::native::unified::claim_autograd_ops(c10::DispatchKey::AutogradPrivateUse1,
                                                 c10::DispatchKey::PrivateUse1);
}

// Sparse COO unified tensors (Autograd.cpp); after claim_structured_ops.
int64_t claim_sparse_ops() {
  return at::native::unified::claim_sparse_ops(c10::DispatchKey::SparsePrivateUse1);
}

} // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<
             &at::native::unified::unified_fallback>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  at::native::unified::register_hooks();
  claim_structured_ops();
  claim_sparse_ops();
  claim_autograd_ops();
  m.def("_claimed_structured_ops", &claim_structured_ops);
  m.def("_claimed_autograd_ops", &claim_autograd_ops);
  m.def("_claimed_sparse_ops", &claim_sparse_ops);
  m.def("_install_accelerator_hook", [](std::optional<std::string> previous) {
    std::optional<c10::DeviceType> type;
    if (previous.has_value()) {
      type = c10::Device(*previous).type();
    }
    return at::native::unified::install_accelerator_hook(type);
  });
  m.def("_memory_stats", [] { return alloc::get_allocator()->stats(); });
  m.def("_empty_cache", [] { alloc::get_allocator()->empty_cache(); });
  m.def("_reset_peak", [] { alloc::get_allocator()->reset_peak(); });
  // pin_inplace, sharing, mapping, aliases: csrc/aten/Sharing.cpp (the fork
  // binds the same in torch._C._unified).
  m.def("_pin_inplace", &at::native::unified::pin_inplace);
  m.def("_pinned_owner", &at::native::unified::pinned_owner);
  m.def("_driver_mapped_empty", [](std::vector<int64_t> sizes, const at::Tensor& like) {
    return at::native::unified::driver_mapped_empty(sizes, like);
  });
  m.def("_share", &share);
  m.def("_from_shared", &at::native::unified::from_shared);
  m.def("_block_kind", &at::native::unified::block_kind);
  m.def("_is_mapped", &at::native::unified::is_mapped);
  m.def("_map_for_gpu", &at::native::unified::map_for_gpu);
  m.def("_as_cuda_alias", &at::native::unified::as_cuda_alias);
  m.def("_as_cpu_alias", &at::native::unified::as_cpu_alias);
  torch_direct::bind_gathers(m);  // _gather_rows_cpu, and with CUDA _gather_rows_cuda/_scaled_cuda/_hybrid, _hybrid_cpu_fraction
#ifndef TORCH_DIRECT_WITH_CUDA
  // Without CUDA the extension still has these names, each saying why it cannot run.
  m.def("_gather_rows_cuda", [](const at::Tensor&, const at::Tensor&, at::Tensor out, int64_t, int64_t) {
    TORCH_CHECK(false, "torch_direct was built without CUDA");
    return out;
  });
  m.def("_gather_rows_hybrid", [](const at::Tensor&, const at::Tensor&, at::Tensor, int64_t, double,
                                  int64_t, int64_t) {
    TORCH_CHECK(false, "torch_direct was built without CUDA");
    return 0.0;
  });
  m.def("_gather_rows_scaled_cuda", [](const at::Tensor&, const at::Tensor&, at::Tensor out,
                                       const at::Tensor&, int64_t, int64_t) {
    TORCH_CHECK(false, "torch_direct was built without CUDA");
    return out;
  });
  m.def("_hybrid_cpu_fraction", [](int64_t, int64_t, int64_t) { return 0.0; });
#endif
  m.def("_hybrid_parts", [] {
    // {part: (host seconds, calls)} of every hybrid gather so far (none without CUDA)
    std::map<std::string, std::tuple<double, int64_t>> out;
#ifdef TORCH_DIRECT_WITH_CUDA
    const auto p = at::native::unified::hybrid_parts();
    if (p.calls > 0) {
      out["hybrid_bounds_wait"] = {p.bounds_wait_s, p.calls};
      out["hybrid_cpu_rows"] = {p.cpu_rows_s, p.calls};
      out["hybrid_copy_wait"] = {p.copy_wait_s, p.calls};
      out["hybrid_gpu_wait"] = {p.gpu_wait_s, p.calls};
    }
#endif
    return out;
  });
  m.def("_parallel_threads_used", [](int64_t chunks) {
    // How many distinct threads parallel_chunks runs `chunks` chunks on. Each chunk waits (up
    // to 10 s) until every chunk has started, so a thread slow to wake on a loaded host cannot
    // leave its chunk to a thread that already ran one: only a pool too small to run them all
    // at once gives fewer threads than chunks.
    std::mutex mu;
    std::condition_variable cv;
    std::set<std::thread::id> ids;
    int64_t started = 0;
    at::native::unified::parallel_chunks(chunks, 1, chunks, [&](int64_t b, int64_t e) {
      std::unique_lock<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
      started += e - b;   // one item a chunk, or all of them where the call runs them as one
      if (started == chunks) {
        cv.notify_all();
      }
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return started >= chunks; });
    });
    return static_cast<int64_t>(ids.size());
  });
  m.def("_parallel_concurrent_peak", [](int64_t callers, int64_t chunks) {
    // The most chunks running at once while `callers` threads each run
    // parallel_chunks over `chunks` chunks, all started together.
    std::mutex mu;
    std::condition_variable cv;
    int64_t ready = 0;
    int64_t running = 0;
    int64_t peak = 0;
    std::vector<std::thread> threads;
    std::exception_ptr error;
    for (int64_t c = 0; c < callers; ++c) {
      threads.emplace_back([&] {
        try {
          {
            std::unique_lock<std::mutex> lock(mu);
            ++ready;
            cv.notify_all();
            cv.wait(lock, [&] { return ready == callers; });
          }
          at::native::unified::parallel_chunks(chunks, 1, chunks, [&](int64_t, int64_t) {
            {
              std::lock_guard<std::mutex> g(mu);
              peak = std::max(peak, ++running);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(150));
            std::lock_guard<std::mutex> g(mu);
            --running;
          });
        } catch (...) {
          std::lock_guard<std::mutex> g(mu);
          error = error ? error : std::current_exception();
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    if (error) {
      std::rethrow_exception(error);
    }
    return peak;
  });
  m.def("_parallel_thread_nices", [](int64_t chunks) {
    // The niceness of each thread that ran one of `chunks` chunks, the calling
    // thread's first (cpu_pool_nice's check).
    std::mutex mu;
    const auto caller = std::this_thread::get_id();
    int caller_nice = 0;
    std::map<std::thread::id, int> others;
    at::native::unified::parallel_chunks(chunks, 1, chunks, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int n = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
      std::lock_guard<std::mutex> g(mu);
      if (std::this_thread::get_id() == caller) {
        caller_nice = n;
      } else {
        others[std::this_thread::get_id()] = n;
      }
    });
    std::vector<int64_t> out{caller_nice};
    for (const auto& [id, n] : others) {
      out.push_back(n);
    }
    return out;
  });
  // The hybrid split's policy replayed over given call timings (n, k, cpu_s,
  // gpu_s): the fraction it picks before the first call and after each one.
  m.def("_hybrid_policy_replay", [](const std::vector<std::tuple<int64_t, int64_t, double, double>>& calls) {
    at::native::unified::HybridRates r;
    std::vector<double> picks{at::native::unified::choose_hybrid_fraction(r)};
    for (const auto& [n, k, cpu_s, gpu_s] : calls) {
      at::native::unified::record_hybrid_call(r, n, k, cpu_s, gpu_s);
      picks.push_back(at::native::unified::choose_hybrid_fraction(r));
    }
    return picks;
  });
  m.def("_cuda_available", [] { return alloc::cuda::available(); });
  m.def("_register_chunk_bytes", [] { return alloc::register_chunk_bytes(); });
  m.def("_built_with_cuda", [] {
#ifdef TORCH_DIRECT_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
