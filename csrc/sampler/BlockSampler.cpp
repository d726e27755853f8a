// Whole-batch neighbour sampling by tensor steps (see BlockSampler.h).

#include "c10_allocator/Text.h"
#include "csrc/aten/Experimental.h"
#include "csrc/aten/ParallelChunks.h"
#include "BlockSampler.h"

#include "DrawNeighbours.h"
#include "HashRelabel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

namespace torch_direct::sampler {
namespace {

void draw(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees, int64_t fanout,
          const at::Tensor& offsets, uint64_t seed, uint64_t stream, at::Tensor& slots,
          at::Tensor& src, at::Tensor& dst) {
  if (begins.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    draw_neighbours_cuda(col, begins, degrees, fanout, offsets, seed, stream, slots, src, dst);
    return;
#else
    TORCH_CHECK(false, "this torch_direct was built without CUDA: the GPU sampler is not available");
#endif
  }
  draw_neighbours_cpu(col, begins, degrees, fanout, offsets, seed, stream, slots, src, dst);
}

// Whether the experimental setting `name` is `on`: `unset` when unset, false when `off`, an
// error for any other value. Read per call, so that one process can time both.
bool experimental_switch(const char* name, const char* off, const char* on, bool unset = false) {
  const auto v = torch_direct::experimental::get(name);
  if (!v) {
    return unset;
  }
  if (*v == off) {
    return false;
  }
  TORCH_CHECK(*v == on, torch_direct::experimental::kVariable, ": ", name, " must be ", on, " or ", off, ", not '",
              *v, "'");
  return true;
}

// TORCH_DIRECT_EXPERIMENTAL=sampler_waits=fewer: each hop waits for its stream once, in `unique`, instead of
// twice, and the seeds are checked after the first hop instead of before it. The edge count is
// then read after `unique` has drained the stream (a round trip with nothing queued to wait
// for), the hop's buffers are sized by the bound n_dst * fanout with the unused tail of `src`
// holding the first known node (so it adds no node and no edge), and the first hop reads the
// CSR at clamped seeds (an out-of-range index would be a device-side assert on a GPU). A hop
// whose fanout is above max(16, 4 x the mean degree) still waits for its edge count first. The
// batches are the same either way. Unset or "default": the waits as they were.
bool fewer_waits() {
  return experimental_switch("sampler_waits", "default", "fewer");
}

// Each hop relabels through a hash table (HashRelabel.h: three passes and a scan) unless
// TORCH_DIRECT_EXPERIMENTAL=sampler_relabel=sort, which sorts instead (unique, argsort); the
// batches are the same. The hash table is the default: on papers100M-like's batches it samples
// in 0.94 ms against sorting's 2.30 ms on an H200.
bool relabel_by_hash_table() {
  return experimental_switch("sampler_relabel", "sort", "hash", /*unset=*/true);
}

// Passes 1 and 2 of HashRelabel.h on the CPU: `first` and `is_first` per position of `all`.
void find_first_occurrences_cpu(const at::Tensor& all, at::Tensor& keys, at::Tensor& firsts, at::Tensor& first,
                                at::Tensor& is_first) {
  const int64_t* a = all.const_data_ptr<int64_t>();
  int64_t* k = keys.data_ptr<int64_t>();
  int64_t* f = firsts.data_ptr<int64_t>();
  int64_t* out = first.data_ptr<int64_t>();
  int64_t* flag = is_first.data_ptr<int64_t>();
  const auto mask = static_cast<uint64_t>(keys.numel() - 1);
  const auto claim = [](int64_t* slot, int64_t node) {
    const int64_t was = *slot;
    if (was == kNoNode) {
      *slot = node;
    }
    return was;
  };
  const auto lower = [](int64_t* slot, int64_t pos) { *slot = std::min(*slot, pos); };
  const int64_t m = all.numel();
  for (int64_t i = 0; i < m; ++i) {   // one pass after another, as the kernels run
    out[i] = insert_node(k, f, mask, a[i], i, claim, lower);
  }
  for (int64_t i = 0; i < m; ++i) {
    out[i] = f[out[i]];
    flag[i] = out[i] == i ? 1 : 0;
  }
}

void number_positions_cpu(const at::Tensor& all, const at::Tensor& first, const at::Tensor& scan,
                          at::Tensor& local, at::Tensor& nodes) {
  const int64_t* a = all.const_data_ptr<int64_t>();
  const int64_t* f = first.const_data_ptr<int64_t>();
  const int64_t* sc = scan.const_data_ptr<int64_t>();
  int64_t* l = local.data_ptr<int64_t>();
  int64_t* n = nodes.data_ptr<int64_t>();
  for (int64_t i = 0; i < all.numel(); ++i) {
    relabel_position(a, f, sc, i, l, n);
  }
}

void throw_if_bad_seeds(int64_t lo, int64_t hi, bool repeated, int64_t num_nodes) {
  TORCH_CHECK_INDEX(lo >= 0 && hi < num_nodes, "NeighborSampler: seed node ",
                    c10::unified::num(lo < 0 ? lo : hi), " is out of range for a graph of ",
                    c10::unified::num(num_nodes), " nodes");
  TORCH_CHECK_VALUE(!repeated, "NeighborSampler: a seed node appears twice in one batch (seeds must be distinct)");
}

} // namespace

void draw_hop(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees, int64_t fanout,
              const at::Tensor& offsets, uint64_t seed, uint64_t stream, at::Tensor& slots, at::Tensor& src,
              at::Tensor& dst) {
  draw(col, begins, degrees, fanout, offsets, seed, stream, slots, src, dst);
}

HopRows hop_rows(const at::Tensor& rowptr, const at::Tensor& rows, int64_t fanout) {
  const int64_t n = rows.numel();
  const at::Tensor bounds = rowptr.index_select(0, at::cat({rows, rows + 1}));
  HopRows out;
  out.begin = bounds.slice(0, 0, n);
  out.degree = bounds.slice(0, n) - out.begin;
  const at::Tensor counts = fanout < 0 ? out.degree : out.degree.clamp_max(fanout);
  out.ends = counts.cumsum(0);
  out.offsets = out.ends - counts;
  return out;
}

bool hash_relabel_enabled() {
  return relabel_by_hash_table();
}

void check_seed_facts(int64_t lo, int64_t hi, bool repeated, int64_t num_nodes) {
  throw_if_bad_seeds(lo, hi, repeated, num_nodes);
}

void draw_neighbours_cpu(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees,
                         int64_t fanout, const at::Tensor& offsets, uint64_t seed, uint64_t stream,
                         at::Tensor& slots, at::Tensor& src, at::Tensor& dst) {
  const int64_t* bg = begins.const_data_ptr<int64_t>();
  const int64_t* dg = degrees.const_data_ptr<int64_t>();
  const int64_t* off = offsets.const_data_ptr<int64_t>();
  int64_t* sl = slots.data_ptr<int64_t>();
  int64_t* s = src.data_ptr<int64_t>();
  int64_t* d = dst.data_ptr<int64_t>();
  at::native::unified::parallel_chunks(begins.numel(), 256, 0, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t st = stream + static_cast<uint64_t>(i);
      if (col.scalar_type() == at::kLong) {
        draw_target(col.const_data_ptr<int64_t>(), bg[i], dg[i], i, fanout, off[i], seed, st, sl, s, d);
      } else {
        draw_target(col.const_data_ptr<int32_t>(), bg[i], dg[i], i, fanout, off[i], seed, st, sl, s, d);
      }
    }
  });
}

Relabelled relabel_by_hash(const at::Tensor& all) {
  TORCH_CHECK(all.dim() == 1 && all.scalar_type() == at::kLong && all.is_contiguous(),
              "relabel_by_hash: expected a contiguous 1-D int64 tensor");
  const int64_t m = all.numel();
  const auto opts = all.options();
  int64_t slots = 16;
  while (slots < 2 * m) {   // at most half full
    slots <<= 1;
  }
  at::Tensor keys = at::full({slots}, kNoNode, opts);
  at::Tensor firsts = at::full({slots}, std::numeric_limits<int64_t>::max(), opts);
  at::Tensor first = at::empty({m}, opts);
  at::Tensor is_first = at::empty({m}, opts);
  if (all.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    find_first_occurrences_cuda(all, keys, firsts, first, is_first);
#else
    TORCH_CHECK(false, "this torch_direct was built without CUDA: the GPU sampler is not available");
#endif
  } else {
    find_first_occurrences_cpu(all, keys, firsts, first, is_first);
  }
  const at::Tensor scan = is_first.cumsum(0);
  const int64_t u = m == 0 ? 0 : scan[-1].item<int64_t>();   // the host's one wait
  Relabelled out{at::empty({u}, opts), at::empty({m}, opts), first};
  if (all.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    number_positions_cuda(all, first, scan, out.local, out.nodes);
#endif
  } else {
    number_positions_cpu(all, first, scan, out.local, out.nodes);
  }
  return out;
}

Relabelled relabel_by_sort(const at::Tensor& all, bool with_first) {
  const auto opts = all.options();
  auto [unique, inverse, unused] = at::_unique2(all, true, true, false);  // waits for the stream
  const int64_t u = unique.numel();
  const at::Tensor first = at::full({u}, std::numeric_limits<int64_t>::max(), opts)
                               .scatter_reduce_(0, inverse, at::arange(all.numel(), opts), "amin", true);
  const at::Tensor order = first.argsort();
  const at::Tensor rank = at::empty({u}, opts).index_put_({order}, at::arange(u, opts));
  return {unique.index_select(0, order), rank.index_select(0, inverse),
          with_first ? first.index_select(0, inverse) : at::Tensor()};
}

SampledBatch sample_blocks(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& seeds,
                           const std::vector<int64_t>& fanouts, uint64_t seed, int64_t stream,
                           bool return_slots) {
  TORCH_CHECK(rowptr.device() == col.device() && seeds.device() == rowptr.device(),
              "sample_blocks: rowptr, col and seeds must be on one device, got ", rowptr.device(),
              ", ", col.device(), " and ", seeds.device());
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.scalar_type() == at::kLong && rowptr.is_contiguous(),
              "sample_blocks: rowptr must be a contiguous 1-D int64 tensor");
  TORCH_CHECK(col.dim() == 1 && col.is_contiguous() &&
                  (col.scalar_type() == at::kLong || col.scalar_type() == at::kInt),
              "sample_blocks: col must be a contiguous 1-D int32/int64 tensor");
  TORCH_CHECK(seeds.dim() == 1 && seeds.scalar_type() == at::kLong,
              "sample_blocks: seeds must be a 1-D int64 tensor");
  const int64_t num_nodes = rowptr.numel() - 1;
  at::Tensor nodes = seeds.contiguous();
  const bool fewer = fewer_waits();
  const bool by_hash = relabel_by_hash_table();
  // With fewer waits the seeds are checked after the first hop's `unique` (see fewer_waits).
  const bool check_later = fewer && !fanouts.empty() && nodes.numel() > 0;
  if (nodes.numel() > 0 && !check_later) {
    // One wait for the host instead of three: the sorted distinct seeds give the
    // duplicate check (their count) and the range check (their ends) together.
    const at::Tensor distinct = std::get<0>(at::_unique2(nodes, true, false, false));
    const at::Tensor ends =
        at::stack({distinct[0], distinct[-1]}).to(c10::kCPU);  // one copy of two values
    throw_if_bad_seeds(ends[0].item<int64_t>(), ends[1].item<int64_t>(), distinct.numel() != nodes.numel(),
                       num_nodes);
  }
  const auto long_opts = nodes.options().dtype(at::kLong);
  const double mean_degree = num_nodes > 0 ? static_cast<double>(col.numel()) / static_cast<double>(num_nodes) : 0.0;
  const double pad_limit = std::max(16.0, 4.0 * mean_degree);
  SampledBatch out;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t fanout = fanouts[h];
    const int64_t n_dst = nodes.numel();
    // Both ends of every target's row in one gather: read in address order, a
    // row's two ends share a cache line (one read, not two, over PCIe when
    // rowptr is in unified memory), and the draw then reads no rowptr.
    const bool unchecked = check_later && h == 0;
    const auto [begin, degree, ends, offsets] = hop_rows(rowptr, unchecked ? nodes.clamp(0, num_nodes - 1) : nodes,
                                                         fanout);
    // The edge count: here, one wait per hop; with fewer waits and a bounded fanout, after
    // `unique` below, the buffers sized by the bound meanwhile. A fanout far above the mean
    // degree would make that bound mostly padding (memory, and `unique` over it): such a hop
    // waits here as before.
    const bool bounded = fewer && fanout >= 0 && static_cast<double>(fanout) <= pad_limit;
    int64_t e = bounded || n_dst == 0 ? 0 : ends[-1].item<int64_t>();
    const int64_t cap = bounded ? n_dst * fanout : e;
    at::Tensor slots = at::empty({cap}, long_opts);
    at::Tensor src = bounded && cap > 0 ? nodes.slice(0, 0, 1).expand({cap}).contiguous()  // adds no node
                                        : at::empty({cap}, long_opts);
    at::Tensor dst = at::empty({cap}, long_opts);
    if (cap > 0) {
      draw(col, begin, degree, fanout, offsets, seed,
           target_stream(static_cast<uint64_t>(stream), static_cast<int64_t>(h), 0), slots, src, dst);
    }
    // Relabel: local ids by first occurrence in [known nodes, sampled sources].
    const at::Tensor all = at::cat({nodes, src});
    // Distinct seeds are each their own first occurrence; one copy of three values.
    const auto check_seeds = [&](const at::Tensor& seed_first) {
      const at::Tensor repeated = seed_first.ne(at::arange(n_dst, long_opts)).any();
      const at::Tensor facts = at::stack({nodes.min(), nodes.max(), repeated.to(at::kLong)}).to(c10::kCPU);
      throw_if_bad_seeds(facts[0].item<int64_t>(), facts[1].item<int64_t>(), facts[2].item<int64_t>() != 0,
                         num_nodes);
    };
    const Relabelled r = by_hash ? relabel_by_hash(all) : relabel_by_sort(all, unchecked);  // waits
    if (bounded && n_dst > 0) {
      e = ends[-1].item<int64_t>();
    }
    if (unchecked) {
      check_seeds(r.first.slice(0, 0, n_dst));
    }
    const at::Tensor src_local = r.local.slice(0, n_dst, n_dst + e);
    const int64_t u = r.nodes.numel();
    nodes = r.nodes;
    Hop hop;
    hop.edge_index = at::stack({src_local, dst.slice(0, 0, e)});
    if (return_slots) {
      hop.slots = e == cap ? slots : slots.slice(0, 0, e).clone();
    }
    hop.n_src = u;
    hop.n_dst = n_dst;
    out.hops.push_back(std::move(hop));
  }
  out.n_id = nodes;
  return out;
}

} // namespace torch_direct::sampler
