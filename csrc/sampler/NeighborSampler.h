#pragma once
// CPU neighbour sampler: per-layer bipartite blocks for mini-batch GNN
// training, in the layout PyG's layers consume.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torch_direct::sampler {

// One hop of a batch: edges from sampled neighbours (local source ids, row 0)
// to the nodes they feed (local target ids, row 1). Targets are the first
// n_dst entries of the batch's node list, sources the first n_src.
struct Hop {
  at::Tensor edge_index;  // int64 [2, E]
  at::Tensor slots;       // int64 [E]: positions in `col` (edge ids of the CSR), or undefined
  int64_t n_src = 0;
  int64_t n_dst = 0;
};

struct SampledBatch {
  at::Tensor n_id;  // int64: the seeds first, then each hop's new nodes, in discovery order
  std::vector<Hop> hops;  // hops[0] samples the seeds' neighbours
};

// Samples every batch in `batches` (1-D int64 CPU tensors of distinct node
// ids) on CPU worker threads, one batch per thread at a time. Row v of the
// CSR (rowptr int64 [N+1], col int32/int64 [E]; CPU or unified) lists the
// nodes v aggregates from. For each hop, every node found so far draws
// min(fanout, degree) distinct neighbour slots uniformly without replacement
// (fanout < 0: all). Batch b draws from its own generator, seeded by
// (seed, streams[b]), so results do not depend on the number of threads.
// pin_output: the results in page-locked memory (needs CUDA), for an
// asynchronous copy to a GPU.
std::vector<SampledBatch> sample_neighbors(const at::Tensor& rowptr, const at::Tensor& col,
                                           const std::vector<at::Tensor>& batches,
                                           const std::vector<int64_t>& fanouts, uint64_t seed,
                                           const std::vector<int64_t>& streams, bool return_slots,
                                           bool pin_output = false);

// n draws from [0, bound) by the samplers' generator (exposed for tests).
at::Tensor uniform_below(uint64_t seed, uint64_t stream, int64_t bound, int64_t n);

} // namespace torch_direct::sampler
