#pragma once
// Visibility of csrc/aten's functions that other libraries call. In the fork
// csrc/aten is compiled into torch_cpu (its .cu files into torch_cuda), both
// built with hidden visibility, and torch_python (torch/csrc/Unified.cpp) calls
// the sharing, alias, gather and fallback functions declared with these
// macros: TORCH_DIRECT_ATEN_API for torch_cpu's, TORCH_DIRECT_ATEN_CUDA_API for
// torch_cuda's. In the extension everything is one module, where the macros
// only make the symbols visible, as TORCH_API does for any torch symbol.
#include <c10/core/DeviceType.h>  // C10_HAS_UNIFIED_DEVICE on the fork
#include <c10/macros/Export.h>

#define TORCH_DIRECT_ATEN_API TORCH_API
#if defined(C10_HAS_UNIFIED_DEVICE)
#define TORCH_DIRECT_ATEN_CUDA_API TORCH_CUDA_CPP_API
#else
#define TORCH_DIRECT_ATEN_CUDA_API TORCH_API
#endif

// The dispatch keys of the unified backend, for TORCH_LIBRARY_IMPL: its own
// (Unified, SparseUnified, SparseCsrUnified) on the fork, PrivateUse1's on
// stock PyTorch.
#if defined(C10_HAS_UNIFIED_DEVICE)
#define UNIFIED_DENSE_KEY Unified
#define UNIFIED_SPARSE_KEY SparseUnified
#define UNIFIED_SPARSE_CSR_KEY SparseCsrUnified
#else
#define UNIFIED_DENSE_KEY PrivateUse1
#define UNIFIED_SPARSE_KEY SparsePrivateUse1
#define UNIFIED_SPARSE_CSR_KEY SparseCsrPrivateUse1
#endif
