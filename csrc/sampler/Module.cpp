// torch_direct.gnn.graph._sampler: the neighbour samplers of the GNN stack, a module of
// their own (not part of the device: neither the extension's _C nor the fork carries them).

#include <torch/extension.h>

#include "Bindings.h"

PYBIND11_MODULE(_sampler, m) {
  m.doc() = "Neighbour samplers (CPU threads; GPU over a CSR in device or mapped host memory)";
  torch_direct::sampler::bind(m);
}
