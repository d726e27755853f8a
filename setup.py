"""Build the torch_direct extension against the installed PyTorch.

CUDA is used when the installed torch has CUDA and nvcc is found (override
with TORCH_DIRECT_CUDA=0/1); otherwise the extension is host-only and unified
tensors are plain host memory. Knobs: TORCH_CUDA_ARCH_LIST (default "9.0"),
MAX_JOBS, TORCH_DIRECT_DEBUG=1 (-O0 -g).

    pip install --no-build-isolation -e .
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import gen_registrations  # noqa: E402


def _find_cuda_home() -> None:
    """Point CUDA_HOME at the toolkit that holds the nvcc on PATH.

    PyTorch guesses CUDA_HOME from nvcc's location; a wrapper script such as
    /usr/local/bin/nvcc would make it guess /usr/local, which has no headers.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if not candidate:
            continue
        home = Path(os.path.realpath(candidate)).parent.parent
        if (home / "include" / "cuda_runtime.h").exists():
            os.environ["CUDA_HOME"] = str(home)
            return
        try:  # a shell wrapper: `exec /path/to/cuda/bin/nvcc "$@"`
            text = Path(candidate).read_text(errors="ignore")[:4096]
        except OSError:
            continue
        for word in text.split():
            if word.endswith("/bin/nvcc"):
                home = Path(word).parent.parent
                if (home / "include" / "cuda_runtime.h").exists():
                    os.environ["CUDA_HOME"] = str(home)
                    return


_find_cuda_home()

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - setup needs torch
    sys.exit("torch_direct builds against an installed PyTorch: pip install torch first, "
             "then pip install --no-build-isolation .")


def native_unified() -> bool:
    """A torch wheel built from this project's fork has the device natively.

    Then the device needs nothing compiled (the same check as
    torch_direct._backend.native_unified_device); only the GNN stack's samplers are built.
    """
    if not hasattr(torch._C, "_unified"):
        return False
    try:
        native = torch.device("unified").type == "unified"
    except (RuntimeError, TypeError, ValueError):
        return False
    name = getattr(torch._C, "_get_privateuse1_backend_name", lambda: "privateuseone")()
    return native and name != "unified"


def want_cuda() -> bool:
    env = os.environ.get("TORCH_DIRECT_CUDA")
    if env is not None:
        return env not in ("0", "false", "no", "")
    has_nvcc = cpp_extension.CUDA_HOME is not None or shutil.which("nvcc") is not None
    return torch.version.cuda is not None and has_nvcc


def sources(cuda: bool, folders=("c10_allocator", "csrc")) -> list[str]:
    """Every .cpp under ``folders``; every .cu too when building with CUDA.

    Code that calls into a .cu file guards the call with TORCH_DIRECT_WITH_CUDA, so a host-only
    build links without them.
    """
    patterns = ["*.cpp", "*.cu"] if cuda else ["*.cpp"]
    return sorted(str(p.relative_to(ROOT)) for folder in folders for pattern in patterns
                  for p in (ROOT / folder).rglob(pattern) if "generated" not in p.parts)


def compiled(name: str, files: list[str], cuda: bool):
    debug = os.environ.get("TORCH_DIRECT_DEBUG") == "1"
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    kwargs = dict(name=name, sources=files, include_dirs=[str(ROOT)])
    if cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        return cpp_extension.CUDAExtension(
            extra_compile_args={"cxx": cxx + ["-DTORCH_DIRECT_WITH_CUDA"],
                                "nvcc": ["-O3", "-DTORCH_DIRECT_WITH_CUDA"]},
            **kwargs)
    return cpp_extension.CppExtension(extra_compile_args=cxx, **kwargs)


def extensions() -> list:
    """The device (torch_direct._C: the allocator, the unified kernels, the PrivateUse1
    registration), which a fork wheel has natively, and the GNN stack's neighbour samplers
    (torch_direct.gnn.graph._sampler), mean aggregation (torch_direct.gnn.pipeline._aggregate) and
    the feature store's cached gather (torch_direct.gnn.pipeline._features), built on either vehicle."""
    cuda = want_cuda()
    out = []
    if not native_unified():
        device = [f for f in sources(cuda) if not f.startswith(("csrc/sampler/", "csrc/aggregate/", "csrc/features/"))]
        device.append(str(gen_registrations.generate().relative_to(ROOT)))
        out.append(compiled("torch_direct._C", device, cuda))
    out.append(compiled("torch_direct.gnn.graph._sampler", sources(cuda, ("csrc/sampler",)), cuda))
    out.append(compiled("torch_direct.gnn.pipeline._aggregate", sources(cuda, ("csrc/aggregate",)), cuda))
    out.append(compiled("torch_direct.gnn.pipeline._features", sources(cuda, ("csrc/features",)), cuda))
    return out


setup(
    name="torch_direct",
    version="0.1.0",
    description="Unified (GPU-mapped host memory) tensors for PyTorch and GPU-centric GNN training",
    packages=find_packages(include=["torch_direct", "torch_direct.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.5", "pyyaml"],
    # gnn: PyG's layers and the charts; the PyG baseline's NeighborLoader also needs a sampler
    # backend (pyg-lib, or torch-sparse), which is built per torch and CUDA release (README).
    extras_require={"test": ["pytest", "expecttest", "numpy"],
                    "gnn": ["torch_geometric", "numpy", "matplotlib"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
