#pragma once
// The CSR relabel of torch_direct.gnn.graph.reorder, on the CPU's threads.

#include <ATen/ATen.h>

#include <optional>

namespace torch_direct::sampler {

// Fills the relabelled graph's column ids (and edge ids) of new rows
// [row_begin, row_end): new row r is old row
// perm[r], its entries in the same order, each column id c written as inv[c].
// rowptr_new must be the new rows' starts (the old rows' lengths in perm's
// order, summed). col_new has col's dtype and length, eids_new eids'. Every
// array is a contiguous CPU tensor; rowptr, rowptr_new, perm and the edge ids
// are int64, col int32 or int64 and inv of col's type (half the bytes to read
// at random where the ids fit in int32). The work is split by edges, not rows, over
// up to `threads` threads (0: torch's count), so that a few long rows do not
// leave the other threads idle.
void relabel_csr(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& inv,
                 const at::Tensor& rowptr_new, at::Tensor& col_new, const std::optional<at::Tensor>& eids,
                 std::optional<at::Tensor>& eids_new, int64_t row_begin, int64_t row_end, int64_t threads);

} // namespace torch_direct::sampler
