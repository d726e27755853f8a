// The 4-bit rows' unpacking on a GPU (Int4Unpack.h). Each thread takes a run of kBytes packed
// bytes of one row (one 8-byte load) and writes their 2 * kBytes values with 16-byte stores, so
// that a row's runs lie in adjacent threads and a warp reads and writes whole lines; rows whose
// width or addresses do not allow it take runs of one byte. Each run reads its row's scale
// through the index, and finds its row with 32-bit division where the runs' count allows (where
// one thread a byte, each with a 64-bit division, made eight times the threads' work for the
// same bytes).

#include "Int4Unpack.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

namespace torch_direct::features {

namespace {

constexpr int kThreads = 256;
constexpr int kBytes = 8;   // a vector run: one 8-byte load, 16 values

// 2 * V values of one run, written with 16-byte stores where V bytes make whole ones
template <int V, typename out_t>
__device__ inline void store_run(out_t* o, const out_t (&v)[2 * V]) {
  if constexpr (2 * V * sizeof(out_t) % 16 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(v);
#pragma unroll
    for (int q = 0; q < static_cast<int>(2 * V * sizeof(out_t) / 16); ++q) {
      reinterpret_cast<uint4*>(o)[q] = src[q];
    }
  } else {
#pragma unroll
    for (int q = 0; q < 2 * V; ++q) {
      o[q] = v[q];
    }
  }
}

// runs of V bytes (V = kBytes: rows of a multiple of 8 bytes, 8-byte aligned rows, 16-byte
// aligned output; V = 1: any); count_t: 32-bit when the runs' count fits. Entry i of the index
// reads row rows_at[i] (null: i) and writes row out_at[i] (null: i), as Int4Unpack.h says.
template <int V, typename count_t, typename out_t, typename index_t>
__global__ void unpack_kernel(const uint8_t* __restrict__ rows, const float* __restrict__ scale,
                              const index_t* __restrict__ index, out_t* __restrict__ out, count_t runs,
                              count_t runs_per_row, int64_t r_max, const int64_t* __restrict__ rows_at,
                              const int64_t* __restrict__ out_at, int64_t src_rows, int64_t dst_rows) {
  for (count_t k = blockIdx.x * static_cast<count_t>(blockDim.x) + threadIdx.x; k < runs;
       k += static_cast<count_t>(gridDim.x) * blockDim.x) {
    const count_t i = k / runs_per_row, q0 = k - i * runs_per_row;
    const int64_t src = rows_at ? rows_at[i] : static_cast<int64_t>(i);
    const int64_t dst = out_at ? out_at[i] : static_cast<int64_t>(i);
    if (src < 0 || dst < 0 || dst >= dst_rows) {
      continue;   // a row another call writes, or a position outside out
    }
    int64_t r = static_cast<int64_t>(index[i]);
    r += r < 0 ? r_max : 0;   // from the end, as the gathers read it
    alignas(16) out_t v[2 * V];
    if (r < 0 || r >= r_max || src >= src_rows) {
#pragma unroll
      for (int q = 0; q < 2 * V; ++q) {
        v[q] = static_cast<out_t>(0.0f);
      }
    } else {
      const float s = scale[r];
      const int64_t at = src * static_cast<int64_t>(runs_per_row) + q0;   // the run, in runs of V bytes
      uint8_t b[V];
      if constexpr (V == kBytes) {
        const uint2 w = reinterpret_cast<const uint2*>(rows)[at];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          b[q] = static_cast<uint8_t>(w.x >> (8 * q));
          b[q + 4] = static_cast<uint8_t>(w.y >> (8 * q));
        }
      } else {
        b[0] = rows[at];
      }
#pragma unroll
      for (int q = 0; q < V; ++q) {
        unpack_int4_byte(b[q], s, v + 2 * q);
      }
    }
    store_run<V>(out + 2 * V * (dst * static_cast<int64_t>(runs_per_row) + q0), v);
  }
}

template <int V, typename out_t, typename index_t>
void launch(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
            const int64_t* rows_at, const int64_t* out_at, int64_t n, cudaStream_t stream, int64_t blocks_max) {
  const int64_t per_row = rows.size(1) / V, runs = n * per_row;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((runs + kThreads - 1) / kThreads, blocks_max));
  const uint8_t* in = rows.const_data_ptr<uint8_t>();
  const float* s = scale.const_data_ptr<float>();
  const index_t* idx = index.const_data_ptr<index_t>();
  out_t* o = out.data_ptr<out_t>();
  // the grid-stride loop's last step stays within 32 bits too
  if (runs + blocks * kThreads < (int64_t{1} << 31)) {
    unpack_kernel<V, uint32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in, s, idx, o, static_cast<uint32_t>(runs), static_cast<uint32_t>(per_row), scale.size(0), rows_at, out_at,
        rows.size(0), out.size(0));
  } else {
    unpack_kernel<V, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in, s, idx, o, runs, per_row, scale.size(0), rows_at, out_at, rows.size(0), out.size(0));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

void unpack_int4_cuda(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
                      const at::Tensor& rows_at, const at::Tensor& out_at) {
  const c10::cuda::CUDAGuard guard(rows.device());
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rows.device().index()));
  const int64_t blocks_max = static_cast<int64_t>(sms) * (2048 / kThreads);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(rows.device().index());
  const bool vector = rows.size(1) % kBytes == 0 && reinterpret_cast<uintptr_t>(rows.const_data_ptr()) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  const int64_t* src_map = rows_at.defined() ? rows_at.const_data_ptr<int64_t>() : nullptr;
  const int64_t* dst_map = out_at.defined() ? out_at.const_data_ptr<int64_t>() : nullptr;
  const int64_t n = index.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "unpack_int4_cuda", [&] {
    using out_t = scalar_t;
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "unpack_int4_cuda", [&] {
      if (vector) {
        launch<kBytes, out_t, index_t>(rows, scale, index, out, src_map, dst_map, n, stream, blocks_max);
      } else {
        launch<1, out_t, index_t>(rows, scale, index, out, src_map, dst_map, n, stream, blocks_max);
      }
    });
  });
}

} // namespace torch_direct::features
