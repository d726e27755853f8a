#pragma once
// What the device's row gather (GatherCuda.cu, GatherCpu.cpp) and the GNN stack's cached gather
// (csrc/features/) share on the host side: the dtype pairs a gather casts between as it writes,
// and the table size from which a table in host memory is read as a large one. Header-only,
// with internal linkage, like Experimental.h: the device core and the GNN stack's modules (and,
// in the fork, libtorch) each keep their own copy.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace torch_direct::rows {
namespace {

// Tables of this many bytes or more in host memory are read with the index sorted and one
// block a row: the GPU translates the addresses of reads in order far faster on such tables
// (docs/gather.md).
constexpr int64_t kLargeTableBytes = int64_t(8) << 30;

// The output types of a fused cast.
[[maybe_unused]] bool is_cast_output(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// The table types of a fused cast: those, and float8 e4m3 (upcast, scaled per row).
[[maybe_unused]] bool is_cast_input(c10::ScalarType t) {
  return is_cast_output(t) || t == at::kFloat8_e4m3fn;
}

template <typename in_t, typename F>
void dispatch_cast_output(c10::ScalarType out, const char* op, F&& f) {
  switch (out) {
    case at::kFloat: f(in_t{}, float{}); break;
    case at::kHalf: f(in_t{}, c10::Half{}); break;
    case at::kBFloat16: f(in_t{}, c10::BFloat16{}); break;
    default: TORCH_CHECK(false, op, ": no output of type ", out);
  }
}

// f(in_t{}, out_t{}) for a table of type `in` gathered into an output of type `out` (any pair
// of is_cast_input and is_cast_output); anything else raises, naming op.
template <typename F>
void dispatch_cast(c10::ScalarType in, c10::ScalarType out, const char* op, F&& f) {
  switch (in) {
    case at::kFloat: dispatch_cast_output<float>(out, op, f); break;
    case at::kHalf: dispatch_cast_output<c10::Half>(out, op, f); break;
    case at::kBFloat16: dispatch_cast_output<c10::BFloat16>(out, op, f); break;
    case at::kFloat8_e4m3fn: dispatch_cast_output<c10::Float8_e4m3fn>(out, op, f); break;
    default: TORCH_CHECK(false, op, ": no table of type ", in);
  }
}

} // namespace
} // namespace torch_direct::rows
