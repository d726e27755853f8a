// Autograd through unified tensors: a unified tensor may be a leaf that
// requires grad (a parameter or an embedding table in host memory).
//
// Every op with a derivative formula that is not a factory gets a kernel at
// the unified autograd key. When nothing needs history it passes the call on
// unchanged (the unified kernel or the fallback: the fast path). Otherwise it
// stands in, for each unified operand, an alias on the compute device (rules
// R1-R3): a plain one when the operand needs no gradient, else a
// differentiable one (ComputeAlias: forward, the same bytes on the compute
// device; backward, the gradient copied into unified memory, where the engine
// accumulates it into the leaf's .grad). The op then runs, and records its
// history, on CPU or CUDA tensors through its own autograd formula, so its
// gradients are computed where it ran: no node but ComputeAlias (and the
// leaf's AccumulateGrad) sees a unified input. Views too: while history is
// recorded, a view of a unified tensor that requires grad is a view of its
// alias on the compute device (the formulas of views that compute, such as
// split's cat of its outputs' gradients, then compute there as well). An
// in-place op or out= into a unified tensor while history is recorded is
// refused. A sparse gradient (nn.Embedding with sparse=True) reaches the leaf
// as a sparse COO unified tensor, which optimizers apply to the table in
// place through the fallback.
//
// Factories (_to_copy included) keep PyTorch's own autograd kernel: their
// formulas send gradients back to the device their input came from.

#include "Claims.h"
#include "Placement.h"
#include "UnifiedKernels.h"

#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/util/irange.h>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <string>

namespace at::native::unified {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ComputeAlias : public torch::autograd::Function<ComputeAlias> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& u, c10::Device target) {
    at::Tensor alias = alias_as(u, target);
    // One version counter for both: an in-place change of the unified tensor
    // between forward and backward is caught as for any saved tensor.
    alias.unsafeGetTensorImpl()->set_version_counter(u.unsafeGetTensorImpl()->version_counter());
    return alias;
  }

  static variable_list backward(AutogradContext*, variable_list grads) {
    const at::Tensor& g = grads[0];
    if (!g.defined()) {
      return {g, at::Tensor()};
    }
    if (g.layout() == at::kSparse) {
      // nn.Embedding(sparse=True): the gradient's rows, in unified memory.
      return {sparse_to_unified(g), at::Tensor()};
    }
    return {g.to(c10::unified::unified_device()), at::Tensor()};
  }
};

// Ops whose autograd kernel is about autograd itself (leaving it, forward-AD
// duals) or checks the tensor's own history (resizing, set_: a leaf given
// new sizes gets a new gradient accumulator there), not a formula.
bool keeps_its_own_autograd(const std::string& name) {
  return name_in(name, {"detach", "detach_", "alias", "lift", "lift_fresh", "_fw_primal", "_make_dual",
                        "_unpack_dual", "resize_", "resize_as_", "set_"});
}

bool needs_history(const at::Tensor& t) {
  return t.requires_grad() || t._fw_grad(/*level=*/0).defined();
}

// The alias of unified operand `t` on `target`: differentiable when `t` needs history.
at::Tensor stand_in(const at::Tensor& t, c10::Device target) {
  return needs_history(t) ? ComputeAlias::apply(t, target) : alias_as(t, target);
}

// The tensors among the arguments of the boxed call of `op` on `stack`, in order.
std::vector<at::Tensor> tensor_operands(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto num_args = op.schema().arguments().size();
  std::vector<at::Tensor> operands;
  for (const auto i : c10::irange(num_args)) {
    collect_tensors(stack[stack.size() - num_args + i], operands);
  }
  return operands;
}

void unified_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
  const auto num_args = op.schema().arguments().size();
  const auto args_begin = stack->size() - num_args;
  const std::vector<at::Tensor> operands = tensor_operands(op, *stack);
  bool record = false;
  if (at::GradMode::is_enabled()) {
    for (const auto& t : operands) {
      record = record || (t.defined() && needs_history(t));
    }
  }
  if (!record) {
    // No history to record: the op's autograd kernel would only pass it on,
    // to the unified kernel or the fallback.
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    return;
  }
  // History of an in-place op or out= would be attached to the unified
  // destination itself, whose formulas compute gradients on the compute device
  // (and composites that copy into a new tensor of their input's device, such
  // as circular padding, would even sum them wrongly).
  const auto& arguments = op.schema().arguments();
  for (const auto i : c10::irange(num_args)) {
    if (!is_write(arguments[i].alias_info())) {
      continue;
    }
    std::vector<at::Tensor> written;
    collect_tensors((*stack)[args_begin + i], written);
    for (const auto& t : written) {
      TORCH_CHECK(!is_unified(t), "torch_direct: ", op.schema().name(), " writes into a unified tensor in "
                  "place while autograd records history through it (an operand requires grad); autograd "
                  "history of in-place ops and out= on unified tensors is not supported. Run it under "
                  "torch.no_grad(), or write into a CPU or CUDA tensor.");
    }
  }
  const c10::Device target = compute_device(operands);
  if (target.is_cuda()) {
    check_gather_indices(op, *stack, args_begin);
  }
  for (const auto i : c10::irange(num_args)) {
    auto& v = (*stack)[args_begin + i];
    v = map_unified(v, [&](const at::Tensor& t) { return stand_in(t, target); });
  }
  // From the top: the operands are CPU/CUDA tensors now, so the op's own
  // autograd kernel records its history and its CPU/CUDA kernel computes.
  op.callBoxed(stack);
}

} // namespace

int64_t claim_autograd_ops(c10::DispatchKey autograd_key, c10::DispatchKey backend_key) {
  using K = c10::DispatchKey;
  const int64_t claimed = claim_once(
      autograd_key, c10::BoxedKernel::makeFromFunction<&unified_autograd>(),
      [backend_key](const c10::OperatorHandle& op, const std::string& name) {
        // Ops with a derivative formula (or a composite whose decomposition a
        // direct unified registration hides from autograd: claim_structured_ops'
        // by name), tensor operands, and no device argument (factories,
        // _to_copy: their outputs' device is the one asked for, and their
        // formulas send gradients back to the device of their input).
        const auto& schema = op.schema();
        const bool derivative = op.hasKernelForDispatchKey(K::Autograd) ||
                                (op.hasKernelForDispatchKey(backend_key) &&
                                 op.hasKernelForDispatchKey(K::CompositeImplicitAutograd));
        return derivative && !keeps_its_own_autograd(name) &&
               has_argument_of_kind(schema, c10::TypeKind::TensorType) &&
               !has_argument_of_kind(schema, c10::TypeKind::DeviceObjType);
      });
  set_autograd_through_unified(true);
  return claimed;
}

// add.Tensor where autograd's engine sums two gradients of one unified leaf
// before its AccumulateGrad (`old_var + var`): two lookups into one sparse
// unified embedding table, or a Python autograd.Function whose backward
// returns a unified tensor it also keeps. By rule R3 the sum would be on the
// compute device, and the leaf's .grad with it (on a GPU the engine then
// stops at an internal assert: the leaf's node, whose input is unified, has
// no stream on that device). So when every tensor operand is unified, the
// result is copied into unified memory: always for a sparse operand (only
// gradients are sparse unified tensors), and for dense ones while the engine
// runs a backward with grad mode off, which is where it sums gradients.
void unified_sum(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const std::vector<at::Tensor> operands = tensor_operands(op, *stack);
  bool all_unified = !operands.empty();
  bool sparse = false;
  for (const auto& t : operands) {
    all_unified = all_unified && t.defined() && is_unified(t);
    sparse = sparse || (t.defined() && t.layout() == at::kSparse);
  }
  const bool summing_gradients = all_unified &&
      (sparse || (!at::GradMode::is_enabled() && torch::autograd::get_current_graph_task_id() != -1));
  unified_fallback(op, ks, stack);
  if (!summing_gradients || !stack->back().isTensor()) {
    return;
  }
  at::Tensor result = stack->back().toTensor();
  if (is_unified(result)) {
    return;
  }
  stack->back() = result.layout() == at::kSparse ? sparse_to_unified(result)
                                                 : result.to(c10::unified::unified_device());
}

int64_t claim_sparse_ops(c10::DispatchKey sparse_key) {
  using K = c10::DispatchKey;
  return claim_once(sparse_key, c10::BoxedKernel::makeFromFunction<&unified_fallback>(),
                    [](const c10::OperatorHandle& op, const std::string&) {
                      return op.hasKernelForDispatchKey(K::CompositeExplicitAutograd) &&
                             (op.hasKernelForDispatchKey(K::SparseCPU) ||
                              op.hasKernelForDispatchKey(K::SparseCUDA));
                    });
}

} // namespace at::native::unified

// A sparse CPU or CUDA operand beside a unified one (torch.sparse.sampled_addmm
// of a CSR mask and unified dense matrices) dispatches to the sparse keys of
// the unified backend; unified tensors themselves are dense, and the fallback
// aliases only them.
TORCH_LIBRARY_IMPL(_, UNIFIED_SPARSE_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&at::native::unified::unified_fallback>());
}

TORCH_LIBRARY_IMPL(_, UNIFIED_SPARSE_CSR_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&at::native::unified::unified_fallback>());
}

// Sparse COO unified tensors (the sparse gradient of a unified embedding
// table): building one and reading its parts use PyTorch's own sparse
// kernels, which touch no data; everything else computes through the
// fallback's aliases (alias_as).
TORCH_LIBRARY_IMPL(aten, UNIFIED_SPARSE_KEY, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
  m.impl("add.Tensor", torch::CppFunction::makeFromBoxedFunction<&at::native::unified::unified_sum>());
}

// Dense unified operands: autograd's sum of two unified gradients (unified_sum).
TORCH_LIBRARY_IMPL(aten, UNIFIED_DENSE_KEY, m) {
  m.impl("add.Tensor", torch::CppFunction::makeFromBoxedFunction<&at::native::unified::unified_sum>());
}
