#include "DriverHostMemory.h"

#include "CudaRuntime.h"
#include "Text.h"

#ifdef TORCH_DIRECT_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <vector>
#endif

namespace c10::unified::cuda {

#ifdef TORCH_DIRECT_WITH_CUDA
namespace {

// The driver calls, looked up through the runtime (no link against libcuda).
// None of them has changed its signature since CUDA 10.2 (cuda.h versions
// none of these names), so asking for them as of 12.0 gives the declared ones
// on any driver from 12.0 on.
struct Driver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  std::string missing; // the first call the driver did not give, if any
};

template <typename F>
void look_up(const char* name, F& fn, std::string& missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    if (missing.empty()) {
      missing = std::string("the CUDA driver has no ") + name;
    }
    return;
  }
  fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    look_up("cuGetErrorName", r.get_error_name, r.missing);
    look_up("cuDeviceGet", r.device_get, r.missing);
    look_up("cuDeviceGetAttribute", r.device_attribute, r.missing);
    look_up("cuMemGetAllocationGranularity", r.granularity, r.missing);
    look_up("cuMemCreate", r.create, r.missing);
    look_up("cuMemRelease", r.release, r.missing);
    look_up("cuMemAddressReserve", r.reserve, r.missing);
    look_up("cuMemAddressFree", r.address_free, r.missing);
    look_up("cuMemMap", r.map, r.missing);
    look_up("cuMemUnmap", r.unmap, r.missing);
    look_up("cuMemSetAccess", r.set_access, r.missing);
    return r;
  }();
  return d;
}

std::string describe(const Driver& d, const char* call, CUresult rc) {
  const char* name = nullptr;
  if (d.get_error_name == nullptr || d.get_error_name(rc, &name) != CUDA_SUCCESS || name == nullptr) {
    return std::string(call) + " failed (CUresult " + num(static_cast<int>(rc)) + ")";
  }
  return std::string(call) + " failed: " + name;
}

} // namespace

std::string driver_host_alloc(size_t nbytes, DriverHostMapping* out) {
  if (nbytes == 0) {
    return "nothing to allocate (0 bytes)";
  }
  if (!available()) {
    return "no usable CUDA GPU";
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    return "no usable CUDA GPU";
  }
  err = cudaFree(nullptr); // the current device's primary context, which the driver calls use
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cannot initialize CUDA: ") + cudaGetErrorString(err);
  }
  const Driver& d = driver();
  if (!d.missing.empty()) {
    return d.missing;
  }
  std::vector<CUdevice> devices(static_cast<size_t>(count));
  int numa_id = -1;
  for (int i = 0; i < count; ++i) {
    CUresult rc = d.device_get(&devices[i], i);
    if (rc != CUDA_SUCCESS) {
      return describe(d, "cuDeviceGet", rc);
    }
    int supported = 0;
    rc = d.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                            devices[i]);
    if (rc != CUDA_SUCCESS || supported == 0) {
      return "GPU " + num(i) + " does not support host NUMA allocations through the driver's "
             "virtual memory management (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA)";
    }
    if (i == static_cast<int>(current_device())) {
      (void)d.device_attribute(&numa_id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, devices[i]);
    }
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa_id >= 0 ? numa_id : 0; // 0 where the system has no NUMA
  size_t gran = 0;
  CUresult rc = d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (rc != CUDA_SUCCESS || gran == 0) {
    return describe(d, "cuMemGetAllocationGranularity", rc);
  }
  DriverHostMapping m;
  m.granularity = gran;
  m.size = (nbytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle handle = 0;
  rc = d.create(&handle, m.size, &prop, 0);
  if (rc != CUDA_SUCCESS) {
    return describe(d, "cuMemCreate", rc) + " (" + num(m.size >> 20) + " MiB on host NUMA node " +
           num(prop.location.id) + ")";
  }
  CUdeviceptr va = 0;
  rc = d.reserve(&va, m.size, gran, 0, 0);
  if (rc != CUDA_SUCCESS) {
    d.release(handle);
    return describe(d, "cuMemAddressReserve", rc);
  }
  rc = d.map(va, m.size, 0, handle, 0);
  if (rc != CUDA_SUCCESS) {
    d.address_free(va, m.size);
    d.release(handle);
    return describe(d, "cuMemMap", rc);
  }
  // Every GPU, and the CPU (host NUMA access: the id is ignored).
  std::vector<CUmemAccessDesc> access(devices.size() + 1);
  for (size_t i = 0; i < devices.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  access.back().location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  access.back().location.id = prop.location.id;
  access.back().flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  rc = d.set_access(va, m.size, access.data(), access.size());
  if (rc != CUDA_SUCCESS) {
    d.unmap(va, m.size);
    d.address_free(va, m.size);
    d.release(handle);
    return describe(d, "cuMemSetAccess", rc);
  }
  m.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(va));
  m.handle = static_cast<uint64_t>(handle);
  *out = m;
  return "";
}

void driver_host_free(const DriverHostMapping& m) {
  if (m.ptr == nullptr) {
    return;
  }
  const Driver& d = driver();
  if (!d.missing.empty()) {
    return;
  }
  const auto va = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(m.ptr));
  (void)d.unmap(va, m.size);
  (void)d.address_free(va, m.size);
  (void)d.release(static_cast<CUmemGenericAllocationHandle>(m.handle));
}

#else // host-only build

std::string driver_host_alloc(size_t, DriverHostMapping*) {
  return "torch_direct was built without CUDA";
}

void driver_host_free(const DriverHostMapping&) {}

#endif

} // namespace c10::unified::cuda
