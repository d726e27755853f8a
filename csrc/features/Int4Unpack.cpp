// The 4-bit rows' unpacking (Int4Unpack.h): its checks and CPU pass; the CUDA pass is in
// Int4UnpackKernels.cu.

#include "Int4Unpack.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>

namespace torch_direct::features {

namespace {

template <typename out_t, typename index_t>
void unpack_cpu(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
                const int64_t* rows_at, const int64_t* out_at) {
  const int64_t n = index.size(0), m = rows.size(1), r_max = scale.size(0);
  const int64_t src_rows = rows.size(0), dst_rows = out.size(0);
  const uint8_t* in = rows.const_data_ptr<uint8_t>();
  const float* s = scale.const_data_ptr<float>();
  const index_t* idx = index.const_data_ptr<index_t>();
  out_t* o = out.data_ptr<out_t>();
  at::parallel_for(0, n, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, m)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t src = rows_at ? rows_at[i] : i, dst = out_at ? out_at[i] : i;
      if (src < 0 || dst < 0 || dst >= dst_rows) {
        continue;   // a row another call writes, or a position outside out
      }
      int64_t r = static_cast<int64_t>(idx[i]);
      r += r < 0 ? r_max : 0;   // from the end, as the gathers read it
      out_t* row = o + dst * 2 * m;
      if (r < 0 || r >= r_max || src >= src_rows) {
        std::fill(row, row + 2 * m, static_cast<out_t>(0.0f));
        continue;
      }
      const float f = s[r];
      for (int64_t j = 0; j < m; ++j) {
        unpack_int4_byte(in[src * m + j], f, row + 2 * j);
      }
    }
  });
}

} // namespace

void unpack_int4(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
                 const at::Tensor& rows_at, const at::Tensor& out_at) {
  constexpr const char* op = "unpack_int4";
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kByte && rows.is_contiguous(), op,
              ": rows must be a contiguous 2-D uint8 tensor, got ", rows.scalar_type(), " of shape ", rows.sizes());
  TORCH_CHECK(scale.dim() == 1 && scale.scalar_type() == at::kFloat && scale.is_contiguous(), op,
              ": scale must be a contiguous 1-D float32 tensor, got ", scale.scalar_type(), " of shape ",
              scale.sizes());
  // without a map, index (the entries) runs along rows, or along out
  const int64_t n = rows_at.defined() ? (out_at.defined() ? index.size(0) : out.size(0)) : rows.size(0);
  TORCH_CHECK(index.dim() == 1 && (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt) &&
                  index.is_contiguous() && index.size(0) == n,
              op, ": index must be a contiguous 1-D int32/int64 tensor of ", n, " entries, got ",
              index.scalar_type(), " of shape ", index.sizes());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"rows_at", &rows_at}, {"out_at", &out_at}}) {
    TORCH_CHECK(!t->defined() || (t->dim() == 1 && t->scalar_type() == at::kLong && t->is_contiguous() &&
                                  t->size(0) == n),
                op, ": ", name, " must be a contiguous 1-D int64 tensor of ", n, " entries, got ",
                t->scalar_type(), " of shape ", t->sizes());
  }
  const int64_t out_rows = out_at.defined() ? out.size(0) : n;
  TORCH_CHECK(out.dim() == 2 && out.size(0) == out_rows && out.size(1) == 2 * rows.size(1) && out.is_contiguous(),
              op, ": out must be a contiguous [", out_rows, ", ", 2 * rows.size(1), "] tensor, got shape ",
              out.sizes());
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kHalf ||
                  out.scalar_type() == at::kBFloat16,
              op, ": out must be float32, float16 or bfloat16, got ", out.scalar_type());
  const at::Device device = rows.device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), op, ": expected CPU or CUDA tensors, got ", device);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"scale", &scale}, {"index", &index},
                                {"out", &out}, {"rows_at", &rows_at}, {"out_at", &out_at}}) {
    TORCH_CHECK(!t->defined() || t->device() == device, op, ": ", name, " is on ", t->device(), ", rows on ", device);
  }
  if (n == 0 || rows.size(1) == 0) {
    return;
  }
  if (device.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    unpack_int4_cuda(rows, scale, index, out, rows_at, out_at);
    return;
#else
    TORCH_CHECK(false, op, ": torch_direct was built without CUDA");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), op, [&] {
    using out_t = scalar_t;
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), op, [&] {
      unpack_cpu<out_t, index_t>(rows, scale, index, out,
                                 rows_at.defined() ? rows_at.const_data_ptr<int64_t>() : nullptr,
                                 out_at.defined() ? out_at.const_data_ptr<int64_t>() : nullptr);
    });
  });
}

} // namespace torch_direct::features
