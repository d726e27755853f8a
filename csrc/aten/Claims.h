#pragma once
// What the boxed kernels of Fallback.cpp (claim_structured_ops) and
// Autograd.cpp (claim_autograd_ops) share: registering one kernel for a chosen
// set of aten ops once per key, and rewriting the unified tensors of a boxed
// argument.

#include <ATen/core/Tensor.h>
#include <ATen/core/alias_info.h>
#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace at::native::unified {

// Registers `kernel` under `key` for every overload of every aten op that
// `pick(op, name)` selects (name without "aten::"), all at the first call for
// `key`; later calls for the same key register nothing and return the first
// call's count.
int64_t claim_once(c10::DispatchKey key, const c10::BoxedKernel& kernel,
                   const std::function<bool(const c10::OperatorHandle&, const std::string&)>& pick);

// `v` with each unified tensor in it (a Tensor, a Tensor[] or a Tensor?[],
// such as the indices of index.Tensor) replaced by `f(tensor)`, in argument
// order; `v` itself when it holds none.
c10::IValue map_unified(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f);

// Whether an argument of `schema` is of `kind`, alone, optional or in a list.
bool has_argument_of_kind(const c10::FunctionSchema& schema, c10::TypeKind kind);

// Whether an argument or return annotated `a` is written (Tensor(a!), or a
// list of them: Tensor(a!)[]).
bool is_write(const c10::AliasInfo* a);

// Whether `name` is one of `names`.
bool name_in(const std::string& name, std::initializer_list<const char*> names);

} // namespace at::native::unified
