// The boxed fallback: every ATen op without a dedicated unified kernel gets the
// placement rules R1-R6 by running its CPU or CUDA kernel on aliases of the
// unified operands (same bytes, no copy).

#include "Claims.h"
#include "Placement.h"
#include "UnifiedKernels.h"

#include "../../c10_allocator/Text.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/irange.h>

#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace at::native::unified {
namespace {

bool same_set(const c10::AliasInfo* x, const c10::AliasInfo* y) {
  if (x == nullptr || y == nullptr) {
    return false;
  }
  if (!x->containedTypes().empty() || !y->containedTypes().empty()) {
    // Tensor(a)[]: compare the element annotations too.
    const auto* xe = x->containedTypes().empty() ? x : &x->containedTypes()[0];
    const auto* ye = y->containedTypes().empty() ? y : &y->containedTypes()[0];
    return xe->beforeSets() == ye->beforeSets() || x->beforeSets() == y->beforeSets();
  }
  return x->beforeSets() == y->beforeSets();
}

// Replace each unified tensor inside `v` by an alias on `target`; remember the
// originals (in order) so that outputs can be mapped back.
c10::IValue substitute(const c10::IValue& v, c10::Device target, bool resizable,
                       std::vector<at::Tensor>& originals,
                       std::vector<at::Tensor>& aliases) {
  if (v.isDevice() && v.toDevice().type() == c10::unified::kUnifiedDeviceType) {
    return target;
  }
  return map_unified(v, [&](const at::Tensor& t) {
    at::Tensor a = alias_as(t, target, resizable);
    originals.push_back(t);
    aliases.push_back(a);
    return a;
  });
}

} // namespace

c10::IValue map_unified(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  auto one = [&](const at::Tensor& t) { return is_unified(t) ? f(t) : t; };
  if (v.isTensor()) {
    return one(v.toTensor());
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) {
      l.push_back(one(t));
    }
    return l;
  }
  if (v.isList()) {
    const auto& ref = v.toListRef();
    bool any = false;
    for (const auto& e : ref) {
      any = any || (e.isTensor() && is_unified(e.toTensor()));
    }
    if (!any) {
      return v;
    }
    c10::List<std::optional<at::Tensor>> l;
    for (const auto& e : ref) {
      if (e.isTensor()) {
        l.push_back(one(e.toTensor()));
      } else {
        l.push_back(std::nullopt);
      }
    }
    return l;
  }
  return v;
}

bool is_write(const c10::AliasInfo* a) {
  if (a == nullptr) {
    return false;
  }
  if (a->isWrite()) {
    return true;
  }
  for (const auto& c : a->containedTypes()) {
    if (c.isWrite()) {
      return true;
    }
  }
  return false;
}

bool name_in(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) {
      return true;
    }
  }
  return false;
}

void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        out.push_back(e.toTensor());
      }
    }
  }
}

namespace {

void check_range(const at::Tensor& index, int64_t size, const char* op,
                 bool allow_negative = true) {
  if (!index.defined() || index.numel() == 0 || index.scalar_type() == at::kBool ||
      index.scalar_type() == at::kByte) {
    return;
  }
  // One reduction and one sync: dedicated gather kernels check on the fly.
  auto [lo, hi] = at::aminmax(index);
  check_index_bounds(lo.item<int64_t>(), hi.item<int64_t>(), size, op, allow_negative);
}

} // namespace

// Invariant: no GPU kernel reads host memory through an unchecked index. CPU
// kernels check their own indices; GPU kernels would only assert on device.
void check_gather_indices(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          size_t args_begin) {
  const auto& name = op.schema().name();
  auto arg = [&](size_t i) -> const c10::IValue& { return stack[args_begin + i]; };
  if (name == "aten::index_select" && arg(0).isTensor() && is_unified(arg(0).toTensor())) {
    const auto& self = arg(0).toTensor();
    const int64_t dim = c10::maybe_wrap_dim(arg(1).toInt(), std::max<int64_t>(self.dim(), 1));
    check_range(arg(2).toTensor(), self.dim() == 0 ? 1 : self.size(dim), "index_select", false);
  } else if (name == "aten::embedding" && is_unified(arg(0).toTensor())) {
    check_range(arg(1).toTensor(), arg(0).toTensor().size(0), "embedding", false);
  } else if (name == "aten::gather" && is_unified(arg(0).toTensor())) {
    const auto& self = arg(0).toTensor();
    const int64_t dim = c10::maybe_wrap_dim(arg(1).toInt(), std::max<int64_t>(self.dim(), 1));
    check_range(arg(2).toTensor(), self.dim() == 0 ? 1 : self.size(dim), "gather", false);
  } else if (name == "aten::take" && is_unified(arg(0).toTensor())) {
    check_range(arg(1).toTensor(), arg(0).toTensor().numel(), "take");
  } else if ((name == "aten::index" || name == "aten::_index_put_impl_" || name == "aten::index_put" ||
              name == "aten::index_put_") && arg(0).isTensor() && is_unified(arg(0).toTensor())) {
    const auto& self = arg(0).toTensor();
    int64_t d = 0;
    for (const c10::IValue& e : arg(1).toListRef()) {
      if (e.isTensor()) {
        const auto& t = e.toTensor();
        if (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte) {
          d += t.dim();
          continue;
        }
        TORCH_CHECK_INDEX(d < self.dim(), "too many indices for a unified tensor of dimension ",
                          c10::unified::num(self.dim()));
        check_range(t, self.size(d), "index");
      }
      d += 1;
    }
  }
}

void unified_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                      torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto args_begin = stack->size() - num_args;

  std::vector<at::Tensor> operands;
  bool unified_device_arg = false;
  for (const auto i : c10::irange(num_args)) {
    const auto& v = (*stack)[args_begin + i];
    collect_tensors(v, operands);
    if (v.isDevice() && v.toDevice().type() == c10::unified::kUnifiedDeviceType) {
      unified_device_arg = true;
    }
  }
  for (const auto& t : operands) {
    if (is_unified(t)) {
      check_no_grad(t, schema.name().c_str());
    }
  }
  const c10::Device target = compute_device(operands);
  if (target.is_cuda()) {
    check_gather_indices(op, *stack, args_begin);
  }

  // Per argument: the unified originals and their aliases.
  std::vector<std::vector<at::Tensor>> originals(num_args), aliases(num_args);
  for (const auto i : c10::irange(num_args)) {
    auto& v = (*stack)[args_begin + i];
    const bool written = is_write(schema.arguments()[i].alias_info());
    v = substitute(v, target, written, originals[i], aliases[i]);
  }

  op.callBoxed(stack);

  const auto& returns = schema.returns();
  const auto rets_begin = stack->size() - returns.size();
  for (const auto r : c10::irange(returns.size())) {
    auto& out = (*stack)[rets_begin + r];
    const c10::AliasInfo* rinfo = returns[r].alias_info();
    std::optional<size_t> source;
    if (rinfo != nullptr) {
      for (const auto i : c10::irange(num_args)) {
        if (same_set(rinfo, schema.arguments()[i].alias_info())) {
          source = i;
          break;
        }
      }
    }
    if (source.has_value() && !originals[*source].empty()) {
      const auto& orig = originals[*source];
      const auto& als = aliases[*source];
      if (is_write(rinfo)) {
        // R4: in-place / out=: the result is the unified destination itself.
        for (const auto k : c10::irange(orig.size())) {
          write_back(orig[k], als[k]);
        }
        if (out.isTensor()) {
          out = orig[0];
        } else if (out.isTensorList()) {
          c10::List<at::Tensor> l;
          for (const auto& t : orig) {
            l.push_back(t);
          }
          out = l;
        }
      } else if (out.isTensor()) {
        out = rewrap_view(orig[0], out.toTensor()); // R6
      } else if (out.isTensorList()) {
        c10::List<at::Tensor> l;
        for (const at::Tensor& t : out.toTensorList()) {
          l.push_back(rewrap_view(orig[0], t));
        }
        out = l;
      }
      continue;
    }
    if (unified_device_arg) {
      // A factory asked for the unified device: place its result there.
      if (out.isTensor() && out.toTensor().defined()) {
        out = out.toTensor().to(c10::unified::unified_device());
      }
    }
  }
}

namespace {

// Ops that must reach the fallback although a kernel unified tensors would
// inherit exists. Three kinds:
// - structured ops: their CompositeExplicitAutogradNonFunctional kernel
//   allocates the output on self's device and calls the out= variant, which
//   for unified operands would put results in unified memory and reject
//   CPU/CUDA operands, against rules R1-R4;
// - ops whose CompositeExplicitAutograd kernel is the generic version for
//   backends without their own (math_addr, math_native_layer_norm, ...) while
//   the CPU or CUDA has a dedicated kernel: the generic version computes
//   differently from the device the rules pick (bfloat16 accumulation);
// - mixed_device_op, by name: their own kernels refuse what R1-R3 allow before
//   the fallback could place them.
// A direct registration wins over an alias-key kernel, and, for a
// CompositeImplicitAutograd op, makes its autograd key pass on to it.
bool has_out_argument(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments()) {
    if (a.kwarg_only() && a.alias_info() != nullptr && a.alias_info()->isWrite()) {
      return true;
    }
  }
  return false;
}

// A functional op whose composite allocates its result like `self` and calls
// an out= overload the CPU or CUDA implement (abs, logical_not, mean,
// nan_to_num, ...): on a unified input its result would land in unified
// memory, while ops beside it put theirs on the compute device (R1-R3), and
// code that compares the two devices (torch._refs) fails.
bool composite_over_device_out(const c10::OperatorHandle& op) {
  const auto& name = op.schema().operator_name();
  if (!name.overload_name.empty() || has_out_argument(op.schema())) {
    return false;
  }
  const auto& args = op.schema().arguments();
  if (args.empty() || !args[0].type()->isSubtypeOf(*c10::TensorType::get())) {
    return false;  // a factory: the fallback places its result as asked already
  }
  auto out = c10::Dispatcher::singleton().findOp({name.name, "out"});
  return out.has_value() && (out->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                             out->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
}

bool must_reach_fallback(const c10::OperatorHandle& op) {
  using K = c10::DispatchKey;
  if (op.hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional)) {
    return true;
  }
  if (!op.hasKernelForDispatchKey(K::CompositeExplicitAutograd)) {
    return false;
  }
  // An out= composite computes its functional op and then requires `out` on
  // the device of that result (the generated *_copy.out and friends): on
  // aliases from the fallback, both are on the compute device.
  return op.hasKernelForDispatchKey(K::CPU) || op.hasKernelForDispatchKey(K::CUDA) ||
         has_out_argument(op.schema()) || composite_over_device_out(op);
}

// _convolution sends a PrivateUse1 (or Unified) input to
// convolution_overrideable, a backend hook with no unified kernel; the RNN
// composites send it to fused kernels only CUDA has; the others compare their
// operands' devices themselves, so a CPU index, matrix, tolerance or window
// beside a unified tensor (R2) fails those checks.
bool mixed_device_op(const std::string& name) {
  return name_in(name, {"convolution", "_convolution", "convolution_backward",
                        "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
                        "rnn_relu_cell", "take_along_dim", "cholesky_solve", "linalg_matrix_rank", "stft"});
}

} // namespace

bool has_argument_of_kind(const c10::FunctionSchema& schema, c10::TypeKind kind) {
  for (const auto& a : schema.arguments()) {
    c10::TypePtr t = a.type();
    if (const auto opt = t->cast<c10::OptionalType>()) {
      t = opt->getElementType();
    }
    if (const auto list = t->cast<c10::ListType>()) {
      t = list->getElementType();
      if (const auto opt = t->cast<c10::OptionalType>()) {
        t = opt->getElementType();
      }
    }
    if (t->kind() == kind) {
      return true;
    }
  }
  return false;
}

int64_t claim_once(c10::DispatchKey key, const c10::BoxedKernel& kernel,
                   const std::function<bool(const c10::OperatorHandle&, const std::string&)>& pick) {
  static std::mutex m;
  static std::map<c10::DispatchKey, std::pair<std::unique_ptr<torch::Library>, int64_t>> done;
  std::lock_guard<std::mutex> g(m);
  auto it = done.find(key);
  if (it != done.end()) {
    return it->second.second;
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  int64_t claimed = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    auto op = dispatcher.findOp(name);
    const std::string base = name.name.substr(6);
    if (!op.has_value() || !op->hasSchema() || op->hasKernelForDispatchKey(key) || !pick(*op, base)) {
      continue;
    }
    std::string full = base;
    if (!name.overload_name.empty()) {
      full += "." + name.overload_name;
    }
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedKernel(kernel));
    claimed += 1;
  }
  done.emplace(key, std::make_pair(std::move(lib), claimed));
  return claimed;
}

// Routes the ops must_reach_fallback and mixed_device_op name to the fallback
// for `key`. Called once every op is registered (module init of the
// extension; torch._C's init on the fork); answers how many it claimed.
int64_t claim_structured_ops(c10::DispatchKey key) {
  return claim_once(key, c10::BoxedKernel::makeFromFunction<&unified_fallback>(),
                    [](const c10::OperatorHandle& op, const std::string& name) {
                      // Not a factory of `self` (new_empty_strided): its result
                      // goes where its device argument, or self's device, says;
                      // through the fallback it would follow self's alias instead.
                      const auto& schema = op.schema();
                      const bool factory = has_argument_of_kind(schema, c10::TypeKind::DeviceObjType) &&
                                           !has_out_argument(schema);
                      return (must_reach_fallback(op) || mixed_device_op(name)) && !factory;
                    });
}

} // namespace at::native::unified
