// Python bindings of the samplers (called from the extension's module).

#include "Bindings.h"

#include "NeighborSampler.h"

namespace torch_direct::sampler {

void bind(pybind11::module& m) {
  namespace py = pybind11;
  // Returns one (n_id, [(edge_index, slots or None, n_src, n_dst) per hop]) per batch.
  m.def("_sample_neighbors",
        [](const at::Tensor& rowptr, const at::Tensor& col, const std::vector<at::Tensor>& batches,
           const std::vector<int64_t>& fanouts, uint64_t seed, const std::vector<int64_t>& streams,
           bool return_slots) {
          std::vector<SampledBatch> result;
          {
            py::gil_scoped_release no_gil;
            result = sample_neighbors(rowptr, col, batches, fanouts, seed, streams, return_slots);
          }
          py::list out;
          for (auto& b : result) {
            py::list hops;
            for (auto& h : b.hops) {
              py::object slots = h.slots.defined() ? py::cast(h.slots) : py::none();
              hops.append(py::make_tuple(h.edge_index, slots, h.n_src, h.n_dst));
            }
            out.append(py::make_tuple(b.n_id, hops));
          }
          return out;
        });
  m.def("_sampler_uniform_below", &uniform_below);
}

} // namespace torch_direct::sampler
