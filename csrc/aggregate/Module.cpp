// torch_direct.gnn.pipeline._aggregate: the GNN layers' fused mean aggregation, a module of
// its own (not part of the device: neither the extension's _C nor the fork carries it).

#include <torch/extension.h>

#include "MeanAggregate.h"

PYBIND11_MODULE(_aggregate, m) {
  namespace agg = torch_direct::aggregate;
  using no_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.doc() = "Mean aggregation over a sampled block's edges without an edge-by-feature copy";
  m.def("mean_forward", &agg::mean_forward, no_gil());
  m.def("mean_backward", &agg::mean_backward, no_gil());
#ifdef TORCH_DIRECT_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
