#pragma once
// One target's neighbour draw, shared by the CPU loop and the GPU kernel of
// BlockSampler: min(fanout, degree) distinct CSR slots of row v (all when
// fanout < 0) by Floyd's algorithm, membership by scanning the picks so far.

#include "Random.h"

#include <cstdint>

namespace torch_direct::sampler {

template <typename col_t>
TD_HOST_DEVICE inline void draw_target(const int64_t* rowptr, const col_t* col, int64_t v, int64_t i,
                                       int64_t fanout, int64_t out, uint64_t seed, uint64_t stream,
                                       int64_t* slots, int64_t* src, int64_t* dst) {
  const int64_t begin = rowptr[v];
  const int64_t degree = rowptr[v + 1] - begin;
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
  for (int64_t j = 0; j < count; ++j) {
    src[out + j] = static_cast<int64_t>(col[slots[out + j]]);
    dst[out + j] = i;
  }
}

} // namespace torch_direct::sampler
