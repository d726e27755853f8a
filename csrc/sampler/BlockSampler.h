#pragma once
// Neighbour sampling as whole-batch tensor steps, for a GPU that reads the CSR
// in place (unified memory: no copy of the graph to the GPU). Each hop draws
// every target's neighbours in one kernel (one thread per target, Floyd's
// algorithm over unbiased bounded draws), then relabels through a hash table
// (HashRelabel.h): new nodes get local ids in the order the edges discover them,
// exactly the CPU sampler's numbering. The same steps run on the CPU (a loop
// for the draw), which is how they are tested without a GPU. The host waits for
// the stream twice per hop (the edge count, `unique`'s size) and once for the
// seed check; TORCH_DIRECT_EXPERIMENTAL=sampler_waits=fewer waits once per hop
// (BlockSampler.cpp), and sampler_relabel=sort relabels by sort-based tensor
// ops (unique, argsort) instead of the hash table, with the same numbering.

#include "NeighborSampler.h"

namespace torch_direct::sampler {

// rowptr/col: CUDA tensors (aliases of unified memory, or device memory) or CPU
// tensors; seeds: distinct int64 node ids on the same device. Target d of hop
// h draws from its own generator (seed, target_stream(stream, h, d)), so a
// batch is the same for a seed and stream on either device.
SampledBatch sample_blocks(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& seeds,
                           const std::vector<int64_t>& fanouts, uint64_t seed, int64_t stream,
                           bool return_slots);

// The batches of `seeds` (a list; each distinct int64 node ids on the graph's device), batch b
// from stream streams[b]: the same batches as sample_blocks for each, with every hop's steps
// run once over all of them (one launch of each tensor step, one host wait for the edge counts
// and one for the node counts per hop, whatever the number of batches). BlockSamplerMany.cpp.
std::vector<SampledBatch> sample_blocks_many(const at::Tensor& rowptr, const at::Tensor& col,
                                             const std::vector<at::Tensor>& seeds,
                                             const std::vector<int64_t>& fanouts, uint64_t seed,
                                             const std::vector<int64_t>& streams, bool return_slots);

// Shared by both (BlockSampler.cpp): one hop's draw on the tensors' device; whether
// the hash table relabels (sampler_relabel is not sort); the seed checks' error from their facts.
void draw_hop(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees, int64_t fanout,
              const at::Tensor& offsets, uint64_t seed, uint64_t stream, at::Tensor& slots, at::Tensor& src,
              at::Tensor& dst);
bool hash_relabel_enabled();
// Each target's CSR row (begin, degree) and its edges' place in the hop (ends: running count,
// offsets = ends - count), for `rows`, the targets' node ids (read in one gather of both ends).
struct HopRows {
  at::Tensor begin, degree, ends, offsets;
};
HopRows hop_rows(const at::Tensor& rowptr, const at::Tensor& rows, int64_t fanout);
void check_seed_facts(int64_t lo, int64_t hi, bool repeated, int64_t num_nodes);

// One hop's draw: for each target i, whose CSR row starts at begins[i] and has
// degrees[i] entries, writes min(fanout, degree) distinct CSR slots (all when
// fanout < 0) at offsets[i] into `slots`, their neighbours into `src` and i
// into `dst`.
void draw_neighbours_cpu(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees,
                         int64_t fanout, const at::Tensor& offsets, uint64_t seed, uint64_t stream,
                         at::Tensor& slots, at::Tensor& src, at::Tensor& dst);
#ifdef TORCH_DIRECT_WITH_CUDA
void draw_neighbours_cuda(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees,
                          int64_t fanout, const at::Tensor& offsets, uint64_t seed, uint64_t stream,
                          at::Tensor& slots, at::Tensor& src, at::Tensor& dst);
#endif

// Local ids by first occurrence in `all` (contiguous int64, CPU or CUDA), through a hash table
// (HashRelabel.h): `nodes` the distinct values in order of first occurrence, `local` each
// position's local id (the index of its value in `nodes`), `first` each position's first
// position. The host waits once, for the count of distinct values.
struct Relabelled {
  at::Tensor nodes;
  at::Tensor local;
  at::Tensor first;
};
Relabelled relabel_by_hash(const at::Tensor& all);
// The same through unique and argsort (the default relabel): the host waits in `unique`;
// `first` only when `with_first` (an extra gather the seed check alone needs).
Relabelled relabel_by_sort(const at::Tensor& all, bool with_first);
#ifdef TORCH_DIRECT_WITH_CUDA
// Passes 1-2 and 3 of HashRelabel.h as kernels on the current stream.
void find_first_occurrences_cuda(const at::Tensor& all, at::Tensor& keys, at::Tensor& firsts, at::Tensor& first,
                                 at::Tensor& is_first);
void number_positions_cuda(const at::Tensor& all, const at::Tensor& first, const at::Tensor& scan,
                           at::Tensor& local, at::Tensor& nodes);
#endif

// The per-target stream of target i at hop h of a batch's stream.
inline uint64_t target_stream(uint64_t batch_stream, int64_t hop, int64_t i) {
  return (batch_stream * 64 + static_cast<uint64_t>(hop)) * 0x100000000ULL + static_cast<uint64_t>(i);
}

} // namespace torch_direct::sampler
