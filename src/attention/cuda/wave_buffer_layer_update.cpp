// WaveBufferLayer's index update during decode (include/retroinfer/wave_buffer.h append(); docs/wave-buffer.md
// "Index updates during decode"): the oldest update_tokens tokens of the steady tail become update_clusters
// clusters exactly as RetroLayer::append makes them on the GPU tier, so that the host tier stays equal to
// the GPU tier through updates.
//
// The clustering: a RetroLayer of no sinks and no window is built over one token of the block (nothing
// indexed: tokens_per_cluster 2 > 1 token) and appended to update_tokens tokens, which runs
// RetroLayer::Impl::update over the block: the same k-means launches (one segment, update_clusters
// clusters, the block's own mean), the same outlier split (round(f * update_tokens) per head) on the same
// rows as the GPU tier's update of the same tokens, so the new clusters' bf16 centroids, value sums, sizes
// and members are the GPU tier's bit for bit. Its K/V are the block's rows in the layer's steady zone
// (a view: k = steady_k + first block row, kv_stride = steady_cap).
#include <algorithm>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cuda_check.h"
#include "attention/cuda/layer_common.h"
#include "attention/cuda/wave_buffer_layer_impl.h"

namespace retroinfer::cuda {

namespace {

// [H, old_cols] bytes-per-column rows of `buf` into a new [H, new_cols] buffer (the first old_cols columns of
// each row; the rest uninitialised). Asynchronous on st; the old buffer goes to `retired`.
DeviceBuffer widen(const DeviceBuffer& buf, int H, size_t old_row, size_t new_row, cudaStream_t st) {
  DeviceBuffer nb(std::max<size_t>(size_t(H) * new_row, 16));
  if (old_row > 0)
    RETROINFER_CUDA_CHECK(
        cudaMemcpy2DAsync(nb.data(), new_row, buf.data(), old_row, old_row, size_t(H), cudaMemcpyDeviceToDevice, st));
  return nb;
}

template <typename T>
DeviceBuffer upload_async(const std::vector<T>& v, cudaStream_t st) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty())
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st));
  return b;
}

}  // namespace

// One index update: the steps below in the order they run (each described at its definition; the
// asynchronous ones on st, whose buffers the synchronisation after step 7 retires).
void WaveBufferLayer::Impl::index_update(cudaStream_t st) {
  auto& m = *this;
  const int64_t U = m.cfg.update_tokens;
  const int Cu = m.cfg.update_clusters;
  // Steady row of token idx_end (the block's first token): after the sinks and the outliers.
  const int64_t row0 = m.idx_begin + m.n_out;
  RETROINFER_CHECK(m.steady_rows >= row0 + U, "WaveBufferLayer: index update with ", m.steady_rows,
                   " steady rows, the block needs rows [", row0, ", ", row0 + U, ") (internal error)");
  // Steps in flight (on any stream) read the tables, the steady zone and the execution buffer.
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
  RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());
  m.manager->check();
  m.override_step = -1;  // an override's ids issued ahead are for the tables before this update

  // 1. The block's clusters, by RetroLayer's update code over the block's steady rows.
  const BlockIndex b = m.cluster_block(row0, st);

  // 2. Host tables (throws, changing nothing, when the heads cluster different token counts).
  const int C0 = m.C;
  const int64_t per0 = m.per_head, nidx0 = m.n_idx, slots0 = m.slot_stride, store_rows0 = m.tab.store_rows;
  m.tab.append_block(Cu, b.bsizes);
  const int C1 = m.tab.clusters;
  const int64_t per1 = m.tab.per_head;

  // 3. The store's tail: grow it if the tail room is short (synchronous copy of the rows in use).
  m.grow_store(store_rows0);

  // 4. Device tables, widened from [H, C0] to [H, C1] (old columns copied, new ones uploaded).
  std::vector<DeviceBuffer> retired;  // read by the copies below until the final synchronisation
  m.widen_cluster_tables(b, C0, per0, nidx0, slots0, retired, st);
  m.upload_index_tables(retired, st);

  // 5. The block's clusters into the store's tail, in cluster order, from the block's steady rows.
  m.fill_store_tail(b, C0, row0, retired, st);

  // 6. The steady zone without the block: [sinks | outliers | block outliers | tail past the block].
  m.remove_block_rows(b, retired, st);

  // 7. Counts and budgets of the grown index (RetroLayer::Impl::update / size_workspace).
  m.C = C1;
  m.n_idx = nidx0 + U;
  m.n_out += b.o_blk;
  m.per_head = per1;
  const ZoneCounts z = zone_counts(C1, m.cfg);
  m.n_r = z.n_retrieval;
  m.n_e = z.n_estimation;
  m.grow_execution_buffer(retired, st);
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));  // the uploads' sources and the retired buffers
  retired.clear();
  m.size_decode_workspace();

  // 8. The manager: the new clusters, before the first step that can select them; a ring too narrow for
  // the grown n_r is rebuilt (the manager and the device page table restart empty).
  m.add_block_to_manager(b);
  m.drop_graph();
  ++m.updates;
  RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());
}

// 1. The block's clusters: a RetroLayer of no sinks and no window over the block's steady rows (a view of
// steady_k / steady_v), built over one token and appended to U, so that it runs one update; its index is
// downloaded head by head. The block layer's buffers are freed on return (its work is done: debug_state
// synchronised).
WaveBufferLayer::Impl::BlockIndex WaveBufferLayer::Impl::cluster_block(int64_t row0, cudaStream_t st) {
  auto& m = *this;
  const int64_t U = m.cfg.update_tokens;
  const int Cu = m.cfg.update_clusters;
  AttentionConfig bc = m.cfg;
  bc.sink_tokens = 0;
  bc.window_tokens = 0;
  bc.tokens_per_cluster = 2;  // build() over 1 token indexes nothing; append(U) then runs one update
  BlockIndex b;
  b.cent.resize(m.int8_on ? 0 : size_t(H) * Cu * D);  // int8: no bf16 centroids
  b.vsum.resize(size_t(H) * Cu * D);
  b.cq8.resize(m.int8_on ? size_t(H) * Cu * D : 0);
  b.cscl.resize(m.int8_on ? size_t(H) * Cu : 0);
  b.bsizes.resize(size_t(H) * Cu);
  b.boffs.resize(size_t(H) * (Cu + 1));
  RetroLayer blk(shape, bc, num_seqs);
  blk.set_keep_f32_index(false);
  blk.set_keep_assignment(false);
  blk.set_outlier_zone(m.outliers_on);
  blk.set_build_group_seqs(0);
  const uint16_t* bk = m.steady_k.as<uint16_t>() + size_t(row0) * D;
  const uint16_t* bv = m.steady_v.as<uint16_t>() + size_t(row0) * D;
  blk.build(bk, bv, 1, m.steady_cap, st);
  blk.append(U, st);
  RETROINFER_CHECK(blk.num_updates() == 1 && blk.num_clusters() == Cu && blk.indexed_begin() == 0 &&
                       blk.indexed_tokens() == U,
                   "WaveBufferLayer: the block's clustering made ", blk.num_clusters(), " clusters over ",
                   blk.indexed_tokens(), " tokens in ", blk.num_updates(), " updates, expected ", Cu, " over ", U,
                   " in 1 (internal error)");
  for (int h = 0; h < H; ++h) {
    const RetroDebugState s = blk.debug_state(h);
    const std::vector<int32_t> out = blk.outliers(h);
    if (b.o_blk < 0) {
      b.o_blk = int64_t(out.size());
      b.bmem.resize(size_t(H) * size_t(U - b.o_blk));
      b.bout.resize(size_t(H) * size_t(b.o_blk));
    }
    RETROINFER_CHECK(int64_t(out.size()) == b.o_blk, "WaveBufferLayer: index update: flat head ", h, " has ",
                     out.size(), " outlier tokens in the block, head 0 ", b.o_blk, "; the wave buffer needs the same ",
                     "count in every head (set outlier_fraction 0 for such K/V)");
    RETROINFER_CHECK(int64_t(s.members.size()) == U - b.o_blk && int64_t(s.sizes.size()) == Cu &&
                         int64_t(s.offsets.size()) == Cu + 1,
                     "WaveBufferLayer: index update: flat head ", h, " block index of ", s.members.size(),
                     " members / ", s.sizes.size(), " clusters (internal error)");
    if (m.int8_on) copy_int8_centroids(s, h, Cu, D, b.cq8, b.cscl, "WaveBufferLayer: index update");
    else std::copy(s.centroids_bf16.begin(), s.centroids_bf16.end(), b.cent.begin() + size_t(h) * Cu * D);
    std::copy(s.value_sums_bf16.begin(), s.value_sums_bf16.end(), b.vsum.begin() + size_t(h) * Cu * D);
    std::copy(s.sizes.begin(), s.sizes.end(), b.bsizes.begin() + size_t(h) * Cu);
    std::copy(s.offsets.begin(), s.offsets.end(), b.boffs.begin() + size_t(h) * (Cu + 1));
    for (size_t j = 0; j < s.members.size(); ++j) {
      RETROINFER_CHECK(s.members[j] >= 0 && s.members[j] < U, "WaveBufferLayer: index update: member ",
                       s.members[j], " outside the block of ", U, " (internal error)");
      b.bmem[size_t(h) * size_t(U - b.o_blk) + j] = static_cast<uint32_t>(s.members[j]);
    }
    std::copy(out.begin(), out.end(), b.bout.begin() + size_t(h) * size_t(b.o_blk));
  }
  return b;
}

// 3. The store reallocated with 1/4 more rows (at least tab.store_rows) when tab.store_rows outgrew it; the
// store_rows0 rows in use before the block are copied synchronously.
void WaveBufferLayer::Impl::grow_store(int64_t store_rows0) {
  auto& m = *this;
  if (m.tab.store_rows <= m.store_cap_rows) return;
  const int64_t cap = std::max(m.tab.store_rows, m.store_cap_rows + m.store_cap_rows / 4);
  // The rows in use before this block: one range for a bf16 store; for an int8 or int4 store the quantised
  // rows at the start and their scales after the cap's value bytes (which move with the cap).
  struct Range {
    size_t src, dst, bytes;
  };
  std::vector<Range> ranges;
  if (m.wcfg.store_dtype == StoreDtype::kBf16) {
    ranges.push_back({0, 0, size_t(store_rows0) * 4 * D});
  } else {
    const size_t values = m.store_value_bytes(store_rows0);
    ranges.push_back({0, 0, values});
    ranges.push_back({m.store_value_bytes(m.store_cap_rows), m.store_value_bytes(cap),
                      size_t(store_rows0) * size_t(store_token_bytes(m.wcfg.store_dtype, D)) - values});
  }
  const size_t new_bytes = m.store_alloc_bytes(cap);
  if (m.wcfg.tier == KvTier::kGpu) {
    DeviceBuffer nb(new_bytes);
    for (const Range& r : ranges)
      if (r.bytes > 0)
        RETROINFER_CUDA_CHECK(cudaMemcpy(static_cast<char*>(nb.data()) + r.dst,
                                         static_cast<const char*>(m.store_dev.data()) + r.src, r.bytes,
                                         cudaMemcpyDeviceToDevice));
    m.store_dev = std::move(nb);
    m.point_store(m.store_dev.data(), cap);
  } else {
    PinnedHost nb(new_bytes);
    for (const Range& r : ranges)
      if (r.bytes > 0)
        std::memcpy(static_cast<char*>(nb.host()) + r.dst, static_cast<const char*>(m.store_host.host()) + r.src,
                    r.bytes);
    m.store_host = std::move(nb);
    m.point_store(m.store_host.device(), cap);
  }
  m.store_cap_rows = cap;
}

// 4a. The per-cluster device tables widened from C0 to tab.clusters columns per head (the old columns copied
// on the device, the block's uploaded): centroids, value sums, an int4 store's base rows (the block's
// columns left to its fill), members (per0 to tab.per_head; the block's
// tokens relative to idx_begin, nidx0 tokens after it), residency (the new clusters not resident) and, when
// the slot stride grew from slots0, the page slots. Asynchronous on st; the old buffers go to `retired`.
void WaveBufferLayer::Impl::widen_cluster_tables(const BlockIndex& b, int C0, int64_t per0, int64_t nidx0,
                                                 int64_t slots0, std::vector<DeviceBuffer>& retired,
                                                 cudaStream_t st) {
  auto& m = *this;
  const int Cu = m.cfg.update_clusters;
  const int C1 = m.tab.clusters;
  const int64_t per1 = m.tab.per_head;
  auto put_cols = [&](DeviceBuffer& buf, const void* blk, size_t old_row, size_t blk_row) {
    DeviceBuffer nb = widen(buf, H, old_row, old_row + blk_row, st);
    RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(nb.data()) + old_row, old_row + blk_row, blk, blk_row,
                                            blk_row, size_t(H), cudaMemcpyHostToDevice, st));
    retired.push_back(std::move(buf));
    buf = std::move(nb);
  };
  if (!m.int8_on) put_cols(m.centroids_bf16, b.cent.data(), size_t(C0) * D * 2, size_t(Cu) * D * 2);
  put_cols(m.value_sums_bf16, b.vsum.data(), size_t(C0) * D * 2, size_t(Cu) * D * 2);
  if (m.store_base.bytes() > 0) {  // an int4 store's base rows: the block's columns are written by its fill
    DeviceBuffer nb = widen(m.store_base, H, m.base_bytes(C0), m.base_bytes(C1), st);
    retired.push_back(std::move(m.store_base));
    m.store_base = std::move(nb);
  }
  if (m.int8_on) {
    put_cols(m.centroids_q8, b.cq8.data(), size_t(C0) * D, size_t(Cu) * D);
    put_cols(m.centroid_scale, b.cscl.data(), size_t(C0) * 4, size_t(Cu) * 4);
  }
  // Members: the block's tokens relative to idx_begin (the block starts nidx0 tokens after it).
  std::vector<uint32_t> bmem_abs(b.bmem);
  for (auto& x : bmem_abs) x += static_cast<uint32_t>(nidx0);
  put_cols(m.members, bmem_abs.data(), size_t(per0) * 4, size_t(per1 - per0) * 4);
  {  // residency: the new clusters are not resident
    DeviceBuffer nb = widen(m.resident, H, size_t(C0), size_t(C1), st);
    RETROINFER_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(nb.data()) + C0, size_t(C1), 0, size_t(Cu), size_t(H), st));
    retired.push_back(std::move(m.resident));
    m.resident = std::move(nb);
  }
  if (m.tab.slot_stride > slots0) {  // page slots: the new clusters' slots after the old ones
    DeviceBuffer nb(std::max<size_t>(size_t(H) * m.tab.slot_stride * 4, 16));
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(nb.data(), 0xff, nb.bytes(), st));
    if (slots0 > 0)
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(nb.data(), size_t(m.tab.slot_stride) * 4, m.cluster_pages.data(),
                                              size_t(slots0) * 4, size_t(slots0) * 4, size_t(H),
                                              cudaMemcpyDeviceToDevice, st));
    retired.push_back(std::move(m.cluster_pages));
    m.cluster_pages = std::move(nb);
  }
  m.slot_stride = m.tab.slot_stride;
}

// 4b. The tables derived from the grown host tables (sizes, CSR offsets per head and absolute, slot
// starts, store rows) uploaded anew. Asynchronous on st; the old buffers go to `retired`.
void WaveBufferLayer::Impl::upload_index_tables(std::vector<DeviceBuffer>& retired, cudaStream_t st) {
  auto& m = *this;
  retired.push_back(std::move(m.sizes));
  retired.push_back(std::move(m.offsets_head));
  retired.push_back(std::move(m.offsets_abs));
  retired.push_back(std::move(m.slot_begin));
  retired.push_back(std::move(m.store_at));
  m.sizes = upload_async(m.tab.sizes, st);
  m.offsets_head = upload_async(m.tab.offsets, st);
  const std::vector<int32_t> offs_abs = m.tab.offsets_abs();
  m.offsets_abs = upload_async(offs_abs, st);
  m.slot_begin = upload_async(m.tab.slot_begin, st);
  m.store_at = upload_async(m.tab.store_at, st);
}

// 5. The block's clusters (store rows from tab.store_at past the C0 old clusters) filled into the store by
// wave_store_fill from the block's steady rows, which start at row0. Asynchronous on st; the uploaded
// block tables go to `retired`.
void WaveBufferLayer::Impl::fill_store_tail(const BlockIndex& b, int C0, int64_t row0,
                                            std::vector<DeviceBuffer>& retired, cudaStream_t st) {
  auto& m = *this;
  const int64_t U = m.cfg.update_tokens;
  const int Cu = m.cfg.update_clusters;
  const int C1 = m.tab.clusters;
  std::vector<int64_t> bat(size_t(H) * Cu);
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < Cu; ++j) bat[size_t(h) * Cu + j] = m.tab.store_at[size_t(h) * C1 + C0 + j];
  DeviceBuffer d_sizes = upload_async(b.bsizes, st), d_offs = upload_async(b.boffs, st), d_at = upload_async(bat, st);
  DeviceBuffer d_mem = upload_async(b.bmem, st);
  detail::StoreFillParams fp;
  fp.t = m.tables();
  fp.t.num_clusters = Cu;  // a view of the block's clusters
  fp.t.n_idx = U - b.o_blk;
  fp.t.sizes = d_sizes.as<int>();
  fp.t.offsets = d_offs.as<int>();
  fp.t.store_at = d_at.as<int64_t>();
  m.set_fill_store(fp, C1, C0);
  fp.k = m.steady_k.as<uint16_t>();
  fp.v = m.steady_v.as<uint16_t>();
  fp.kv_stride = m.steady_cap;
  fp.idx_begin = row0;
  fp.members = d_mem.as<uint32_t>();
  detail::launch_check(detail::wave_store_fill(fp, st), "wave_store_fill(update)", st);
  retired.push_back(std::move(d_sizes));
  retired.push_back(std::move(d_offs));
  retired.push_back(std::move(d_at));
  retired.push_back(std::move(d_mem));
}

// 6. The steady zone rebuilt without the block's clustered rows (wave_rows_gather into new buffers of the
// same capacity): [sinks | outliers | block outliers | tail past the block]. Asynchronous on st; the old
// buffers go to `retired`.
void WaveBufferLayer::Impl::remove_block_rows(const BlockIndex& b, std::vector<DeviceBuffer>& retired,
                                              cudaStream_t st) {
  auto& m = *this;
  const int64_t U = m.cfg.update_tokens;
  const size_t row_bytes = size_t(D) * 2;
  const std::vector<int32_t> map =
      buffer::steady_rows_after_update(H, m.idx_begin, m.n_out, m.steady_rows, U, b.o_blk, b.bout);
  const int64_t rows1 = m.steady_rows - U + b.o_blk;
  DeviceBuffer nk(std::max<size_t>(size_t(H) * m.steady_cap * row_bytes, 16));
  DeviceBuffer nv(std::max<size_t>(size_t(H) * m.steady_cap * row_bytes, 16));
  DeviceBuffer d_map = upload_async(map, st);
  detail::RowGatherParams gp;
  gp.src_k = m.steady_k.as<uint16_t>();
  gp.src_v = m.steady_v.as<uint16_t>();
  gp.src_cap = m.steady_cap;
  gp.dst_k = nk.as<uint16_t>();
  gp.dst_v = nv.as<uint16_t>();
  gp.dst_cap = m.steady_cap;
  gp.map = d_map.as<int>();
  gp.rows = rows1;
  gp.num_heads = H;
  gp.head_dim = D;
  detail::launch_check(detail::wave_rows_gather(gp, st), "wave_rows_gather", st);
  retired.push_back(std::move(d_map));
  retired.push_back(std::move(m.steady_k));
  retired.push_back(std::move(m.steady_v));
  m.steady_k = std::move(nk);
  m.steady_v = std::move(nv);
  m.steady_rows = static_cast<int>(rows1);
}

// 7. Execution buffer: the steady capacity plus the n_r largest clusters of any head; its rows are kept (the
// manager's pending admissions copy from the last step's rows), the identity list grown with it.
// Asynchronous on st; the old buffers go to `retired`.
void WaveBufferLayer::Impl::grow_execution_buffer(std::vector<DeviceBuffer>& retired, cudaStream_t st) {
  auto& m = *this;
  const size_t row_bytes = size_t(D) * 2;
  const int64_t need = m.steady_cap + m.tab.retrieval_capacity(m.n_r);
  if (need > m.list_cap) {
    for (DeviceBuffer* b : {&m.exec_k, &m.exec_v}) {
      DeviceBuffer nb = widen(*b, H, size_t(m.list_cap) * row_bytes, size_t(need) * row_bytes, st);
      retired.push_back(std::move(*b));
      *b = std::move(nb);
    }
    std::vector<int32_t> ids(static_cast<size_t>(need));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    retired.push_back(std::move(m.identity));
    m.identity = upload_async(ids, st);
    m.list_cap = need;
  }
}

// 8. The block's clusters added to the manager; a ring too narrow for the grown n_r is rebuilt instead
// (the manager and the device page table restart empty).
void WaveBufferLayer::Impl::add_block_to_manager(const BlockIndex& b) {
  auto& m = *this;
  const int Cu = m.cfg.update_clusters;
  if (m.n_r > m.layout.k) {
    m.manager->stop();  // rethrows its error
    m.stats_base += m.manager->stats();
    m.steps_base = m.steps;
    m.start_manager(std::max(m.n_r, 2 * m.layout.k));
  } else {
    for (int h = 0; h < H; ++h)
      m.manager->add_clusters(h, std::span<const int32_t>(b.bsizes.data() + size_t(h) * Cu, size_t(Cu)));
  }
}

}  // namespace retroinfer::cuda
