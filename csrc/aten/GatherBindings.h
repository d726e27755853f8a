#pragma once
// The Python bindings of the row gathers, one definition for both vehicles:
// the extension's module (csrc/extension/Module.cpp, torch_direct._C) and the
// fork's torch._C._unified (torch/csrc/Unified.cpp, patch 0006). Header-only:
// ATen, where the gathers themselves are compiled in the fork, has no pybind.
//
// Every gather lets go of the GIL: it waits on CUDA streams (the bounds check
// reads the index's min and max back) and, when hybrid, on its CPU threads,
// for milliseconds; a loader thread that held the GIL meanwhile would keep
// the training loop from launching kernels (on papers100M-like the step's GPU
// time went from 2.6 to 10.6 s an epoch).
//
// The CUDA gathers are bound where they are compiled: TORCH_DIRECT_WITH_CUDA
// (the extension) or USE_CUDA (the fork).

#include "UnifiedKernels.h"

#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <vector>

namespace torch_direct {

#if defined(TORCH_DIRECT_WITH_CUDA) || defined(USE_CUDA)
inline std::optional<at::native::unified::IndexStats> known_bounds(const std::optional<std::vector<int64_t>>& b) {
  if (!b) {
    return std::nullopt;
  }
  TORCH_CHECK(b->size() == 2, "gather: index bounds are (lo, hi), got ", b->size(), " values");
  return at::native::unified::IndexStats{(*b)[0], (*b)[1], false};
}
#endif

inline void bind_gathers(pybind11::module& m) {
  namespace native = at::native::unified;
  using no_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("_gather_rows_cpu", [](const at::Tensor& table, const at::Tensor& index, at::Tensor out) {
    return native::gather_rows_cpu(table, index, out);
  }, no_gil());
#if defined(TORCH_DIRECT_WITH_CUDA) || defined(USE_CUDA)
  // bounds: none, or (lo, hi) that the caller guarantees for every index value (gather's index_bounds)
  m.def("_gather_rows_cuda", [](const at::Tensor& table, const at::Tensor& index, at::Tensor out,
                                int64_t order, int64_t max_sms, std::optional<std::vector<int64_t>> bounds) {
    TORCH_CHECK(order >= 0 && order <= 2, "gather: bad order code");
    const auto known = known_bounds(bounds);
    return native::gather_rows_cuda(table, index, out, static_cast<native::GatherOrder>(order),
                                    max_sms, "gather", /*allow_negative=*/true, known ? &*known : nullptr);
  }, no_gil());
  m.def("_gather_rows_scaled_cuda", [](const at::Tensor& table, const at::Tensor& index, at::Tensor out,
                                       const at::Tensor& scale, int64_t order, int64_t max_sms,
                                       std::optional<std::vector<int64_t>> bounds) {
    TORCH_CHECK(order >= 0 && order <= 2, "gather: bad order code");
    const auto known = known_bounds(bounds);
    return native::gather_rows_scaled_cuda(table, index, out, scale, static_cast<native::GatherOrder>(order),
                                           max_sms, "gather", known ? &*known : nullptr);
  }, no_gil());
  m.def("_gather_rows_hybrid", [](const at::Tensor& table, const at::Tensor& index, at::Tensor out,
                                  int64_t cpu_threads, double cpu_fraction, int64_t order,
                                  int64_t max_sms) {
    TORCH_CHECK(order >= 0 && order <= 2, "gather: bad order code");
    return native::gather_rows_hybrid(table, index, out, cpu_threads, cpu_fraction,
                                      static_cast<native::GatherOrder>(order), max_sms, "gather");
  }, no_gil());
  m.def("_hybrid_cpu_fraction", [](int64_t device, int64_t row_bytes, int64_t table_bytes) {
    return native::hybrid_cpu_fraction(static_cast<c10::DeviceIndex>(device), row_bytes, table_bytes);
  });
#endif
}

} // namespace torch_direct
