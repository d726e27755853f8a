// The CSR relabel on the CPU's threads (Relabel.h).

#include "Relabel.h"

#include "csrc/aten/ParallelChunks.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace torch_direct::sampler {
namespace {

void check_cpu(const at::Tensor& t, const char* name, std::initializer_list<at::ScalarType> types) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() == 1, "relabel_csr: ", name,
              " must be a contiguous 1-D CPU tensor");
  TORCH_CHECK(std::find(types.begin(), types.end(), t.scalar_type()) != types.end(), "relabel_csr: ", name,
              " has dtype ", t.scalar_type());
}

// Rows [r0, r1). False (the rows from the first bad one on left unwritten) where a
// node id is outside [0, n), an old row's length differs from its new one's, or
// a row lies outside the e entries (row starts out of order).
// The rows are taken in blocks: first every old row start of a block (loads
// that do not wait for each other), then the rows, the next rows' column ids
// requested a few rows ahead, so that the reads of random rows overlap.
template <typename col_t>
bool relabel_rows(int64_t r0, int64_t r1, int64_t n, int64_t e, const int64_t* rowptr, const col_t* col, const int64_t* perm,
                  const col_t* inv, const int64_t* rowptr_new, col_t* col_new, const int64_t* eids,
                  int64_t* eids_new) {
  constexpr int64_t kBlock = 256;
  constexpr int64_t kAhead = 8;
  int64_t src[kBlock];
  for (int64_t b = r0; b < r1; b += kBlock) {
    const int64_t m = std::min(kBlock, r1 - b);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t old = perm[b + i];
      if (static_cast<uint64_t>(old) >= static_cast<uint64_t>(n)) {
        return false;
      }
      src[i] = rowptr[old];
      const int64_t len = rowptr_new[b + i + 1] - rowptr_new[b + i];
      if (rowptr[old + 1] - src[i] != len || len < 0 || src[i] < 0 || src[i] > e - len || rowptr_new[b + i] < 0 ||
          rowptr_new[b + i] > e - len) {
        return false;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      if (i + kAhead < m) {
        __builtin_prefetch(col + src[i + kAhead], 0, 0);
      }
      const int64_t dst = rowptr_new[b + i];
      const int64_t len = rowptr_new[b + i + 1] - dst;
      const col_t* from = col + src[i];
      col_t* to = col_new + dst;
      bool inside = true;
      for (int64_t j = 0; j < len; ++j) {
        const auto c = static_cast<int64_t>(from[j]);
        inside &= static_cast<uint64_t>(c) < static_cast<uint64_t>(n);
        to[j] = inv[inside ? c : 0];
      }
      if (!inside) {
        return false;
      }
      if (eids != nullptr) {
        std::copy(eids + src[i], eids + src[i] + len, eids_new + dst);
      }
    }
  }
  return true;
}

} // namespace

void relabel_csr(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& inv,
                 const at::Tensor& rowptr_new, at::Tensor& col_new, const std::optional<at::Tensor>& eids,
                 std::optional<at::Tensor>& eids_new, int64_t row_begin, int64_t row_end, int64_t threads) {
  check_cpu(rowptr, "rowptr", {at::kLong});
  check_cpu(rowptr_new, "rowptr_new", {at::kLong});
  check_cpu(perm, "perm", {at::kLong});
  check_cpu(col, "col", {at::kInt, at::kLong});
  check_cpu(inv, "inv", {col.scalar_type()});
  check_cpu(col_new, "col_new", {col.scalar_type()});
  const int64_t n = perm.numel();
  TORCH_CHECK(rowptr.numel() == n + 1 && rowptr_new.numel() == n + 1 && inv.numel() == n,
              "relabel_csr: rowptr, rowptr_new (n + 1), perm and inv (n) disagree on the node count");
  const int64_t e = col.numel();
  TORCH_CHECK(col_new.numel() == e, "relabel_csr: col_new must have col's length");
  TORCH_CHECK(eids.has_value() == eids_new.has_value(), "relabel_csr: give both edge-id arrays or neither");
  if (eids) {
    check_cpu(*eids, "eids", {at::kLong});
    check_cpu(*eids_new, "eids_new", {at::kLong});
    TORCH_CHECK(eids->numel() == e && eids_new->numel() == e, "relabel_csr: the edge-id arrays must have col's length");
  }
  TORCH_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= n, "relabel_csr: rows [", row_begin, ", ",
              row_end, ") are not within [0, ", n, ")");
  if (row_begin == row_end) {
    return;
  }
  const int64_t* rp = rowptr.data_ptr<int64_t>();
  const int64_t* rpn = rowptr_new.data_ptr<int64_t>();
  TORCH_CHECK(rp[n] == e && rpn[n] == e, "relabel_csr: the row starts do not end at the edge count");
  const int64_t workers = threads > 0 ? threads : at::get_num_threads();
  // Pieces of about equal edge counts (several a thread, for rows of very unequal length):
  // piece p covers the rows that start in its share of the rows' edges [e0, e1).
  const int64_t e0 = rpn[row_begin];
  const int64_t span = rpn[row_end] - e0;
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(row_end - row_begin, workers * 8));
  const int64_t* eid = eids ? eids->data_ptr<int64_t>() : nullptr;
  int64_t* eid_new = eids_new ? eids_new->data_ptr<int64_t>() : nullptr;
  std::atomic<bool> ok{true};
  AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "relabel_csr", [&] {
    const index_t* c = col.data_ptr<index_t>();
    index_t* cn = col_new.data_ptr<index_t>();
    const int64_t* pm = perm.data_ptr<int64_t>();
    const index_t* iv = inv.data_ptr<index_t>();
    at::native::unified::parallel_chunks(pieces, 1, workers, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        // the first row starting at or after each bound (a row longer than a piece is one row)
        const int64_t lo_edge = e0 + span / pieces * p + std::min(p, span % pieces);
        const int64_t hi_edge = e0 + span / pieces * (p + 1) + std::min(p + 1, span % pieces);
        const int64_t* first = rpn + row_begin;
        const int64_t* last = rpn + row_end;
        const int64_t r0 = p == 0 ? row_begin : std::lower_bound(first, last, lo_edge) - rpn;
        const int64_t r1 = p + 1 == pieces ? row_end : std::lower_bound(first, last, hi_edge) - rpn;
        if (!relabel_rows<index_t>(r0, std::max(r0, r1), n, e, rp, c, pm, iv, rpn, cn, eid, eid_new)) {
          ok = false;
          return;
        }
      }
    });
  });
  TORCH_CHECK(ok, "relabel_csr: a node id outside [0, ", n, ") in perm or col, perm's rows do not have the "
              "lengths rowptr_new gives them, or a row lies outside the ", e, " entries");
}

} // namespace torch_direct::sampler
