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

#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <chrono>
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

// Ops with a sparse kernel of their own (SparseCPU or SparseCUDA) and a
// CompositeExplicitAutograd one: the composite would serve a sparse COO
// unified tensor as if it were strided (unsqueeze's as_strided). Routed to the
// fallback, which runs the sparse kernel on the compute device's aliases.
int64_t claim_sparse_ops() {
  using K = c10::DispatchKey;
  return at::native::unified::claim_once(
      K::SparsePrivateUse1, c10::BoxedKernel::makeFromFunction<&at::native::unified::unified_fallback>(),
      [](const c10::OperatorHandle& op, const std::string&) {
        return op.hasKernelForDispatchKey(K::CompositeExplicitAutograd) &&
               (op.hasKernelForDispatchKey(K::SparseCPU) || op.hasKernelForDispatchKey(K::SparseCUDA));
      });
}

} // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<
             &at::native::unified::unified_fallback>());
}

// A sparse CPU or CUDA operand beside a unified one (torch.sparse.sampled_addmm
// of a CSR mask and unified dense matrices) dispatches to the sparse keys of
// PrivateUse1; unified tensors themselves are dense, and the fallback aliases
// only them.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<
             &at::native::unified::unified_fallback>());
}

// Sparse COO unified tensors (the sparse gradient of a unified embedding
// table): building one and reading its parts use PyTorch's own sparse
// kernels, which touch no data; everything else computes through the
// fallback's aliases (alias_as).
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
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
  m.def("_parallel_threads_used", [](int64_t chunks) {
    // How many distinct threads parallel_chunks runs `chunks` chunks on.
    std::mutex mu;
    std::set<std::thread::id> ids;
    at::native::unified::parallel_chunks(chunks, 1, chunks, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::lock_guard<std::mutex> g(mu);
      ids.insert(std::this_thread::get_id());
    });
    return static_cast<int64_t>(ids.size());
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
