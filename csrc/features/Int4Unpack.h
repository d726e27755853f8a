#pragma once
// The rows of a 4-bit table (torch_direct.quantize_rows_int4) after a gather moved them as
// bytes: for row i of `rows` ([n, m] uint8) and r = index[i],
//   out[i, 2j]     = ((rows[i, j] & 15) - 8) * scale[r]
//   out[i, 2j + 1] = ((rows[i, j] >> 4) - 8) * scale[r]
// computed in float32 and cast to out's dtype (float32, float16 or bfloat16): the same
// arithmetic, so the same values, as torch_direct.dequantize_rows_int4's ATen ops, in one pass
// that reads each row's scale through the index instead of gathering the scales first. A
// negative r counts from the end of scale (r + scale.size(0)), as the gathers read a negative
// index; a row whose r still lies outside scale is written as zeros (the feature stores check
// their indices first).
//
// Two optional maps (int64, one entry per entry of index) move the rows as they are unpacked,
// so that a cache's hits and a batch's misses need no gather or scatter of their bytes first:
//   rows_at: entry i reads row rows_at[i] of rows (rows may then hold any number of rows, a
//            cache's); rows_at[i] < 0 leaves out row i unwritten (a miss, written by another
//            call), rows_at[i] >= rows.size(0) writes zeros;
//   out_at:  entry i writes row out_at[i] of out (out may then hold any number of rows, a
//            batch's); an entry outside [0, out.size(0)) writes nothing.

#include <ATen/ATen.h>

#include <c10/macros/Macros.h>

#include <cstdint>

namespace torch_direct::features {

// One packed byte's two values, low four bits first.
template <typename out_t>
C10_HOST_DEVICE inline void unpack_int4_byte(uint8_t b, float s, out_t* o) {
  o[0] = static_cast<out_t>((static_cast<float>(b & 15) - 8.0f) * s);
  o[1] = static_cast<out_t>((static_cast<float>(b >> 4) - 8.0f) * s);
}

// rows, scale, index and out on the CPU (ATen's intra-op threads) or on one CUDA device (the
// current stream, no wait); checked first (c10::Error naming the argument).
// rows_at and out_at undefined: no map.
void unpack_int4(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
                 const at::Tensor& rows_at = at::Tensor(), const at::Tensor& out_at = at::Tensor());

#ifdef TORCH_DIRECT_WITH_CUDA
void unpack_int4_cuda(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out,
                      const at::Tensor& rows_at, const at::Tensor& out_at);
#endif

} // namespace torch_direct::features
