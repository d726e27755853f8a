#pragma once
// One target's neighbour draw, shared by the CPU loop and the GPU kernel of
// BlockSampler: min(fanout, degree) distinct CSR slots of the row that starts
// at `begin` (all when fanout < 0) by Floyd's algorithm, membership by
// scanning the picks so far, then the picked neighbours read from `col`.
//
// The row's bounds come in as arguments: the caller gathers both ends of
// every target's row in one ordered gather (they share a cache line), so the
// draw reads nothing from rowptr. The column reads go in groups of
// kColReads, all issued before any result is stored: when `col` lies in host
// memory each read is a PCIe round trip, and a store that waits on one read
// before the next is issued would make them one after another.

#include "Random.h"

#include <cstdint>

namespace torch_direct::sampler {

constexpr int kColReads = 8;

template <typename col_t>
TD_HOST_DEVICE inline void draw_target(const col_t* col, int64_t begin, int64_t degree, int64_t i,
                                       int64_t fanout, int64_t out, uint64_t seed, uint64_t stream,
                                       int64_t* slots, int64_t* src, int64_t* dst) {
  const bool all = fanout < 0 || degree <= fanout;
  if (all) {
    for (int64_t j = 0; j < degree; ++j) {
      slots[out + j] = begin + j;
    }
  } else {
    Rng rng(seed, stream);
    int64_t c = 0;
    for (int64_t j = degree - fanout; j < degree; ++j, ++c) {
      const auto t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j) + 1));
      bool seen = false;
      for (int64_t q = 0; q < c && !seen; ++q) {
        seen = slots[out + q] == begin + t;
      }
      slots[out + c] = begin + (seen ? j : t);
    }
  }
  const int64_t count = all ? degree : fanout;
  for (int64_t j = 0; j < count; j += kColReads) {
    int64_t v[kColReads];
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int u = 0; u < kColReads; ++u) {
      v[u] = j + u < count ? static_cast<int64_t>(col[slots[out + j + u]]) : 0;
    }
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int u = 0; u < kColReads; ++u) {
      if (j + u < count) {
        src[out + j + u] = v[u];
        dst[out + j + u] = i;
      }
    }
  }
}

} // namespace torch_direct::sampler
