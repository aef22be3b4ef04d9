// Causal GQA prefill attention for Hopper (sm_90a): warpgroup MMA (wgmma). Same contract, packing of GQA rows,
// causal order and key splits as the portable kernel (prefill_attention.cu, layout and notation in
// prefill_kernels.h; the shared pieces in prefill_common.cuh); head_dim 128 only. This file is compiled for
// sm_90a alone (wgmma does not exist in sm_90's PTX): src/kernels/CMakeLists.txt.
//
// Persistent: one CTA of three warpgroups (384 threads) per multiprocessor takes work items (kPrefillRows = 128 packed
// query rows of one KV head, or a key split of them) in prefill_cta's order from a counter (PrefillParams::work)
// until none is left; its K/V rings run on across items, so the next item's first tiles arrive while the current
// one ends, and no CTA start or end separates the items (H100, 32K, one call: 1.3% fewer cycles than a CTA per
// item). Warpgroup 0 is the producer: it gives up registers (setmaxnreg.dec to 32) and one of its threads takes
// the items from the counter one ahead (prefetching the next item's Q rows into L2), hands each to the consumers
// through two item slots (an index with a full and an empty mbarrier each), copies the item's Q tile (bf16,
// q_bf16) with two tensor-map copies once the consumers' last S product of the previous item is done (the Q
// tile's full and empty mbarriers), and streams K and V tiles of kKeys = kHopperKeys tokens (176, in two stages)
// into two shared-memory rings with tensor-map copies (TMA: 2 boxes of kKeys tokens x 64 dims per K or V tile,
// completing on that ring's "full" mbarrier of the stage), waiting on the stage's "empty" mbarrier before it
// refills it; K of tile i + 1 is copied before V of tile i, since a K stage comes free as soon as the S product
// that read it is done. Warpgroups 1 and 2 are the consumers (setmaxnreg.inc to 232; 128 x 32 + 256 x 232
// registers fit the 384 x 168 the launch holds), 64 rows each; each warp releases a K stage once S is done and a
// V stage once P V is done. At an item's start a consumer finds its Q in shared memory already: between items
// it only writes its output (in registers until then: writing it during the next item's first S product would
// hold the 64 accumulators through the item change, which ptxas answers with spills).
//
// Per tile a consumer computes S = Q K^T with 8 wgmma m64n176k16 taking Q (bf16, in K's layout) and K from shared
// memory, its online softmax in registers (the accumulator layout of wgmma is the m16n8 one of mma.sync per warp;
// the running max moves only past a slack of kRescaleSlack, so O is seldom rescaled), and O += P V with kKeys / 16
// wgmma m64n128k16 taking P from registers (bf16) and V from shared memory in its natural [token][dim] layout
// (N-major B operand). Two overlaps keep the tensor cores busy while the exponentials run:
//   - within a warpgroup, S of tile i is issued together with O += P V of tile i - 1; the softmax of tile i runs
//     as soon as S is done, while the P V product still runs (P of tile i - 1 stays in its own registers until
//     then; O is rescaled after);
//   - between the two warpgroups, the issue of those products takes turns (named barriers), so that one's
//     softmax runs while the other's products run (H100, one 32K call: 665 TFLOP/s with the turns, 584 without,
//     a figure that moves several percent between repetitions; equal at 128K and in 8K chunks).
// Tokens past the chunk's end (pos0 + n: the tensor maps' extent; Q's: n) arrive as zeros.
//
// Shared-memory tiles (K, V: kKeys tokens x 128 bf16) are two column blocks of 64 elements, each kKeys rows x 128
// bytes, in the 128-byte swizzle of the wgmma descriptors and the tensor-map copies: 16-byte chunk c of row r
// stored at chunk c ^ (r & 7) of the row (every 8-row atom 1024-byte aligned). As the K-major operand (K) a k16
// step is a 32-byte offset inside the atom row; as the N-major operand (V) the two column blocks are the
// leading-dimension stride and 8-token groups the stride-dimension stride.
//
// Precision: that of the portable kernel (q and P rounded to bf16 for the products, f32 accumulation).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/kernel_common.h"
#include "kernels/prefill_common.cuh"
#include "kernels/prefill_kernels.h"
#include "kernels/tensor_map.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kD = 128;
constexpr int kRows = kPrefillRows;   // packed query rows per CTA
constexpr int kConsumerWarps = 8;     // two consumer warpgroups
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
constexpr int kProducerRegisters = 32, kConsumerRegisters = 232;  // 128 x 32 + 256 x 232 <= 384 x 168, the launch's registers
constexpr int kQBlockBytes = kRows * 128;  // one 64-column block of the item's Q rows (consumer wg's: 64 wg on)
constexpr int kQBytes = 2 * kQBlockBytes;   // the item's kRows x 128 bf16 Q tile

// The shared-memory plan of K/V tiles of kKeys = kHopperKeys tokens: two stages of K and of V, each tile two
// 64-column blocks of kKeys rows x 128 bytes; the two consumers' Q; full and empty mbarriers per stage for K and
// for V; + the 1024-byte alignment, within the 227 KiB a CTA may have.
constexpr int kKeys = kHopperKeys;
constexpr int kStages = 2;
constexpr int kBlockBytes = kKeys * 128;     // one 64-column block of a tile
constexpr int kTileBytes = 2 * kBlockBytes;  // a kKeys x 128 bf16 tile
// The work items' hand-over from the producer to the consumers: two slots, each an item index with a full and
// an empty mbarrier.
constexpr int kItemSlots = 2;
// A row's running max moves only when a tile's max passes it by more than this many log2 units
// (online_softmax_row's slack): O's 64 accumulators, rescaled whenever one of the warp's 16 rows raised its max,
// are then rescaled far less often (H100, one 32K call: 1.3% fewer cycles; 4 gives 1.2%).
constexpr float kRescaleSlack = 8.0f;
// + the Q tile's full and empty mbarriers.
constexpr size_t kSmemBytes =
    size_t(kTileBytes) * 2 * kStages + kQBytes + 4 * kStages * 8 + kItemSlots * (2 * 8 + 4) + 2 * 8 + 1024;
static_assert(kKeys == 176, "the S product (wgmma_m64n176k16_ss) and the register plan are for 176-key tiles");
static_assert(kBlockBytes % 1024 == 0, "8-row swizzle atoms stay 1024-byte aligned");
static_assert(kSmemBytes <= 227 * 1024, "a CTA's shared memory");

// K's and V's tensor maps: [Hkv][pos0 + n][128] bf16, boxes of 64 dims x kKeys tokens x 1 head, 128-byte swizzle
// (the tiles' column blocks), zeros past the extent. Q's: [n][Hkv][G][128] bf16 (q_bf16 as [n][Hq][128]), boxes of
// 64 dims x G heads x 1 KV head x T = kRows / G tokens: one box is a column block of an item's packed rows (row
// t G + g at 128 (t G + g) bytes), zeros past the n tokens.
struct HopperMaps {
  CUtensorMap k, v, q;
};

// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"): start
// address, leading- and stride-dimension byte offsets, each >> 4.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lead_bytes >> 4) << 16) | (uint64_t(stride_bytes >> 4) << 32) |
         (uint64_t(1) << 62);
}
// K-major operand (K as [token][dim]): 8-token groups 1024 bytes apart; the leading offset is unused with
// swizzling (1).
__device__ __forceinline__ uint64_t k_major_desc(uint32_t addr) { return smem_desc(addr, 16, 1024); }
// N-major operand (V as [token][dim]): 64-dim column blocks block_bytes apart, 8-token groups 1024 bytes apart.
__device__ __forceinline__ uint64_t n_major_desc(uint32_t addr, uint32_t block_bytes) {
  return smem_desc(addr, block_bytes, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending of this warp's committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
// Keeps the compiler from moving accesses of accumulator registers across an asynchronous wgmma.
template <int kCount>
__device__ __forceinline__ void fence_registers(float* r) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Named barriers among the consumer threads (the warpgroups' turns): arrive does not wait.
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}

// D (+)= A B, m64n128k16, A from registers (per warp the m16n8k16 A fragment of its 16 rows), B from shared
// memory, K-major (kTransB 0) or N-major (kTransB 1); accumulate 0: D = A B.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransB));
}

// S (+)= Q K^T of one k16 step, m64n176k16 (the tile's keys), A and B from shared memory, both K-major;
// accumulate 0: D = A B.
__device__ __forceinline__ void wgmma_m64n176k16_ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// `bytes` (a multiple of 16, 16-byte aligned) at src into L2, asynchronously; nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* src, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// The box at (x, y, z) of 3-D tensor map `map` -> shared memory, completing its bytes on bar.
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar))
      : "memory");
}
// The same for the box at (x, y, z, w) of a 4-D tensor map.
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, int x, int y, int z, int w,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_u32(bar))
      : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    prefill_hopper_kernel(const PrefillParams p, const __grid_constant__ HopperMaps maps, const unsigned items) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kS = kKeys / 2;  // S accumulators per thread (m64nkKeys: kKeys / 8 column blocks x 4)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
  uint8_t* sk0 = smem_raw + pad;
  uint8_t* sv0 = sk0 + kStages * kTileBytes;
  uint8_t* sq0 = sv0 + kStages * kTileBytes;
  uint64_t* full_k = reinterpret_cast<uint64_t*>(sq0 + kQBytes);
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;
  uint64_t* item_full = empty_v + kStages;
  uint64_t* item_empty = item_full + kItemSlots;
  uint64_t* q_full = item_empty + kItemSlots;
  uint64_t* q_empty = q_full + 1;
  unsigned* item_id = reinterpret_cast<unsigned*>(q_empty + 1);
  const uint32_t sk_addr = raw + pad, sv_addr = sk_addr + kStages * kTileBytes,
                 sq_addr = sv_addr + kStages * kTileBytes;

  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&full_k[st], 1);
      mbar_init(&full_v[st], 1);
      mbar_init(&empty_k[st], kConsumerWarps);
      mbar_init(&empty_v[st], kConsumerWarps);
    }
    for (int sl = 0; sl < kItemSlots; ++sl) {
      mbar_init(&item_full[sl], 1);
      mbar_init(&item_empty[sl], kConsumerWarps);
    }
    mbar_init(q_full, 1);
    mbar_init(q_empty, kConsumerWarps);
    mbar_init_fence();
  }
  // Q's padding rows (G = 3, 5, 6, 7: rows T G .. kRows - 1 of both column blocks, which no box writes) are zeros.
  const int q_rows = prefill_tile_tokens(kRows, p.group) * p.group;
  for (int i = threadIdx.x; i < 2 * (kRows - q_rows) * 8; i += kThreads) {
    const int cb = i / ((kRows - q_rows) * 8), r = q_rows + (i / 8) % (kRows - q_rows), ch = i % 8;
    *reinterpret_cast<uint4*>(sq0 + cb * kQBlockBytes + r * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_smem();  // visible to wgmma's reads
  __syncthreads();

  if (threadIdx.x < 128) {
    // Producer: takes the work items from the counter, one ahead, and hands each to the consumers through the
    // item slots; copies the item's Q tile (one box per column block, once every consumer warp's last S product
    // of the previous item is done: q_empty) and its K and V tiles. The rings run on across items: the t-th tile
    // this CTA copies goes into stage t % kStages once every consumer warp released that stage's previous tile
    // (t >= kStages), so the next item's Q and first tiles arrive while the consumers finish the current one.
    // K of the next tile is copied before V of this one: a K stage comes free when the S product that read it is
    // done, a V stage only after the P V product, one softmax later.
    setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      auto copy = [&](const CUtensorMap* map, uint8_t* ring, uint64_t* full, uint64_t* empty, int t, int j, int h) {
        const int st = t % kStages;
        if (t >= kStages) mbar_wait(&empty[st], ((t / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[st], 2 * kBlockBytes);
        uint8_t* dst = ring + st * kTileBytes;
        tma_load_box(dst, map, 0, j * kKeys, h, &full[st]);
        tma_load_box(dst + kBlockBytes, map, 64, j * kKeys, h, &full[st]);
      };
      int copied = 0;  // tiles copied into each ring so far
      int q_loads = 0;  // Q tiles copied so far
      unsigned item = atomicAdd(p.work, 1u);
      for (int k = 0;; ++k) {
        const int sl = k % kItemSlots;
        if (k >= kItemSlots) mbar_wait(&item_empty[sl], ((k / kItemSlots) & 1) ^ 1);
        item_id[sl] = item;
        mbar_arrive(&item_full[sl]);  // releases the slot's write to the consumers
        if (item >= items) break;
        // The next item's Q rows into L2 a whole item ahead of their copy: one bulk prefetch per token (the G
        // query heads of KV head h are contiguous, G x 128 bf16).
        const unsigned next = atomicAdd(p.work, 1u);
        if (next < items) {
          const PrefillCta c = prefill_cta(p, kRows, kKeys, static_cast<int>(next));
          const uint16_t* row = p.q_bf16 + (int64_t(c.r0 / p.group) * p.num_heads_q + c.h * p.group) * kD;
          for (int t = c.r0; t < c.r_end; t += p.group, row += p.num_heads_q * kD) prefetch_l2(row, p.group * kD * 2);
        }
        const PrefillCta c = prefill_cta(p, kRows, kKeys, static_cast<int>(item));
        const int n_it = c.num_tiles - c.j0;
        if (n_it > 0) {
          copy(&maps.k, sk0, full_k, empty_k, copied, c.j0, c.h);
          if (q_loads > 0) mbar_wait(q_empty, (q_loads - 1) & 1);
          mbar_arrive_expect_tx(q_full, 2 * q_rows * 128);
          tma_load_box(sq0, &maps.q, 0, 0, c.h, c.r0 / p.group, q_full);
          tma_load_box(sq0 + kQBlockBytes, &maps.q, 64, 0, c.h, c.r0 / p.group, q_full);
          ++q_loads;
        }
        for (int t = 0; t < n_it; ++t) {
          if (t + 1 < n_it) copy(&maps.k, sk0, full_k, empty_k, copied + t + 1, c.j0 + t + 1, c.h);
          copy(&maps.v, sv0, full_v, empty_v, copied + t, c.j0 + t, c.h);
        }
        copied += n_it;
        item = next;
      }
    }
    // exit, not return: ptxas allocates the consumers under setmaxnreg's 232 registers only when no path joins
    // theirs (a shared return holds the whole kernel to the launch bound's 168, and then serialises the wgmma).
    asm volatile("exit;\n");
  }
  setmaxnreg_inc<kConsumerRegisters>();

  const int wg = (threadIdx.x >> 7) - 1;  // consumer warpgroup 0 or 1
  const int lane = threadIdx.x & 31, quad = lane >> 2, tig = lane & 3;
  const int row_base = wg * 64 + ((threadIdx.x >> 5) & 3) * 16 + quad;  // this thread's rows: row_base, row_base + 8
  // The warpgroup's 64 Q rows in shared memory (bf16, in the K tiles' layout: two 64-column blocks, 128-byte
  // swizzle, copied by the producer): the A operand of S = Q K^T, so that Q takes no registers (P of the
  // previous tile holds kKeys / 4 while the softmax runs).
  const uint32_t q_addr = sq_addr + uint32_t(wg * 64 * 128);

  // Accumulators of n8 column block i of the warpgroup's 64 x 128 tile: [4i + 2hf + e] is row row_base + 8hf,
  // column 8i + 2 tig + e (the m16n8 accumulator layout per warp; S likewise over the tile's keys).
  float o[64];
  float row_max[2], row_sum[2];

  // Turns: a warpgroup issues its products (S = Q K^T of tile i with O += P V of tile i - 1) in its turn, handed
  // over through named barriers 2 and 3, one sequence of turns across all the CTA's items. Warpgroup 0 takes
  // the first turn; each turn ends with one arrival for the other warpgroup, and warpgroup 0 takes the arrival
  // of warpgroup 1's last turn after the last item, so that no barrier is left pending. The first tile of an item
  // (S only) and its last P V are peeled so that every wgmma sits in straight-line code, which keeps them
  // asynchronous.
  const int turn_mine = 2 + wg, turn_other = 3 - wg;
  float s[kS];
  uint32_t pa[kKeys / 16][4];  // P of the last softmax in bf16: the A fragments of its PV product

  // t: the ring position of a tile (tiles this CTA consumed before it), which picks its stage and phase.
  auto issue_qk = [&](int t) {
    // k16 step kk is 32 bytes into column block kk / 4 of K.
    const uint32_t k_addr = sk_addr + uint32_t((t % kStages) * kTileBytes);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = uint32_t((kk >> 2) * kBlockBytes + (kk & 3) * 32);
      wgmma_m64n176k16_ss(s, k_major_desc(q_addr + uint32_t((kk >> 2) * kQBlockBytes + (kk & 3) * 32)),
                      k_major_desc(k_addr + off), kk > 0);
    }
  };
  auto issue_pv = [&](int t) {
    const uint32_t v_addr = sv_addr + uint32_t((t % kStages) * kTileBytes);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_m64n128k16_rs<1>(o, pa[kk], n_major_desc(v_addr + uint32_t(kk * 16 * 128), kBlockBytes), 1);
  };
  auto turn_sync = [&] { named_sync(turn_mine); };
  auto turn_arrive = [&](int id) { named_arrive(id); };
  auto wait_full = [&](uint64_t* full, int t) { mbar_wait(&full[t % kStages], (t / kStages) & 1); };
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);  // this warp is done with what bar guards
  };
  // Online softmax of key tile j (rows from r0, diagonal tiles from first_masked) in s (probabilities in
  // place); returns whether the running max moved, with alpha the factors O must be scaled by. Touches neither
  // O nor P, which a P V product may still be using.
  float alpha[2];
  auto softmax = [&](int j, int r0, int first_masked) -> bool {
    if (j >= first_masked) {
      const int kb = j * kKeys;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int lim = causal_limit(p, r0 + row_base + hf * 8, kb, tig);
#pragma unroll
        for (int i = 0; i < kKeys / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (i * 8 + e > lim) s[4 * i + 2 * hf + e] = -INFINITY;
      }
    }
    bool raised = false;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      alpha[hf] = online_softmax_row<kKeys / 8>([&](int i, int e) -> float& { return s[4 * i + 2 * hf + e]; },
                                                p.scale_log2, row_max[hf], row_sum[hf], raised,
                                                kRescaleSlack);
    return __any_sync(0xffffffffu, raised);
  };
  // O rescaled to the new max, P packed into pa (column blocks 2kk and 2kk + 1 are the A fragment of k16 step
  // kk): once the previous P V product is done.
  auto rescale_and_pack = [&](bool raised) {
    if (raised) {
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  // Writes an item's output from o, row_max, row_sum (normalised; a split's part and (max, sum) instead).
  auto write_out = [&](const PrefillCta& c) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const PrefillRowOut ro = prefill_row_out<kD>(p, c, c.r0 + row_base + hf * 8, row_max[hf], row_sum[hf], tig);
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) ro.store(i * 8, o[4 * i + 2 * hf], o[4 * i + 2 * hf + 1]);
    }
  };
  auto reset = [&] {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  };

  int k = 0;  // items taken from the slots
  auto take_item = [&]() -> unsigned {
    const int sl = k % kItemSlots;
    mbar_wait(&item_full[sl], (k / kItemSlots) & 1);
    const unsigned item = item_id[sl];
    release(&item_empty[sl]);
    ++k;
    return item;
  };
  if (wg == 1) turn_arrive(2);
  int consumed = 0;  // tiles of the rings this CTA's earlier items used
  int q_loads = 0;   // Q tiles of earlier items
  for (unsigned item = take_item(); item < items; item = take_item()) {
    const PrefillCta cta = prefill_cta(p, kRows, kKeys, static_cast<int>(item));
    const int r0 = cta.r0, first_masked = cta.first_masked, j0 = cta.j0, n_it = cta.num_tiles - cta.j0;
    reset();
    if (n_it == 0) {  // a key split past the rows' last key: zeros, and (max, sum) = (-inf, 0)
      write_out(cta);
      continue;
    }
    const int t0 = consumed;
    wait_full(full_k, t0);
    mbar_wait(q_full, q_loads & 1);
    turn_sync();
    fence_registers<kS>(s);
    wgmma_fence();
    issue_qk(t0);
    wgmma_commit();
    turn_arrive(turn_other);
    wgmma_wait<0>();
    fence_registers<kS>(s);
    release(&empty_k[t0 % kStages]);
    if (n_it == 1) release(q_empty);  // this warp's last S product of the item is done
    rescale_and_pack(softmax(j0, r0, first_masked));
    for (int it = 1; it < n_it; ++it) {
      wait_full(full_k, t0 + it);
      wait_full(full_v, t0 + it - 1);
      turn_sync();
      fence_registers<64>(o);
      fence_registers<kS>(s);
      wgmma_fence();
      issue_qk(t0 + it);
      wgmma_commit();
      issue_pv(t0 + it - 1);
      wgmma_commit();
      turn_arrive(turn_other);
      wgmma_wait<1>();  // S of tile it
      fence_registers<kS>(s);
      release(&empty_k[(t0 + it) % kStages]);
      if (it == n_it - 1) release(q_empty);
      const bool raised = softmax(j0 + it, r0, first_masked);
      wgmma_wait<0>();  // O += P V of tile it - 1
      fence_registers<64>(o);
      release(&empty_v[(t0 + it - 1) % kStages]);
      rescale_and_pack(raised);
    }
    ++q_loads;
    wait_full(full_v, t0 + n_it - 1);
    turn_sync();
    fence_registers<64>(o);
    wgmma_fence();
    issue_pv(t0 + n_it - 1);
    wgmma_commit();
    turn_arrive(turn_other);
    wgmma_wait<0>();
    fence_registers<64>(o);
    release(&empty_v[(t0 + n_it - 1) % kStages]);
    consumed += n_it;
    write_out(cta);
  }
  if (wg == 0) turn_sync();  // warpgroup 1's arrival at the end of its last turn
#else
  __trap();  // compiled without sm_90a features; prefill_attention never launches it then
#endif
}

cudaError_t launch_hopper(const PrefillParams& p, cudaStream_t s) {
  const int64_t items = prefill_ctas(p);
  if (items <= 0) return cudaSuccess;
  if (p.work == nullptr || p.q_bf16 == nullptr || items >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  const TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  static bool attr_set = false;  // host side; callers are single-threaded per object, the attribute idempotent
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(prefill_hopper_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kSmemBytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  HopperMaps maps;
  const cuuint64_t dims[3] = {cuuint64_t(kD), cuuint64_t(int64_t(p.pos0) + p.n), cuuint64_t(p.num_heads_kv)};
  const cuuint64_t strides[2] = {cuuint64_t(kD) * 2, cuuint64_t(p.kv_stride) * kD * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {64, kKeys, 1}, elem_strides[3] = {1, 1, 1};
  for (int t = 0; t < 2; ++t) {
    const CUresult r = encode(t == 0 ? &maps.k : &maps.v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                              const_cast<uint16_t*>(t == 0 ? p.k : p.v), dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  {
    const int tokens = prefill_tile_tokens(kRows, p.group);
    const cuuint64_t q_dims[4] = {cuuint64_t(kD), cuuint64_t(p.group), cuuint64_t(p.num_heads_kv), cuuint64_t(p.n)};
    const cuuint64_t q_strides[3] = {cuuint64_t(kD) * 2, cuuint64_t(p.group) * kD * 2,
                                     cuuint64_t(p.num_heads_q) * kD * 2};  // bytes, dims 1 to 3
    const cuuint32_t q_box[4] = {64, cuuint32_t(p.group), 1, cuuint32_t(tokens)}, q_elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(&maps.q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(p.q_bf16), q_dims,
                              q_strides, q_box, q_elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  // One CTA per multiprocessor (its shared memory allows no second), each taking items until none is left.
  const cudaError_t e = cudaMemsetAsync(p.work, 0, sizeof(unsigned), s);
  if (e != cudaSuccess) return e;
  const int64_t ctas = std::min<int64_t>(items, sm_count());
  prefill_hopper_kernel<<<static_cast<unsigned>(ctas), kThreads, kSmemBytes, s>>>(p, maps,
                                                                                  static_cast<unsigned>(items));
  return cudaGetLastError();
}

}  // namespace

cudaError_t prefill_attention_hopper(const PrefillParams& p, cudaStream_t s) {
  if (p.head_dim != kD || int64_t(p.pos0) + p.n > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_hopper(p, s);
}

}  // namespace retroinfer::cuda::detail
