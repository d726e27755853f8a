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
  pybind11::class_<agg::PaddedBuffers> padded(m, "PaddedBuffers",
                                              "A graphed step's padded buffers and the copy of a batch into them");
  padded.def(pybind11::init<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                            std::vector<int64_t>, at::Tensor>(),
             pybind11::arg("x_buf"), pybind11::arg("edges"), pybind11::arg("ramps"), pybind11::arg("pad_src"),
             pybind11::arg("dst_caps"), pybind11::arg("y_buf"));
  padded.def("fill", &agg::PaddedBuffers::fill, no_gil());
  m.def("tally_step", &agg::tally_step, no_gil());
#ifdef TORCH_DIRECT_WITH_CUDA
  padded.def("fill_beside", &agg::PaddedBuffers::fill_beside, no_gil());
  m.def("relu_dropout_forward", &agg::relu_dropout_forward, no_gil());
  m.def("relu_dropout_backward", &agg::relu_dropout_backward, no_gil());
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
