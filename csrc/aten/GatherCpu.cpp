// Row gather from a unified table into a CPU tensor (rule R2), multi-threaded,
// with the dtype cast fused into the copy of each row. Indices are checked
// before any row is read.

#include "Experimental.h"
#include "ParallelChunks.h"
#include "Placement.h"
#include "UnifiedKernels.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace at::native::unified {
namespace {

template <typename index_t>
void check_indices(const index_t* idx, int64_t n, int64_t rows, bool allow_negative, int64_t max_threads) {
  if (n == 0) {  // nothing to read (a table without rows included)
    return;
  }
  // min/max over the pool's threads: one serial pass over a 400K index costs
  // a sizeable part of the gather it guards.
  std::mutex m;
  index_t lo = idx[0];
  index_t hi = idx[0];
  parallel_chunks(n, 65536, max_threads, [&](int64_t b, int64_t e) {
    index_t l = idx[b];
    index_t h = idx[b];
    for (int64_t i = b + 1; i < e; ++i) {
      l = std::min(l, idx[i]);
      h = std::max(h, idx[i]);
    }
    std::lock_guard<std::mutex> g(m);
    lo = std::min(lo, l);
    hi = std::max(hi, h);
  });
  check_index_bounds(static_cast<int64_t>(lo), static_cast<int64_t>(hi), rows, "gather",
                     allow_negative);
}

// The table row an index names (negative ones count from the end).
template <typename index_t>
inline int64_t row_of(index_t i, int64_t rows) {
  return i < 0 ? static_cast<int64_t>(i) + rows : static_cast<int64_t>(i);
}

// Rows ahead of the copy whose cache lines are requested early (0: none).
// Random rows of a large table each miss the caches (and often the TLB); a
// loop that copies one row at a time may leave that latency exposed. Off
// unless the experimental cpu_gather_prefetch gives a distance: on the 16-core
// H200 machine (experiments/hybrid_cpu_path_probe.py, 32 GB table, 400K random
// rows) 16 rows ahead sped the CPU-only gather of 128 B rows up 1.6x in one
// run and not at all in another, slowed 512 B rows, and slowed the hybrid
// gather's CPU part at every width (128 B: 14.7 GB/s against 20.1 without).
int64_t prefetch_distance() {
  return torch_direct::experimental::get_int("cpu_gather_prefetch", 0, 0);
}
constexpr int64_t kPrefetchMaxLines = 8;  // at most 512 B of a row

// Whether rows are written with streaming (non-temporal) stores (experimental
// cpu_gather_stores=streaming). A plain store first reads the line it writes
// into the cache; the hybrid gather's staging is only read again by the copy
// engine, so those reads are a third of the memory traffic of 128 B rows.
// Rows whose size or address is not a multiple of 16 bytes are copied plainly.
bool streaming_stores() {
  const auto v = torch_direct::experimental::get("cpu_gather_stores");
  TORCH_CHECK(!v || *v == "plain" || *v == "streaming", torch_direct::experimental::kVariable,
              ": cpu_gather_stores must be plain or streaming, not '", *v, "'");
#if defined(__SSE2__)
  return v && *v == "streaming";
#else
  return false;
#endif
}

inline void copy_row_streaming(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  for (size_t j = 0; j < bytes; j += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + j),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j)));
  }
#else
  std::memcpy(dst, src, bytes);
#endif
}

template <typename index_t>
inline void prefetch_row(const char* base, index_t i, int64_t rows, int64_t stride_bytes,
                         size_t row_bytes) {
  const char* p = base + row_of(i, rows) * stride_bytes;
  const int64_t lines = std::min<int64_t>(kPrefetchMaxLines, (static_cast<int64_t>(row_bytes) + 63) / 64);
  for (int64_t l = 0; l < lines; ++l) {
    __builtin_prefetch(p + l * 64, 0, 0);
  }
}

// Each thread's rows in pieces of about this many bytes of out, each handed to
// after_chunk as soon as it is written: the hybrid gather's copies to the GPU
// then start while every thread is still gathering (whole per-thread chunks
// would all finish at about the same time, leaving nothing to overlap).
constexpr int64_t kAfterChunkBytes = int64_t(1) << 20;

// Runs copy(b, e) over [0, n) on the pool, and after_chunk (if any) after each
// piece of it.
// The experimental hybrid_piece_kb sets another size (fewer, larger copies: fewer calls into the
// CUDA driver from the pool's threads; smaller: more of the copies overlapped).
inline int64_t after_chunk_bytes() {
  return torch_direct::experimental::get_int("hybrid_piece_kb", kAfterChunkBytes >> 10, 16) << 10;
}

template <typename F>
void for_pieces(int64_t n, int64_t grain, int64_t max_threads, int64_t out_row_bytes,
                const std::function<void(int64_t, int64_t)>& after_chunk, const F& copy) {
  const int64_t piece_bytes = after_chunk ? after_chunk_bytes() : kAfterChunkBytes;
  const int64_t piece = std::max<int64_t>(1, piece_bytes / std::max<int64_t>(out_row_bytes, 1));
  parallel_chunks(n, grain, max_threads, [&](int64_t b, int64_t e) {
    if (!after_chunk) {
      copy(b, e, e);
      return;
    }
    for (int64_t s = b; s < e; s += piece) {
      const int64_t t = std::min(e, s + piece);
      copy(s, t, e);
      after_chunk(s, t);
    }
  });
}

template <typename index_t>
void gather_rows(const at::Tensor& table, const index_t* idx, int64_t n, at::Tensor& out,
                 int64_t max_threads, const std::function<void(int64_t, int64_t)>& after_chunk) {
  const int64_t rows = table.size(0);
  const int64_t width = row_width(table);
  const int64_t in_stride = table.stride(0);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1));
  const int64_t out_row_bytes = width * out.element_size();
  if (out.scalar_type() == table.scalar_type()) {
    const size_t row_bytes = static_cast<size_t>(width) * table.element_size();
    const char* base = static_cast<const char*>(table.const_data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const int64_t stride_bytes = in_stride * table.element_size();
    const int64_t ahead = prefetch_distance();
    const bool stream = streaming_stores() && row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    // rows [b, e) of a thread's chunk that ends at `end` (prefetch runs on into the next piece)
    for_pieces(n, grain, max_threads, out_row_bytes, after_chunk, [&](int64_t b, int64_t e, int64_t end) {
      for (int64_t i = b; i < e; ++i) {
        if (ahead > 0 && i + ahead < end) {
          prefetch_row(base, idx[i + ahead], rows, stride_bytes, row_bytes);
        }
        const char* src = base + row_of(idx[i], rows) * stride_bytes;
        if (stream) {
          copy_row_streaming(dst + i * row_bytes, src, row_bytes);
        } else {
          std::memcpy(dst + i * row_bytes, src, row_bytes);
        }
      }
#if defined(__SSE2__)
      if (stream) {
        _mm_sfence();  // the rows are in memory before after_chunk hands them to a copy
      }
#endif
    });
    return;
  }
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, table.scalar_type(), "gather_in", [&] {
    using in_t = scalar_t;
    const in_t* base = table.const_data_ptr<in_t>();
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(), "gather_out", [&] {
      scalar_t* dst = out.data_ptr<scalar_t>();
      for_pieces(n, grain, max_threads, out_row_bytes, after_chunk, [&](int64_t b, int64_t e, int64_t) {
        for (int64_t i = b; i < e; ++i) {
          const in_t* src = base + row_of(idx[i], rows) * in_stride;
          scalar_t* o = dst + i * width;
          for (int64_t k = 0; k < width; ++k) {
            o[k] = static_cast<scalar_t>(src[k]);
          }
        }
      });
    });
  });
}

} // namespace

int64_t row_width(const at::Tensor& table) {
  int64_t w = 1;
  for (int64_t d = 1; d < table.dim(); ++d) {
    w *= table.size(d);
  }
  return w;
}

bool hybrid_copies_ordered() {
  namespace ex = torch_direct::experimental;
  const auto v = ex::get("hybrid_copies");
  TORCH_CHECK(!v || *v == "wait" || *v == "ordered", ex::kVariable, ": hybrid_copies must be wait or ordered, not '",
              *v, "'");
  return v && *v == "ordered";
}

void check_gather_settings() {
  namespace ex = torch_direct::experimental;
  if (const auto k = ex::get("gather_kernel")) {
    TORCH_CHECK(*k == "rowblock" || *k == "grid", ex::kVariable, ": gather_kernel must be rowblock or grid, not '",
                *k, "'");
  }
  const auto own = ex::get("gather_own_pool");
  TORCH_CHECK(!own || *own == "0" || *own == "1", ex::kVariable, ": gather_own_pool must be 0 or 1, not '", *own,
              "'");
  ex::get_int("gather_window_rows", 0, 0);
  ex::get_int("gather_max_unit", 16, 1);
  ex::get_int("cpu_gather_prefetch", 0, 0);
  pool_sized_to_largest_call();  // checks cpu_pool_size
  streaming_stores();            // checks cpu_gather_stores
  hybrid_copies_ordered();       // checks hybrid_copies
  after_chunk_bytes();           // checks hybrid_piece_kb
}

bool cpu_gather_on_torch_threads(int64_t max_threads) {
  const auto own = torch_direct::experimental::get("gather_own_pool");
  return (max_threads <= 0 || max_threads >= at::get_num_threads()) && !(own && *own == "1");
}

// out[i, ...] = table[index[i], ...] for a unified `table` whose rows are
// contiguous, a 1-D CPU integer `index` and a contiguous CPU `out` of shape
// (len(index), *table.shape[1:]) in any dtype.
at::Tensor& gather_rows_cpu(const at::Tensor& table, const at::Tensor& index, at::Tensor& out,
                            int64_t max_threads, bool wait_for_gpu, bool allow_negative,
                            bool indices_checked,
                            const std::function<void(int64_t, int64_t)>& after_chunk) {
  check_gather_settings();
  TORCH_CHECK(is_unified(table), "gather_rows_cpu: expected a unified table");
  TORCH_CHECK(index.is_cpu() && index.dim() == 1 &&
                  (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt),
              "gather_rows_cpu: expected a 1-D int32/int64 CPU index");
  TORCH_CHECK(out.is_cpu() && out.is_contiguous(), "gather_rows_cpu: expected a contiguous CPU out");
  TORCH_CHECK(table.dim() >= 1, "gather_rows_cpu: the table needs at least one dimension");
  TORCH_CHECK(table.size(0) == 0 || table.select(0, 0).is_contiguous(),
              "gather_rows_cpu: each row of the table must be contiguous");
  // The hybrid gather reads on the CPU while its own GPU kernel reads the same
  // table (it waited for earlier GPU users itself): a plain host view then.
  const at::Tensor host =
      wait_for_gpu ? alias_as(table, c10::Device(c10::kCPU))
                   : at::from_blob(const_cast<void*>(table.const_data_ptr()), table.sizes(),
                                   table.strides(), table.options().device(c10::kCPU));
  const at::Tensor idx = index.contiguous();
  const int64_t rows = table.size(0);
  TORCH_CHECK(out.numel() == idx.numel() * row_width(table),
              "gather_rows_cpu: out has the wrong number of elements");
  const int64_t n = idx.numel();
  // Rows copied as they are, on all of torch's intra-op threads: index_select
  // does it faster. On the 16-core H200 machine it moved 400K random rows of a
  // 32 GB table into pinned memory at 44 / 47 / 32 GB/s (128 / 256 / 512 B)
  // where our loop moved 23 / 26-28 / 29-30 (experiments/hybrid_cpu_path_probe.py).
  // (One difference: its OpenMP threads wait for work spinning, ours sleep.)
  // The whole call then stays on torch's threads: its bounds check too, and
  // negative indices (which index_select refuses) are counted from the end by
  // one more op there. Work for our pool right after an OpenMP op competes with
  // the OpenMP threads still spinning: on this repository's 2-core machine our
  // loop took 7.8 ms after an aminmax where it took 3.8 with OpenMP's threads
  // set to sleep at once (OMP_WAIT_POLICY=PASSIVE). A cast is index_select
  // into the table's dtype, then one vectorised copy_ (our loop casts element
  // by element: 200K rows of 32 on the 2-core machine, fp32 -> fp16 35.6 ms
  // against 6.0, fp16 -> fp32 29.0 against 2.9). A thread cap
  // below torch's and a caller that wants each piece as it is written
  // (after_chunk) take our loop; so does every call under
  // the experimental gather_own_pool=1 (for experiments and tests of the loop).
  if (n > 0 && rows > 0 && !after_chunk && cpu_gather_on_torch_threads(max_threads)) {
    const auto [lo_t, hi_t] = at::aminmax(idx);
    const int64_t lo = lo_t.item<int64_t>();
    if (!indices_checked) {
      check_index_bounds(lo, hi_t.item<int64_t>(), rows, "gather", allow_negative);
    }
    const at::Tensor rows_idx = lo >= 0 ? idx : at::remainder(idx, rows);  // -1 -> rows - 1
    const int64_t width = row_width(table);
    const at::Tensor src = host.as_strided({rows, width}, {host.stride(0), 1});
    at::Tensor dst = out.view({n, width});
    if (out.scalar_type() == table.scalar_type()) {
      at::index_select_out(dst, src, 0, rows_idx);
    } else {
      dst.copy_(at::index_select(src, 0, rows_idx));
    }
    return out;
  }
  AT_DISPATCH_INDEX_TYPES(idx.scalar_type(), "gather_rows_cpu", [&] {
    if (!indices_checked) {
      check_indices<index_t>(idx.const_data_ptr<index_t>(), n, rows, allow_negative, max_threads);
    }
    gather_rows<index_t>(host, idx.const_data_ptr<index_t>(), n, out, max_threads, after_chunk);
  });
  return out;
}

} // namespace at::native::unified
