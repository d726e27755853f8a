// Several batches sampled together (BlockSampler.h, sample_blocks_many). Each hop runs its
// tensor steps once over the batches' targets laid end to end. Batch b's nodes are told apart
// from the others' by a key, node + (b << kBatchShift), so one relabel over all the keys numbers
// each batch's nodes by first occurrence within its own [targets, sources] part, exactly as
// sample_blocks numbers a batch alone; each batch's numbers are then shifted to start at zero.

#include "BlockSampler.h"

#include <ATen/ATen.h>

#include <numeric>

namespace torch_direct::sampler {
namespace {

constexpr int kBatchShift = 40;   // node ids below 2^40, up to 2^23 batches in one call

// The values of a small device tensor on the host: one copy, one wait.
std::vector<int64_t> to_host(const at::Tensor& t) {
  const at::Tensor h = t.to(c10::kCPU).contiguous();
  return std::vector<int64_t>(h.const_data_ptr<int64_t>(), h.const_data_ptr<int64_t>() + h.numel());
}

std::vector<int64_t> exclusive_sum(const std::vector<int64_t>& v) {
  std::vector<int64_t> out(v.size() + 1, 0);
  std::partial_sum(v.begin(), v.end(), out.begin() + 1);
  return out;
}

} // namespace

std::vector<SampledBatch> sample_blocks_many(const at::Tensor& rowptr, const at::Tensor& col,
                                             const std::vector<at::Tensor>& seeds,
                                             const std::vector<int64_t>& fanouts, uint64_t seed,
                                             const std::vector<int64_t>& streams, bool return_slots) {
  const auto k = static_cast<int64_t>(seeds.size());
  TORCH_CHECK(k > 0, "sample_blocks_many: no batches");
  TORCH_CHECK(static_cast<int64_t>(streams.size()) == k, "sample_blocks_many: ", k, " batches but ",
              streams.size(), " streams");
  TORCH_CHECK(k < (int64_t{1} << (63 - kBatchShift)), "sample_blocks_many: too many batches in one call");
  for (const auto& s : seeds) {
    TORCH_CHECK(s.dim() == 1 && s.scalar_type() == at::kLong && s.device() == rowptr.device(),
                "sample_blocks_many: each batch's seeds must be a 1-D int64 tensor on ", rowptr.device());
  }
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.scalar_type() == at::kLong && rowptr.is_contiguous() &&
                  col.device() == rowptr.device() && col.dim() == 1 && col.is_contiguous() &&
                  (col.scalar_type() == at::kLong || col.scalar_type() == at::kInt),
              "sample_blocks_many: rowptr (contiguous int64) and col (contiguous int32/int64) on one device");
  const int64_t num_nodes = rowptr.numel() - 1;
  TORCH_CHECK(num_nodes < (int64_t{1} << kBatchShift), "sample_blocks_many: more than 2^40 nodes");
  const auto opts = rowptr.options();
  std::vector<int64_t> nb(k);   // each batch's nodes so far (its targets at each hop)
  for (int64_t b = 0; b < k; ++b) {
    nb[b] = seeds[b].numel();
  }
  at::Tensor nodes = at::cat(seeds);
  const auto keys_of = [&](const at::Tensor& part, int64_t b) { return part + (b << kBatchShift); };
  if (nodes.numel() > 0) {   // distinct within each batch, in range: one copy of three values
    std::vector<at::Tensor> keyed;
    for (int64_t b = 0; b < k; ++b) {
      keyed.push_back(keys_of(seeds[b], b));
    }
    const at::Tensor distinct = std::get<0>(at::_unique2(at::cat(keyed), false, false, false));
    const auto facts = to_host(at::stack({nodes.min(), nodes.max(),
                                          at::scalar_tensor(distinct.numel(), opts)}));
    check_seed_facts(facts[0], facts[1], facts[2] != nodes.numel(), num_nodes);
  }
  std::vector<SampledBatch> out(k);
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t fanout = fanouts[h];
    const int64_t n = nodes.numel();
    const std::vector<int64_t> node_at = exclusive_sum(nb);
    const auto [begin, degree, ends, offsets] = hop_rows(rowptr, nodes, fanout);
    // each batch's edge count: the running count at its last target, one copy for all
    std::vector<int64_t> edges_at(k + 1, 0);
    if (n > 0) {
      std::vector<int64_t> last;
      for (int64_t b = 0; b < k; ++b) {
        last.push_back(std::max<int64_t>(node_at[b + 1] - 1, 0));
      }
      const auto running = to_host(ends.index_select(0, at::tensor(last, opts.device(c10::kCPU)).to(opts.device())));
      for (int64_t b = 0; b < k; ++b) {
        edges_at[b + 1] = nb[b] > 0 ? running[b] : edges_at[b];
      }
    }
    const int64_t e = edges_at[k];
    at::Tensor slots = at::empty({e}, opts);
    at::Tensor src = at::empty({e}, opts);
    at::Tensor dst = at::empty({e}, opts);
    for (int64_t b = 0; b < k; ++b) {   // each batch from its own streams; dst numbers its own targets
      if (edges_at[b + 1] > edges_at[b]) {
        const int64_t lo = node_at[b], hi = node_at[b + 1];
        draw_hop(col, begin.slice(0, lo, hi), degree.slice(0, lo, hi), fanout, offsets.slice(0, lo, hi), seed,
                 target_stream(static_cast<uint64_t>(streams[b]), static_cast<int64_t>(h), 0), slots, src, dst);
      }
    }
    std::vector<at::Tensor> parts;
    for (int64_t b = 0; b < k; ++b) {
      parts.push_back(keys_of(nodes.slice(0, node_at[b], node_at[b + 1]), b));
      parts.push_back(keys_of(src.slice(0, edges_at[b], edges_at[b + 1]), b));
    }
    const at::Tensor all = at::cat(parts);
    const Relabelled r = hash_relabel_enabled() ? relabel_by_hash(all) : relabel_by_sort(all, false);
    const at::Tensor batch_of = at::bitwise_right_shift(r.nodes, kBatchShift);   // no wait: not bincount
    const std::vector<int64_t> u = to_host(at::zeros({k}, opts).index_add_(0, batch_of, at::ones_like(batch_of)));
    const std::vector<int64_t> u_at = exclusive_sum(u);
    int64_t at_pos = 0;
    for (int64_t b = 0; b < k; ++b) {
      const int64_t e_lo = edges_at[b], e_b = edges_at[b + 1] - edges_at[b];
      const at::Tensor src_local = r.local.slice(0, at_pos + nb[b], at_pos + nb[b] + e_b) - u_at[b];
      Hop hop;
      hop.edge_index = at::stack({src_local, dst.slice(0, e_lo, e_lo + e_b)});
      if (return_slots) {
        hop.slots = slots.slice(0, e_lo, e_lo + e_b).clone();
      }
      hop.n_src = u[b];
      hop.n_dst = nb[b];
      out[b].hops.push_back(std::move(hop));
      at_pos += nb[b] + e_b;
    }
    nodes = at::bitwise_and(r.nodes, (int64_t{1} << kBatchShift) - 1);
    nb = u;
  }
  const std::vector<int64_t> node_at = exclusive_sum(nb);
  for (int64_t b = 0; b < k; ++b) {
    out[b].n_id = nodes.slice(0, node_at[b], node_at[b + 1]);
  }
  return out;
}

} // namespace torch_direct::sampler
