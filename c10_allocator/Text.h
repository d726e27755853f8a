#pragma once
// Numbers and addresses for error messages, formatted with snprintf.
//
// Seen on the H200 image (torch 2.11, g++ 13): inserting an integer into the
// std::ostream behind TORCH_CHECK's message, from this extension's code,
// crashed inside libstdc++'s num_put. Strings are inserted safely, so every
// number in our messages goes through these helpers first.

#include <cinttypes>
#include <cstdio>
#include <string>
#include <type_traits>

namespace c10::unified {

template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string num(T v) {
  char buf[32];
  if constexpr (std::is_signed_v<T>) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(v));
  }
  return buf;
}

inline std::string addr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

} // namespace c10::unified
