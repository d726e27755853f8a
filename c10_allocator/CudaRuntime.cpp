#include "CudaRuntime.h"

#include <c10/util/Exception.h>

#ifdef TORCH_DIRECT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace c10::unified::cuda {

#ifdef TORCH_DIRECT_WITH_CUDA

#define TD_CUDA_CHECK(expr)                                          \
  do {                                                               \
    cudaError_t err_ = (expr);                                       \
    TORCH_CHECK(err_ == cudaSuccess, "CUDA error in ", #expr, ": ",  \
                cudaGetErrorString(err_));                           \
  } while (0)

bool available() {
  // c10's device_count() uses NVML where it can, so asking does not create a
  // context (and does not poison fork()).
  static const bool ok = [] {
    try {
      return c10::cuda::device_count() > 0;
    } catch (...) {
      return false;
    }
  }();
  return ok;
}

bool context_initialized() {
  if (!available()) {
    return false;
  }
  // Asks the driver's primary-context state; creates no context.
  return c10::cuda::getDeviceIndexWithPrimaryContext().has_value();
}

std::string host_register(void* ptr, size_t size) {
  cudaError_t err = cudaHostRegister(
      ptr, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err == cudaSuccess) {
    return "";
  }
  (void)cudaGetLastError(); // clear the sticky-free error so later checks pass
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    return "already registered";
  }
  return cudaGetErrorString(err);
}

void host_unregister(void* ptr) {
  cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void* device_pointer(void* host_ptr) {
  void* dev = nullptr;
  TD_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host_ptr, 0));
  return dev;
}

void* record_event(const c10::Stream& stream) {
  c10::cuda::CUDAGuard guard(stream.device_index());
  cudaEvent_t ev = nullptr;
  TD_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  TD_CUDA_CHECK(cudaEventRecord(ev, c10::cuda::CUDAStream(
                                        c10::cuda::CUDAStream::UNCHECKED, stream)
                                        .stream()));
  return ev;
}

bool event_done(void* event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TD_CUDA_CHECK(err);
  return true;
}

void event_destroy(void* event) {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void stream_synchronize(const c10::Stream& stream) {
  c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).synchronize();
}

void device_synchronize() {
  TD_CUDA_CHECK(cudaDeviceSynchronize());
}

c10::Stream current_stream() {
  return c10::cuda::getCurrentCUDAStream().unwrap();
}

c10::DeviceIndex current_device() {
  return c10::cuda::current_device();
}

void memcpy_async(void* dst, const void* src, size_t n, const c10::Stream& stream) {
  c10::cuda::CUDAGuard guard(stream.device_index());
  TD_CUDA_CHECK(cudaMemcpyAsync(
      dst, src, n, cudaMemcpyDefault,
      c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream()));
}

c10::Stream current_stream_of(c10::DeviceIndex index) {
  return c10::cuda::getCurrentCUDAStream(index).unwrap();
}

c10::Allocator* device_allocator() {
  return c10::cuda::CUDACachingAllocator::get();
}

#else // host-only build

bool available() { return false; }
bool context_initialized() { return false; }
std::string host_register(void*, size_t) { return ""; }
void host_unregister(void*) {}
void* device_pointer(void* host_ptr) { return host_ptr; }
void* record_event(const c10::Stream&) { return nullptr; }
bool event_done(void*) { return true; }
void event_destroy(void*) {}
void stream_synchronize(const c10::Stream&) {}
void device_synchronize() {}
c10::Stream current_stream() {
  TORCH_CHECK(false, "torch_direct was built without CUDA");
}
c10::DeviceIndex current_device() { return -1; }
void memcpy_async(void*, const void*, size_t, const c10::Stream&) {
  TORCH_CHECK(false, "torch_direct was built without CUDA");
}
c10::Stream current_stream_of(c10::DeviceIndex) {
  TORCH_CHECK(false, "torch_direct was built without CUDA");
}
c10::Allocator* device_allocator() { return nullptr; }

#endif

} // namespace c10::unified::cuda
