// torch_direct.gnn.pipeline._aggregate: the GNN layers' fused mean aggregation, a module of
// its own (not part of the device: neither the extension's _C nor the fork carries it).

#include <torch/extension.h>

#include "MeanAggregate.h"
#include "ReluDropout.h"
#include "StepHost.h"

PYBIND11_MODULE(_aggregate, m) {
  namespace agg = torch_direct::aggregate;
  using no_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.doc() = "Mean aggregation over a sampled block's edges without an edge-by-feature copy; ReLU and dropout in one pass; a training step's host side (padded batch copy, loss and accuracy tally) in one call each";
  m.def("mean_forward", &agg::mean_forward, no_gil());
  m.def("mean_backward", &agg::mean_backward, no_gil());
  m.def("fill_padded", &agg::fill_padded, no_gil());
  m.def("tally_step", &agg::tally_step, no_gil());
#ifdef TORCH_DIRECT_WITH_CUDA
  m.def("fill_padded_beside", &agg::fill_padded_beside, no_gil());
  m.def("relu_dropout_forward", &agg::relu_dropout_forward, no_gil());
  m.def("relu_dropout_backward", &agg::relu_dropout_backward, no_gil());
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
