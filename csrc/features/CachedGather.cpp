// The cached gather's checks and CPU pass (CachedGather.h); the CUDA pass is in
// CachedGatherKernels.cu.

#include "CachedGather.h"

#include <ATen/Parallel.h>

#include <atomic>

namespace torch_direct::features {

void check_cached_gather(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                         const at::Tensor& index, const at::Tensor& pos, const at::Tensor& out,
                         const at::Tensor& scale, const at::Tensor& cache_scale,
                         const at::Tensor& counters) {
  const char* op = "cached_gather";
  TORCH_CHECK(table.dim() == 2 && table.stride(1) == 1, op,
              ": table must be 2-D [rows, width] with contiguous rows, got shape ", table.sizes(),
              " and strides ", table.strides());
  TORCH_CHECK(torch_direct::rows::is_cast_input(table.scalar_type()), op,
              ": table must be float32, float16, bfloat16 or float8_e4m3fn, got ", table.scalar_type());
  const int64_t rows = table.size(0);
  const int64_t width = table.size(1);
  TORCH_CHECK(cache.dim() == 2 && cache.is_contiguous() && cache.size(1) == width &&
                  cache.scalar_type() == table.scalar_type(),
              op, ": cache must be a contiguous [cache_rows, ", width, "] ", table.scalar_type(),
              " tensor, got ", cache.scalar_type(), " of shape ", cache.sizes());
  TORCH_CHECK(slot.dim() == 1 && slot.is_contiguous() && slot.scalar_type() == at::kInt && slot.size(0) == rows,
              op, ": slot must be a contiguous 1-D int32 tensor with one entry per table row (", rows,
              "), got ", slot.scalar_type(), " of shape ", slot.sizes());
  TORCH_CHECK(index.dim() == 1 && index.is_contiguous() &&
                  (index.scalar_type() == at::kInt || index.scalar_type() == at::kLong),
              op, ": index must be a contiguous 1-D int32/int64 tensor, got ", index.scalar_type(),
              " of shape ", index.sizes());
  const int64_t n = index.size(0);
  if (pos.defined()) {
    TORCH_CHECK(pos.dim() == 1 && pos.is_contiguous() && pos.scalar_type() == at::kLong && pos.size(0) == n, op,
                ": pos must be a contiguous 1-D int64 tensor with one entry per index entry (", n, "), got ",
                pos.scalar_type(), " of shape ", pos.sizes());
  }
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == n && out.size(1) == width &&
                  torch_direct::rows::is_cast_output(out.scalar_type()),
              op, ": out must be a contiguous [", n, ", ", width, "] float32/float16/bfloat16 tensor, got ",
              out.scalar_type(), " of shape ", out.sizes());
  const bool fp8 = table.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(scale.defined() == fp8 && cache_scale.defined() == fp8, op,
              fp8 ? ": a float8 table needs scale and cache_scale (one float32 per row)"
                  : ": scale and cache_scale go with a float8 table only");
  if (fp8) {
    TORCH_CHECK(scale.dim() == 1 && scale.is_contiguous() && scale.scalar_type() == at::kFloat &&
                    scale.size(0) == rows,
                op, ": scale must be a contiguous 1-D float32 tensor of ", rows, " entries, got ",
                scale.scalar_type(), " of shape ", scale.sizes());
    TORCH_CHECK(cache_scale.dim() == 1 && cache_scale.is_contiguous() && cache_scale.scalar_type() == at::kFloat &&
                    cache_scale.size(0) == cache.size(0),
                op, ": cache_scale must be a contiguous 1-D float32 tensor of ", cache.size(0), " entries, got ",
                cache_scale.scalar_type(), " of shape ", cache_scale.sizes());
  }
  TORCH_CHECK(counters.dim() == 1 && counters.is_contiguous() && counters.scalar_type() == at::kLong &&
                  counters.size(0) == 2,
              op, ": counters must be a contiguous int64 tensor of 2 entries (misses, bad rows), got ",
              counters.scalar_type(), " of shape ", counters.sizes());
  const auto device = out.device();
  auto same = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(!t.defined() || t.device() == device, op, ": ", name, " is on ", t.device(),
                ", out on ", device, ": every tensor on one device");
  };
  same(table, "table");
  same(cache, "cache");
  same(slot, "slot");
  same(index, "index");
  same(pos, "pos");
  same(scale, "scale");
  same(cache_scale, "cache_scale");
  same(counters, "counters");
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), op, ": expected CPU or CUDA tensors, got ", device);
}

namespace {

template <typename in_t, typename out_t, typename index_t>
void cpu_pass(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
              const at::Tensor& index, const at::Tensor& pos, at::Tensor& out, const at::Tensor& scale,
              const at::Tensor& cache_scale, at::Tensor& counters) {
  const int64_t rows = table.size(0);
  const int64_t cache_rows = cache.size(0);
  const int64_t width = table.size(1);
  const int64_t stride = table.stride(0);
  const int64_t n = index.size(0);
  const in_t* tab = table.const_data_ptr<in_t>();
  const in_t* cac = cache.const_data_ptr<in_t>();
  const int32_t* sl = slot.const_data_ptr<int32_t>();
  const index_t* idx = index.const_data_ptr<index_t>();
  const int64_t* ps = pos.defined() ? pos.const_data_ptr<int64_t>() : nullptr;
  const float* sc = scale.defined() ? scale.const_data_ptr<float>() : nullptr;
  const float* csc = cache_scale.defined() ? cache_scale.const_data_ptr<float>() : nullptr;
  out_t* o = out.data_ptr<out_t>();
  std::atomic<int64_t> misses{0}, bad{0};
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    int64_t m = 0, b = 0;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t p = ps ? ps[j] : j;
      if (p < 0 || p >= n) {               // a position outside out: nothing written
        ++b;
        continue;
      }
      out_t* dst = o + p * width;
      const int64_t r = static_cast<int64_t>(idx[j]);
      const in_t* src = nullptr;   // stays null for a row outside the table or a slot past the cache
      float f = 1.0f;
      if (r >= 0 && r < rows) {
        const int64_t s = sl[r];
        if (s < 0) {                       // a miss: the table's row
          src = tab + r * stride;
          f = sc ? sc[r] : 1.0f;
          ++m;
        } else if (s < cache_rows) {       // a hit
          src = cac + s * width;
          f = csc ? csc[s] : 1.0f;
        }
      }
      if (src == nullptr) {
        ++b;
        for (int64_t k = 0; k < width; ++k) dst[k] = out_t(0.0f);
        continue;
      }
      for (int64_t k = 0; k < width; ++k) {
        dst[k] = static_cast<out_t>(static_cast<float>(src[k]) * f);
      }
    }
    misses += m;
    bad += b;
  });
  auto* c = counters.data_ptr<int64_t>();
  c[0] += misses.load();
  c[1] += bad.load();
}

} // namespace

void cached_gather_cpu(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                       const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                       const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters) {
  const auto in_type = table.scalar_type();
  torch_direct::rows::dispatch_cast(in_type, out.scalar_type(), "cached_gather", [&](auto in_tag, auto out_tag) {
    using in_t = decltype(in_tag);
    using out_t = decltype(out_tag);
    if (index.scalar_type() == at::kInt) {
      cpu_pass<in_t, out_t, int32_t>(table, cache, slot, index, pos, out, scale, cache_scale, counters);
    } else {
      cpu_pass<in_t, out_t, int64_t>(table, cache, slot, index, pos, out, scale, cache_scale, counters);
    }
  });
}

void cached_gather(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                   const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                   const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters,
                   int64_t max_sms) {
  check_cached_gather(table, cache, slot, index, pos, out, scale, cache_scale, counters);
  TORCH_CHECK(max_sms >= 0, "cached_gather: max_sms must be >= 0 (0: every SM), got ", max_sms);
  if (out.device().is_cpu()) {
    cached_gather_cpu(table, cache, slot, index, pos, out, scale, cache_scale, counters);
    return;
  }
#ifdef TORCH_DIRECT_WITH_CUDA
  cached_gather_cuda(table, cache, slot, index, pos, out, scale, cache_scale, counters, max_sms);
#else
  TORCH_CHECK(false, "cached_gather: torch_direct was built without CUDA");
#endif
}

} // namespace torch_direct::features
