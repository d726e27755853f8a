// Checks the Unified device type of patch 0001 against the patched c10.
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <iostream>
#include <sstream>

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
    failures += ok ? 0 : 1;
  };
  c10::Device d("unified");
  expect(d.type() == c10::DeviceType::Unified, "parse 'unified'");
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
  std::cout << (failures == 0 ? "all passed" : "FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}
