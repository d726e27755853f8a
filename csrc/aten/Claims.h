#pragma once
// Registering one boxed kernel for a chosen set of aten ops, once per key
// (Fallback.cpp's claim_structured_ops, Autograd.cpp's claim_autograd_ops).

#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

#include <cstdint>
#include <functional>
#include <string>

namespace at::native::unified {

// Registers `kernel` under `key` for every overload of every aten op that
// `pick(op, name)` selects (name without "aten::"), all at the first call for
// `key`; later calls for the same key register nothing and return the first
// call's count.
int64_t claim_once(c10::DispatchKey key, const c10::BoxedKernel& kernel,
                   const std::function<bool(const c10::OperatorHandle&, const std::string&)>& pick);

} // namespace at::native::unified
