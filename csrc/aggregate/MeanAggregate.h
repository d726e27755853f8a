#pragma once
// Mean aggregation over the edges of a sampled block, without the edge-by-feature
// intermediate of index_select + index_add (on papers100M-like the first layer's
// block has ~10^6 edges: a 0.5 GB copy of rows written and read back each step).
//
//   forward:  out[d] = mean over edges e with dst[e] == d of x[src[e]]  (0 for no edge)
//   backward: grad_x[s] += grad_out[d] / deg[d] for each edge (s, d)
//
// Any edge order gives the right sums; edges grouped by target (the samplers'
// order) are the fast case: a warp walks a chunk of edges, sums the rows of a
// run of equal targets in registers and adds each run to the output once.

#include <ATen/ATen.h>

#include <utility>

namespace torch_direct::aggregate {

// Every index in range is the caller's check (aggregate.py's check_edges on the CPU; a GPU
// kernel asserts it). (out [n_dst, F], degree [n_dst]), both float32 (the sums are kept in float32 whatever x's
// dtype); x [n_src, F] float32, float16 or bfloat16; src/dst int64 or int32, one dimension,
// the same length.
std::pair<at::Tensor, at::Tensor> mean_forward(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                               int64_t n_dst);
// grad_x [n_src, F] as float32, from grad_out [n_dst, F] and the forward's degree.
at::Tensor mean_backward(const at::Tensor& grad_out, const at::Tensor& degree, const at::Tensor& src,
                         const at::Tensor& dst, int64_t n_src);

// The edge loops on the tensors' device, checked and allocated by the functions above.
// sums: float32 zeros [n_dst, F] (+= x rows), degree: float32 zeros [n_dst] (+= 1 per edge).
void sum_rows_cpu(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, at::Tensor& sums,
                  at::Tensor& degree);
// grad_x: float32 zeros [n_src, F] (+= scaled[dst] rows at src).
void scatter_rows_cpu(const at::Tensor& scaled, const at::Tensor& src, const at::Tensor& dst, at::Tensor& grad_x);
#ifdef TORCH_DIRECT_WITH_CUDA
void sum_rows_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, at::Tensor& sums,
                   at::Tensor& degree);
void scatter_rows_cuda(const at::Tensor& scaled, const at::Tensor& src, const at::Tensor& dst, at::Tensor& grad_x);
#endif

// Edges per warp (CUDA) and per chunk (CPU): a run of equal targets is added to the
// output once per chunk it touches.
constexpr int64_t kChunkEdges = 32;

} // namespace torch_direct::aggregate
