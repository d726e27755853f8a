// Python bindings of the samplers (called from the extension's module).

#include "Bindings.h"

#include "BlockSampler.h"
#include "NeighborSampler.h"
#include "Relabel.h"

namespace torch_direct::sampler {
namespace {

namespace py = pybind11;

// (n_id, [(edge_index, slots or None, n_src, n_dst) per hop])
py::tuple to_python(const SampledBatch& b) {
  py::list hops;
  for (const auto& h : b.hops) {
    py::object slots = h.slots.defined() ? py::cast(h.slots) : py::none();
    hops.append(py::make_tuple(h.edge_index, slots, h.n_src, h.n_dst));
  }
  return py::make_tuple(b.n_id, hops);
}

// The graph's arrays on the seeds' device (a unified CSR comes as its CUDA alias,
// torch_direct.cuda_alias: read in place).
const at::Tensor& on_device(const at::Tensor& t, c10::Device device) {
  TORCH_CHECK(t.device() == device, "the graph is on ", t.device(), " but the seeds are on ", device,
              " (put the graph in unified memory, or on the seeds' device)");
  return t;
}

} // namespace

void bind(pybind11::module& m) {
  m.def("_relabel_csr",
        [](const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& inv,
           const at::Tensor& rowptr_new, at::Tensor col_new, const std::optional<at::Tensor>& eids,
           std::optional<at::Tensor> eids_new, int64_t row_begin, int64_t row_end, int64_t threads) {
          py::gil_scoped_release no_gil;
          relabel_csr(rowptr, col, perm, inv, rowptr_new, col_new, eids, eids_new, row_begin, row_end, threads);
        });
  m.def("_sample_neighbors",
        [](const at::Tensor& rowptr, const at::Tensor& col, const std::vector<at::Tensor>& batches,
           const std::vector<int64_t>& fanouts, uint64_t seed, const std::vector<int64_t>& streams,
           bool return_slots, bool pin_output) {
          std::vector<SampledBatch> result;
          {
            py::gil_scoped_release no_gil;
            result = sample_neighbors(rowptr, col, batches, fanouts, seed, streams, return_slots, pin_output);
          }
          py::list out;
          for (const auto& b : result) {
            out.append(to_python(b));
          }
          return out;
        });
  m.def("_sample_blocks",
        [](const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& seeds,
           const std::vector<int64_t>& fanouts, uint64_t seed, int64_t stream, bool return_slots) {
          SampledBatch result;
          {
            py::gil_scoped_release no_gil;
            result = sample_blocks(on_device(rowptr, seeds.device()), on_device(col, seeds.device()),
                                   seeds, fanouts, seed, stream, return_slots);
          }
          return to_python(result);
        });
  m.def("_sample_blocks_many",
        [](const at::Tensor& rowptr, const at::Tensor& col, const std::vector<at::Tensor>& seeds,
           const std::vector<int64_t>& fanouts, uint64_t seed, const std::vector<int64_t>& streams,
           bool return_slots) {
          std::vector<SampledBatch> result;
          {
            py::gil_scoped_release no_gil;
            result = sample_blocks_many(rowptr, col, seeds, fanouts, seed, streams, return_slots);
          }
          py::list out;
          for (const auto& b : result) {
            out.append(to_python(b));
          }
          return out;
        });
  m.def("_sampler_uniform_below", &uniform_below);
}

} // namespace torch_direct::sampler
