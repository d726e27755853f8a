"""PyTorch's own device-generic machinery (common_device_type's PrivateUse1
support and OpInfo samples) run on the unified device.

For each op, every sample input is built on the unified device by the OpInfo
itself, run there (rules R1-R6 decide where it computes), and compared with
the same sample run on the CPU.
"""

import torch

import torch_direct  # noqa: F401  (before common_device_type, which lists the device types it tests)
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

OPS = {
    "abs", "add", "addmm", "amax", "argmax", "cat", "clamp", "cumsum", "div", "exp",
    "flatten", "gather", "index_select", "log_softmax", "masked_fill", "matmul", "max",
    "mean", "mul", "narrow", "neg", "nn.functional.embedding", "nn.functional.linear",
    "nn.functional.relu", "permute", "pow", "reshape", "sigmoid", "softmax", "sort",
    "split", "sqrt", "stack", "sub", "sum", "t", "take", "topk", "transpose", "where",
}
SELECTED = [op for op in op_db if op.name in OPS and op.variant_test_name == ""]


def callable_of(op):
    """The OpInfo's function. PyG replaces ``torch.index_select`` with a wrapper
    that refuses 0-dim inputs on every device; when PyG was imported before
    op_db was built (by another test module), test torch's own function."""
    fn = op.op
    if getattr(fn, "__module__", "").startswith("torch_geometric"):
        return getattr(torch._C._VariableFunctions, fn.__name__.replace("_new_", ""))
    return op


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


class TestUnifiedOpInfo(TestCase):
    @ops(SELECTED, allowed_dtypes=(torch.float32,))
    def test_matches_cpu(self, device, dtype, op):
        self.assertEqual(torch.device(device).type, "unified")
        fn = callable_of(op)
        n = 0
        for sample in op.sample_inputs(device, dtype, requires_grad=False):
            args = (sample.input, *sample.args)
            out = fn(*args, **sample.kwargs)
            ref = fn(*to_cpu(args), **to_cpu(sample.kwargs))
            self.assertEqual(to_cpu(out), ref, msg=f"{op.name}: sample {n}")
            n += 1
        self.assertGreater(n, 0)


instantiate_device_type_tests(TestUnifiedOpInfo, globals(), only_for="privateuse1")

if __name__ == "__main__":
    run_tests()
