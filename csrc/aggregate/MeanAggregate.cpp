// Mean aggregation (MeanAggregate.h): the checks, the allocation and the CPU loops. The
// indices' range is checked by the caller, torch_direct/gnn/pipeline/aggregate.py, before the
// forward (on the CPU; on a GPU the kernels assert it); the backward gets the same indices.
// The CPU loops walk the edges in the CUDA kernel's chunks and runs, so the tests of
// this module on the CPU check the same bookkeeping the GPU does; threads split the
// feature columns, so no two of them add to the same element.

#include "MeanAggregate.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace torch_direct::aggregate {
namespace {

void check_edges(const at::Tensor& src, const at::Tensor& dst, c10::Device device, const char* what) {
  TORCH_CHECK_VALUE(src.dim() == 1 && dst.dim() == 1, what, ": src and dst must be one-dimensional, got shapes ",
              src.sizes(), " and ", dst.sizes());
  TORCH_CHECK_VALUE(src.numel() == dst.numel(), what, ": src has ", src.numel(), " edges but dst has ", dst.numel());
  TORCH_CHECK_TYPE(src.scalar_type() == dst.scalar_type() &&
                  (src.scalar_type() == at::kLong || src.scalar_type() == at::kInt),
              what, ": src and dst must both be int64 or both int32, got ", src.scalar_type(), " and ",
              dst.scalar_type());
  TORCH_CHECK_VALUE(src.device() == device && dst.device() == device, what, ": the edges are on ", src.device(), " and ",
              dst.device(), " but the rows on ", device);
}

void check_rows(const at::Tensor& rows, const char* name, const char* what) {
  TORCH_CHECK_VALUE(rows.dim() == 2, what, ": ", name, " must be two-dimensional [nodes, features], got shape ",
              rows.sizes());
  const auto t = rows.scalar_type();
  TORCH_CHECK_TYPE(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, what, ": ", name,
              " must be float32, float16 or bfloat16, got ", t);
  TORCH_CHECK_VALUE(rows.device().is_cpu() || rows.device().is_cuda(), what, ": ", name, " is on ", rows.device(),
              " (CPU or CUDA only)");
}

template <typename index_t, typename Visit>
void walk_runs(const index_t* src, const index_t* dst, int64_t edges, Visit&& visit) {
  // visit(run_target, first_edge, end_edge): the edges of one run within one chunk
  for (int64_t chunk = 0; chunk < edges; chunk += kChunkEdges) {
    const int64_t end = std::min(edges, chunk + kChunkEdges);
    int64_t start = chunk;
    for (int64_t e = chunk + 1; e <= end; ++e) {
      if (e == end || dst[e] != dst[start]) {
        visit(static_cast<int64_t>(dst[start]), start, e);
        start = e;
      }
    }
  }
}

} // namespace

void sum_rows_cpu(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, at::Tensor& sums,
                  at::Tensor& degree) {
  const int64_t edges = src.numel();
  const int64_t F = x.size(1);
  float* out = sums.data_ptr<float>();
  float* deg = degree.data_ptr<float>();
  AT_DISPATCH_INDEX_TYPES(src.scalar_type(), "mean_aggregate", [&] {
    const index_t* s = src.data_ptr<index_t>();
    const index_t* d = dst.data_ptr<index_t>();
    walk_runs(s, d, edges, [&](int64_t target, int64_t first, int64_t end) {
      deg[target] += static_cast<float>(end - first);
    });
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "mean_aggregate", [&] {
      const scalar_t* rows = x.data_ptr<scalar_t>();
      at::parallel_for(0, F, 16, [&](int64_t f0, int64_t f1) {
        std::vector<float> acc(static_cast<size_t>(f1 - f0));
        walk_runs(s, d, edges, [&](int64_t target, int64_t first, int64_t end) {
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t e = first; e < end; ++e) {
            const scalar_t* row = rows + static_cast<int64_t>(s[e]) * F;
            for (int64_t f = f0; f < f1; ++f) {
              acc[f - f0] += static_cast<float>(row[f]);
            }
          }
          float* o = out + target * F;
          for (int64_t f = f0; f < f1; ++f) {
            o[f] += acc[f - f0];
          }
        });
      });
    });
  });
}

void scatter_rows_cpu(const at::Tensor& scaled, const at::Tensor& src, const at::Tensor& dst, at::Tensor& grad_x) {
  const int64_t edges = src.numel();
  const int64_t F = scaled.size(1);
  const float* g = scaled.data_ptr<float>();
  float* out = grad_x.data_ptr<float>();
  AT_DISPATCH_INDEX_TYPES(src.scalar_type(), "mean_aggregate_backward", [&] {
    const index_t* s = src.data_ptr<index_t>();
    const index_t* d = dst.data_ptr<index_t>();
    at::parallel_for(0, F, 16, [&](int64_t f0, int64_t f1) {
      for (int64_t e = 0; e < edges; ++e) {
        const float* row = g + static_cast<int64_t>(d[e]) * F;
        float* o = out + static_cast<int64_t>(s[e]) * F;
        for (int64_t f = f0; f < f1; ++f) {
          o[f] += row[f];
        }
      }
    });
  });
}

std::pair<at::Tensor, at::Tensor> mean_forward(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                               int64_t n_dst) {
  constexpr const char* what = "mean_aggregate";
  check_rows(x, "x", what);
  check_edges(src, dst, x.device(), what);
  TORCH_CHECK_VALUE(n_dst >= 0, what, ": n_dst must be >= 0, got ", n_dst);
  const at::Tensor rows = x.contiguous();
  const at::Tensor s = src.contiguous();
  const at::Tensor d = dst.contiguous();
  at::Tensor sums = at::zeros({n_dst, x.size(1)}, x.options().dtype(at::kFloat));
  at::Tensor degree = at::zeros({n_dst}, x.options().dtype(at::kFloat));
  if (s.numel() > 0 && x.size(1) > 0) {
#ifdef TORCH_DIRECT_WITH_CUDA
    if (x.is_cuda()) {
      sum_rows_cuda(rows, s, d, sums, degree);
    } else
#endif
    {
      TORCH_CHECK(x.is_cpu(), what, ": this build has no CUDA kernels (x is on ", x.device(), ")");
      sum_rows_cpu(rows, s, d, sums, degree);
    }
  } else if (s.numel() > 0) {
    degree.index_add_(0, d, at::ones({d.numel()}, degree.options()));
  }
  sums.div_(degree.clamp_min(1).unsqueeze(1));
  return {sums, degree};
}

at::Tensor mean_backward(const at::Tensor& grad_out, const at::Tensor& degree, const at::Tensor& src,
                         const at::Tensor& dst, int64_t n_src) {
  constexpr const char* what = "mean_aggregate backward";
  check_rows(grad_out, "grad_out", what);
  check_edges(src, dst, grad_out.device(), what);
  TORCH_CHECK_VALUE(degree.dim() == 1 && degree.size(0) == grad_out.size(0), what, ": degree has shape ",
              degree.sizes(), " for ", grad_out.size(0), " targets");
  TORCH_CHECK_VALUE(n_src >= 0, what, ": n_src must be >= 0, got ", n_src);
  at::Tensor scaled = grad_out.to(at::kFloat).div(degree.to(at::kFloat).clamp_min(1).unsqueeze(1)).contiguous();
  at::Tensor grad_x = at::zeros({n_src, grad_out.size(1)}, grad_out.options().dtype(at::kFloat));
  if (src.numel() > 0 && grad_out.size(1) > 0) {
#ifdef TORCH_DIRECT_WITH_CUDA
    if (grad_out.is_cuda()) {
      scatter_rows_cuda(scaled, src.contiguous(), dst.contiguous(), grad_x);
    } else
#endif
    {
      TORCH_CHECK(grad_out.is_cpu(), what, ": this build has no CUDA kernels");
      scatter_rows_cpu(scaled, src.contiguous(), dst.contiguous(), grad_x);
    }
  }
  return grad_x;
}

} // namespace torch_direct::aggregate
