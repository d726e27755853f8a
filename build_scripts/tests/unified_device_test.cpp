// Checks the Unified device of the patch series against the patched c10:
// the device type (0001), its backend and dispatch keys (0002), and the
// allocator and device guard the shared c10_allocator/ registers (0004).
#include <c10/core/Allocator.h>
#include <c10/core/Backend.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <c10_allocator/UnifiedAllocator.h>

#include <cstring>
#include <iostream>
#include <sstream>

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
    failures += ok ? 0 : 1;
  };
  // Device type
  c10::Device d("unified");
  expect(d.type() == c10::DeviceType::Unified && d.is_unified(), "parse 'unified'");
  expect(!d.has_index(), "no index by default");
  c10::Device d0("unified:0");
  expect(d0.index() == 0, "parse 'unified:0'");
  std::ostringstream ss;
  ss << d0;
  expect(ss.str() == "unified:0", "print unified:0");
  expect(c10::DeviceTypeName(c10::kUnified) == "UNIFIED", "upper-case name");
  expect(c10::isValidDeviceType(c10::kUnified), "valid device type");
  expect(static_cast<int>(c10::kUnified) == 21 && c10::COMPILE_TIME_MAX_DEVICE_TYPES == 22,
         "enum value and compile-time maximum");
  bool refused = false;
  try {
    c10::register_privateuse1_backend("unified");
  } catch (const std::exception&) {
    refused = true;
  }
  expect(refused, "PrivateUse1 cannot take the in-tree name 'unified'");

  // Backend component and dispatch keys
  expect(c10::toBackendComponent(c10::kUnified) == c10::BackendComponent::UnifiedBit,
         "device -> backend component");
  expect(c10::toFunctionalityKey(c10::DispatchKey::Unified) == c10::DispatchKey::Dense &&
             c10::toBackendComponent(c10::DispatchKey::Unified) == c10::BackendComponent::UnifiedBit,
         "Unified is the dense key of UnifiedBit");
  expect(c10::computeDispatchKey(std::nullopt, c10::kStrided, c10::Device("unified")) ==
             c10::DispatchKey::Unified,
         "TensorOptions: unified device -> Unified key");
  expect(c10::computeDispatchKey(std::nullopt, c10::kSparse, c10::Device("unified")) ==
             c10::DispatchKey::SparseUnified,
         "TensorOptions: sparse layout -> SparseUnified key");
  expect(c10::dispatchKeyToDeviceType(c10::DispatchKey::Unified) == c10::kUnified,
         "Unified key -> device type");
  expect(c10::dispatchKeyToBackend(c10::DispatchKey::Unified) == c10::Backend::Unified &&
             c10::backendToDispatchKey(c10::Backend::Unified) == c10::DispatchKey::Unified &&
             c10::backendToDeviceType(c10::Backend::Unified) == c10::kUnified,
         "Backend::Unified <-> key <-> device");
  expect(c10::parseDispatchKey("Unified") == c10::DispatchKey::Unified &&
             std::strcmp(c10::toString(c10::DispatchKey::AutogradUnified), "AutogradUnified") == 0,
         "key names parse and print");
  expect(c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::UnifiedBit)
             .has(c10::DispatchKey::AutogradUnified),
         "autograd key of the Unified backend");
  auto ks = c10::DispatchKeySet(c10::DispatchKey::Unified) | c10::DispatchKeySet(c10::DispatchKey::CUDA) |
            c10::DispatchKeySet(c10::DispatchKey::CPU);
  expect(ks.highestPriorityTypeId() == c10::DispatchKey::Unified,
         "Unified outranks CPU and CUDA (its kernels apply R1-R3)");

  // Allocator and device guard of the shared c10_allocator/
  expect(c10::unified::kUnifiedDeviceType == c10::kUnified &&
             c10::unified::kUnifiedDispatchKey == c10::DispatchKey::Unified,
         "shared sources take the native device and key");
  c10::Allocator* a = c10::GetAllocator(c10::kUnified);
  expect(a == c10::unified::get_allocator(), "unified allocator registered for kUnified");
  c10::DataPtr p = a->allocate(4096);
  expect(p.get() != nullptr && p.device().type() == c10::kUnified, "allocate 4 KiB on unified");
  std::memset(p.get(), 7, 4096);
  expect(static_cast<unsigned char*>(p.get())[4095] == 7, "host writes and reads the block");
  p.clear();
  expect(c10::impl::hasDeviceGuardImpl(c10::kUnified) &&
             c10::impl::getDeviceGuardImpl(c10::kUnified)->type() == c10::kUnified,
         "device guard registered for kUnified");
  std::cout << (failures == 0 ? "all passed" : "FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}
