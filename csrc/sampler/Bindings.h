#pragma once
// Registers the samplers' functions on the extension's Python module.

#include <torch/extension.h>

namespace torch_direct::sampler {

void bind(pybind11::module& m);

} // namespace torch_direct::sampler
