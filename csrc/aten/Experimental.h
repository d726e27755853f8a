#pragma once

// The one switch for settings that exist only for experiments:
//
//   TORCH_DIRECT_EXPERIMENTAL="gather_kernel=grid,gather_window_rows=2048"
//
// a comma-separated list of name=value pairs, read each time a setting is
// asked for (so one process can time several settings). The names are
// kSettings below; an unknown name, a pair without '=' or a name given twice
// is an error at the first read. Each setting's user checks its value, before
// any work starts (check_gather_settings in GatherCpu.cpp for the gathers).
// Unset or empty: every setting takes its default. Header-only, so that the
// device core and the sampler extension share it; its functions have internal
// linkage, so that the host code nvcc compiles and g++'s never share a copy.

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace torch_direct::experimental {
namespace {

constexpr const char* kVariable = "TORCH_DIRECT_EXPERIMENTAL";
constexpr const char* kSettings[] = {
    "gather_kernel",        // rowblock | grid: the CUDA gather's read kernel on any table
    "gather_window_rows",   // int >= 0: rows the grid-stride kernel keeps in flight
    "gather_max_unit",      // 16|8|4|2|1: cap on the bytes of each load
    "gather_own_pool",      // 1: the CPU gather's own thread pool instead of ATen's
    "cpu_gather_prefetch",  // int >= 0: rows ahead whose cache lines the CPU gather requests
    "cpu_gather_stores",    // plain | streaming: how the CPU gather writes its rows
    "sampler_waits",        // default | fewer: the GPU sampler's host waits per hop
    "sampler_relabel",      // sort | hash: how the GPU sampler numbers a hop's new nodes
    "feature_pages",        // small | huge: the GNN feature store's table pages (read in Python)
    "cached_gather",        // split | fused: the GNN feature store's cached gather (read in Python)
    "hybrid_split",         // index | address: which rows a hybrid feature gather's CPU threads take (Python)
    "cpu_pool_nice",        // int 0-19: the CPU thread pool's workers run this much nicer than their caller
    "cpu_pool_size",        // concurrent | largest: the CPU thread pool holds all running calls' threads, or one call's
    "gil_switch_us",        // int >= 1: the GIL's switch interval while the GNN stack trains (Python)
    "store_index_bounds",   // checked | known: the GNN feature stores pass gather their own indices' bounds (Python)
    "step_host",            // fused | python: a training step's host-side copies and tally in one call (Python)
    "hybrid_copies",        // wait | ordered: a hybrid gather waits for its CPU rows' copies, or orders its stream
    "gather_turns",         // wait | deposit: how the GNN loader's gathering threads queue in order (Python)
    "hybrid_piece_kb",      // int >= 16: KiB of rows a hybrid gather's CPU thread writes before their copy starts
};

[[maybe_unused]] bool known(const std::string& name) {
  for (const char* s : kSettings) {
    if (name == s) {
      return true;
    }
  }
  return false;
}

[[maybe_unused]] std::string known_list() {
  std::string out;
  for (const char* s : kSettings) {
    out += out.empty() ? "" : ", ";
    out += s;
  }
  return out;
}

// The value `name` is given in TORCH_DIRECT_EXPERIMENTAL, or nullopt.
[[maybe_unused]] std::optional<std::string> get(const char* name) {
  TORCH_INTERNAL_ASSERT(known(name), "experimental setting ", name, " is not in kSettings");
  const char* env = std::getenv(kVariable);
  if (env == nullptr) {
    return std::nullopt;
  }
  const std::string all(env);
  std::optional<std::string> found;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) {
      end = all.size();
    }
    const std::string item = all.substr(start, end - start);
    start = end + 1;
    if (item.empty()) {
      continue;
    }
    const size_t eq = item.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, kVariable, ": '", item,
                "' is not name=value (names: ", known_list(), ")");
    const std::string key = item.substr(0, eq);
    TORCH_CHECK(known(key), kVariable, ": unknown setting '", key, "' (names: ", known_list(), ")");
    if (key == name) {
      TORCH_CHECK(!found, kVariable, ": ", key, " is given twice");
      found = item.substr(eq + 1);
    }
  }
  return found;
}

// A setting that takes an integer >= lo; `fallback` when it is not given.
[[maybe_unused]] int64_t get_int(const char* name, int64_t fallback, int64_t lo = 0) {
  const auto v = get(name);
  if (!v) {
    return fallback;
  }
  char* end = nullptr;
  const long long n = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || end == nullptr || *end != '\0' || n < lo) {
    const std::string msg = std::string(kVariable) + ": " + name + " must be an integer >= " + std::to_string(lo) +
                            ", not '" + *v + "'";
    TORCH_CHECK(false, msg);
  }
  return static_cast<int64_t>(n);
}

}  // namespace
}  // namespace torch_direct::experimental
