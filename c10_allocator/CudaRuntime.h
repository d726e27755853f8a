#pragma once
// The few CUDA runtime calls the unified allocator needs, behind one switch.
// Built without CUDA (TORCH_DIRECT_WITH_CUDA undefined), or run on a machine
// with no usable GPU, every function degrades to its host-only meaning so that
// unified memory is plain host memory and placement falls to its CPU branch.

#include "Export.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <string>

namespace c10::unified::cuda {

// True when this build has CUDA and at least one GPU answers. Never throws;
// does not create a CUDA context.
TORCH_DIRECT_ALLOCATOR_API bool available();

// True when a CUDA context already exists in this process (so registering
// memory now costs nothing a later GPU use would not pay anyway).
TORCH_DIRECT_ALLOCATOR_API bool context_initialized();

// Page-lock [ptr, ptr + size) and map it for every GPU (portable + mapped).
// Returns "" on success, "already registered" when the driver reports the
// range as registered, or the driver's error string.
TORCH_DIRECT_ALLOCATOR_API std::string host_register(void* ptr, size_t size);
TORCH_DIRECT_ALLOCATOR_API void host_unregister(void* ptr);

// The device address under which GPUs see a registered host pointer.
TORCH_DIRECT_ALLOCATOR_API void* device_pointer(void* host_ptr);

// Stream-ordered bookkeeping: an opaque event recorded on a CUDA stream.
TORCH_DIRECT_ALLOCATOR_API void* record_event(const c10::Stream& stream);
TORCH_DIRECT_ALLOCATOR_API bool event_done(void* event);
TORCH_DIRECT_ALLOCATOR_API void event_destroy(void* event);
TORCH_DIRECT_ALLOCATOR_API void stream_synchronize(const c10::Stream& stream);
// True when every piece of work queued on `stream` so far has finished, and
// for a stream that is capturing a CUDA graph (a capture runs nothing).
TORCH_DIRECT_ALLOCATOR_API bool stream_idle(const c10::Stream& stream);
TORCH_DIRECT_ALLOCATOR_API void device_synchronize();

// The current CUDA device; only meaningful when available().
TORCH_DIRECT_ALLOCATOR_API c10::DeviceIndex current_device();

// Asynchronous copy on `stream` (kind inferred from the addresses).
TORCH_DIRECT_ALLOCATOR_API void memcpy_async(void* dst, const void* src, size_t n, const c10::Stream& stream);

} // namespace c10::unified::cuda

namespace c10::unified::cuda {
// The current stream of CUDA device `index`.
TORCH_DIRECT_ALLOCATOR_API c10::Stream current_stream_of(c10::DeviceIndex index);
// PyTorch's CUDA caching allocator (nullptr without CUDA).
TORCH_DIRECT_ALLOCATOR_API c10::Allocator* device_allocator();
} // namespace c10::unified::cuda
