#pragma once
// f(in_t{}, out_t{}) for the (table, output) dtype pairs a cached gather serves: float32,
// float16 and bfloat16 tables into any of the three, float8 e4m3 tables (with their row
// scales) into any of the three. Shared by the CPU and CUDA passes.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

namespace torch_direct::features {

inline bool is_output_type(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline bool is_table_type(c10::ScalarType t) {
  return is_output_type(t) || t == at::kFloat8_e4m3fn;
}

template <typename in_t, typename F>
void dispatch_out(c10::ScalarType out, F&& f) {
  switch (out) {
    case at::kFloat: f(in_t{}, float{}); break;
    case at::kHalf: f(in_t{}, c10::Half{}); break;
    case at::kBFloat16: f(in_t{}, c10::BFloat16{}); break;
    default: TORCH_CHECK(false, "cached_gather: no output of type ", out);
  }
}

template <typename F>
void dispatch_types(c10::ScalarType in, c10::ScalarType out, F&& f) {
  switch (in) {
    case at::kFloat: dispatch_out<float>(out, f); break;
    case at::kHalf: dispatch_out<c10::Half>(out, f); break;
    case at::kBFloat16: dispatch_out<c10::BFloat16>(out, f); break;
    case at::kFloat8_e4m3fn: dispatch_out<c10::Float8_e4m3fn>(out, f); break;
    default: TORCH_CHECK(false, "cached_gather: no table of type ", in);
  }
}

} // namespace torch_direct::features
