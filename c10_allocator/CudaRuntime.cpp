#include "CudaRuntime.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>

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

// Set once this process has asked the driver anything (which initializes it);
// a fork()ed child of such a process cannot use CUDA (the driver's rule), so
// there every placement rule takes its CPU branch.
std::atomic<bool> g_probed{false};
std::atomic<bool> g_bad_fork{false};

void after_fork_in_child() {
  if (g_probed.load()) {
    g_bad_fork.store(true);
  }
}

const bool g_atfork = [] {
  pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  return true;
}();

bool available() {
  if (g_bad_fork.load(std::memory_order_relaxed)) {
    return false;
  }
  // c10's device_count() uses NVML where it can; the answer is cached.
  static const bool ok = [] {
    g_probed.store(true);
    try {
      return c10::cuda::device_count() > 0;
    } catch (...) {
      return false;
    }
  }();
  return ok;
}

bool context_initialized() {
  // PyTorch's CUDA allocator is initialized by torch.cuda's lazy init: asking
  // it touches no driver state (so allocating unified memory before any GPU
  // use keeps fork() usable).
  if (g_bad_fork.load(std::memory_order_relaxed)) {
    return false;
  }
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  return allocator != nullptr && allocator->initialized();
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

namespace {
// While another thread captures a CUDA graph in cudaStreamCaptureModeGlobal
// (torch.cuda.graph's default), event and stream queries from this thread are
// refused and break that capture; the allocator's bookkeeping is not part of
// any capture, so it runs in relaxed mode (as PyTorch's caching allocator does
// for its event queries).
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
};

// The answer of an event or stream query (`call` names it): not ready (its
// error cleared) is false, done is true, anything else throws.
bool finished(cudaError_t err, const char* call) {
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TORCH_CHECK(err == cudaSuccess, "CUDA error in ", call, ": ", cudaGetErrorString(err));
  return true;
}
} // namespace

void* record_event(const c10::Stream& stream) {
  c10::cuda::CUDAGuard guard(stream.device_index());
  RelaxedCapture relaxed;
  cudaEvent_t ev = nullptr;
  TD_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  TD_CUDA_CHECK(cudaEventRecord(ev, c10::cuda::CUDAStream(
                                        c10::cuda::CUDAStream::UNCHECKED, stream)
                                        .stream()));
  return ev;
}

bool event_done(void* event) {
  RelaxedCapture relaxed;
  return finished(cudaEventQuery(static_cast<cudaEvent_t>(event)), "cudaEventQuery");
}

void event_destroy(void* event) {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void stream_synchronize(const c10::Stream& stream) {
  c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).synchronize();
}

bool stream_idle(const c10::Stream& stream) {
  c10::cuda::CUDAGuard guard(stream.device_index());
  const cudaStream_t s = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream).stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TD_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    // A capture runs nothing: the work it records reads the block only when
    // the graph is replayed, and whoever replays it keeps its inputs alive.
    // Neither a query nor an event recorded on a capturing stream is allowed,
    // so work queued on it before its capture began is not waited for.
    return true;
  }
  RelaxedCapture relaxed;
  return finished(cudaStreamQuery(s), "cudaStreamQuery");
}

void device_synchronize() {
  TD_CUDA_CHECK(cudaDeviceSynchronize());
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
bool stream_idle(const c10::Stream&) { return true; }
void device_synchronize() {}
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
