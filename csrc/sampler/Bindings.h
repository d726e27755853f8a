#pragma once
// Registers the samplers' functions on a Python module: torch_direct.gnn.graph._sampler
// (csrc/sampler/Module.cpp), on stock torch and on the fork alike. The samplers see CPU and
// CUDA tensors only: the Python side passes a unified CSR as its CPU or CUDA alias.

#include <torch/csrc/utils/pybind.h>

namespace torch_direct::sampler {

void bind(pybind11::module& m);

} // namespace torch_direct::sampler
