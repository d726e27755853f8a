#pragma once
// Visibility of the allocator's symbols. In the fork they are compiled into
// libc10 (a build without CUDA) or libc10_cuda, both built with hidden
// visibility, and are called from torch_cpu / torch_cuda (csrc/aten) and
// torch_python (torch/csrc/Unified.cpp): every declaration the other
// libraries use carries TORCH_DIRECT_ALLOCATOR_API. In the extension the
// allocator is compiled into the extension module itself, where the macro
// only makes the symbols visible, as C10_API does for any c10 symbol.
#include <c10/macros/Export.h>

#if defined(C10_HAS_UNIFIED_DEVICE) && defined(TORCH_DIRECT_WITH_CUDA)
#include <c10/cuda/CUDAMacros.h>
#define TORCH_DIRECT_ALLOCATOR_API C10_CUDA_API
#else
#define TORCH_DIRECT_ALLOCATOR_API C10_API
#endif
