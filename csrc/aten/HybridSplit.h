#pragma once
// How the hybrid gather splits an index between the CPU path (threads gather
// into pinned staging, then DMA) and the GPU path (zero-copy reads), from
// rates measured in earlier calls for the same device and row size.
//
// Both paths cross the same PCIe link. Where the GPU path alone nearly fills
// it (wide rows), running both makes them compete and the pair moves fewer
// rows than the GPU alone (measured on an H200: 40.9 against 49.0 GB/s at
// 1024-byte rows). So the policy also knows the GPU path's rate when it ran
// alone, and gives the CPU nothing while the pair is the slower choice.
// Header-only and free of CUDA, so the policy is tested on any machine.

#include <algorithm>
#include <cstdint>

namespace at::native::unified {

// Rows per second, smoothed over calls.
struct HybridRates {
  double cpu = 0;        // the CPU path, while the GPU path ran beside it
  double gpu = 0;        // the GPU path, while the CPU path ran beside it
  double gpu_alone = 0;  // the GPU path in a call that gave the CPU nothing
  int64_t calls = 0;     // calls recorded
};

constexpr double kDefaultCpuFraction = 0.25;
// While the GPU alone is faster, one call in this many tries the split again,
// so that a change (another load on the link, on the CPU) is noticed.
constexpr int64_t kHybridReprobeEvery = 16;

// Folds one call's timings in: k of n rows went to the CPU path, which took
// cpu_s seconds; the GPU path's n - k rows took gpu_s. The first call for a
// (GPU, row size) is counted but not folded in: it pays one-time costs (the
// pinned staging allocated, threads started) that would make the CPU path
// look several times slower than it is, and a rate that low can have the next
// calls give the GPU every row (the pair slower than the GPU alone) until the
// next try of the split.
inline void record_hybrid_call(HybridRates& r, int64_t n, int64_t k, double cpu_s, double gpu_s) {
  if (r.calls++ == 0) {
    return;
  }
  auto blend = [](double old, double now) { return old > 0 ? 0.5 * old + 0.5 * now : now; };
  if (k == 0) {
    if (gpu_s > 0) {
      r.gpu_alone = blend(r.gpu_alone, static_cast<double>(n) / gpu_s);
    }
  } else {
    if (cpu_s > 0) {
      r.cpu = blend(r.cpu, static_cast<double>(k) / cpu_s);
    }
    if (k < n && gpu_s > 0) {
      r.gpu = blend(r.gpu, static_cast<double>(n - k) / gpu_s);
    }
  }
}

// The CPU share of the next call: first kDefaultCpuFraction (twice: the
// first call is a warm-up; both paths measured together), then the GPU alone
// once, then the split that has both paths finish together (within [0.05, 0.95], so both keep being measured),
// or 0 while the pair moves fewer rows per second than the GPU alone.
inline double choose_hybrid_fraction(const HybridRates& r) {
  if (r.cpu <= 0 || r.gpu <= 0) {
    return kDefaultCpuFraction;
  }
  if (r.gpu_alone <= 0) {
    return 0.0;
  }
  const double split = std::min(0.95, std::max(0.05, r.cpu / (r.cpu + r.gpu)));
  if (r.cpu + r.gpu >= r.gpu_alone) {
    return split;
  }
  return r.calls % kHybridReprobeEvery == kHybridReprobeEvery - 1 ? split : 0.0;
}

} // namespace at::native::unified
