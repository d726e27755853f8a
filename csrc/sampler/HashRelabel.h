#pragma once
// Relabelling a hop by a hash table, shared by the CPU loop and the GPU
// kernels of BlockSampler (the default; TORCH_DIRECT_EXPERIMENTAL=sampler_relabel=sort sorts).
//
// `all` lists the known nodes, then the hop's sampled sources. Each node gets
// the local id of its first occurrence in `all`, counted over first
// occurrences only: the known nodes keep 0..n_known-1 and new ones follow in
// the order the edges find them, the numbering the sort path gives. Three
// passes and a scan, no sort:
//   1. insert: every position i claims its node's slot (open addressing,
//      linear probing, a power-of-two table at most half full) and lowers the
//      slot's first position to i (an atomic minimum on the GPU: the result
//      does not depend on the order of the threads);
//   2. first: position i reads its slot's first position; i is a first
//      occurrence when the two are equal;
//   3. after an inclusive scan of those flags: position i's local id is the
//      scan at its first position, less one; a first occurrence writes its
//      node to the output at that id.
// The passes take the atomics as arguments (`claim`: compare-and-swap of an
// empty slot to the key, returning what was there; `lower`: minimum), so the
// CPU loop and the kernels run the same probing.

#include "Random.h"

#include <cstdint>

namespace torch_direct::sampler {

constexpr int64_t kNoNode = -1;   // an empty slot (node ids are >= 0)

TD_HOST_DEVICE inline uint64_t slot_of_node(int64_t node) {
  uint64_t z = static_cast<uint64_t>(node) * 0x9E3779B97F4A7C15ULL;
  return z ^ (z >> 31);
}

// Pass 1 for position `pos` holding `node`: its slot in `keys` (mask + 1
// slots), whose entry in `firsts` is lowered to `pos`.
template <typename Claim, typename Lower>
TD_HOST_DEVICE inline int64_t insert_node(int64_t* keys, int64_t* firsts, uint64_t mask, int64_t node,
                                          int64_t pos, Claim claim, Lower lower) {
  uint64_t h = slot_of_node(node) & mask;
  for (;;) {
    const int64_t was = claim(&keys[h], node);
    if (was == kNoNode || was == node) {
      lower(&firsts[h], pos);
      return static_cast<int64_t>(h);
    }
    h = (h + 1) & mask;
  }
}

// Pass 3 for position i: its local id, and its node written out when i is a
// first occurrence. `scan` is the inclusive scan of the first-occurrence flags.
TD_HOST_DEVICE inline void relabel_position(const int64_t* all, const int64_t* first, const int64_t* scan, int64_t i,
                                            int64_t* local, int64_t* nodes) {
  const int64_t f = first[i];
  local[i] = scan[f] - 1;
  if (f == i) {
    nodes[scan[i] - 1] = all[i];
  }
}

} // namespace torch_direct::sampler
