// torch_direct.gnn.pipeline._features: the GNN feature store's cached gather (CachedGather.h)
// and the unpacking of 4-bit rows (Int4Unpack.h), a module of its own (not part of the device:
// neither the extension's _C nor the fork carries it).

#include <torch/extension.h>

#include "CachedGather.h"
#include "Int4Unpack.h"

PYBIND11_MODULE(_features, m) {
  using no_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.doc() = "A feature store's cached gather (hot rows from a cache in device memory, the rest from the table in "
          "place) and the unpacking of 4-bit rows";
  m.def("cached_gather",
        [](const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot, const at::Tensor& index,
           const std::optional<at::Tensor>& pos, at::Tensor out, const std::optional<at::Tensor>& scale,
           const std::optional<at::Tensor>& cache_scale, at::Tensor counters, int64_t max_sms) {
          torch_direct::features::cached_gather(table, cache, slot, index, pos.value_or(at::Tensor()), out,
                                                scale.value_or(at::Tensor()), cache_scale.value_or(at::Tensor()),
                                                counters, max_sms);
          return out;
        },
        no_gil());
  m.def("unpack_int4",
        [](const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor out,
           const std::optional<at::Tensor>& rows_at, const std::optional<at::Tensor>& out_at) {
          torch_direct::features::unpack_int4(rows, scale, index, out, rows_at.value_or(at::Tensor()),
                                              out_at.value_or(at::Tensor()));
          return out;
        },
        pybind11::arg("rows"), pybind11::arg("scale"), pybind11::arg("index"), pybind11::arg("out"),
        pybind11::arg("rows_at") = pybind11::none(), pybind11::arg("out_at") = pybind11::none(), no_gil());
  m.attr("large_table_bytes") = torch_direct::features::kLargeTableBytes;
#ifdef TORCH_DIRECT_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
