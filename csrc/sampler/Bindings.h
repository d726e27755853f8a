#pragma once
// Registers the samplers' functions on a Python module: the extension's
// torch_direct._C, or torch._C._unified on the fork (torch/csrc/Unified.cpp).

#include <torch/csrc/utils/pybind.h>

namespace torch_direct::sampler {

void bind(pybind11::module& m);

} // namespace torch_direct::sampler
