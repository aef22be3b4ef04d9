// The wave buffer's GPU <-> manager-thread protocol: plain layouts shared by the host code (src/buffer)
// and the CUDA kernels (src/backend/cuda/wave_buffer*.cu). No CUDA, no STL containers: every structure
// lives in one flat byte region (pinned, mapped host memory on the GPU path; ordinary memory in the CPU
// tests) whose layout is fixed by WaveProtocolLayout.
//
// Three channels per wave-buffer layer (H = flat heads = sequences * KV heads, K = retrieval clusters per
// head):
//
//   selection ring  (GPU writes, manager reads): `ring_slots` slots; the decode step s writes slot
//                   s % ring_slots as a seqlock: begin = s + 1, payload, end = s + 1 (0 = never written).
//                   Payload: ids  [H, K] int32, the step's retrieval clusters per head (ascending, -1 pad);
//                            rows [H, K] int32, the execution-buffer row of a missed cluster's first token,
//                                 -1 for a hit (cluster resident in the block cache).
//   mailbox         (manager writes, GPU reads): at most one update outstanding. The manager writes the
//                   payload, then `seq` (release); the GPU's apply kernel at the start of a step applies
//                   every update whose seq is newer than the last one it applied, then writes the ack.
//                   Payload: evictions [max_evictions] (head, cluster); admissions [max_admissions]
//                   (head, cluster, exec_row, num_rows, page_begin) with their pages in
//                   pages [max_admit_pages] int32 (page ids within the head's pool).
//                   Admissions are copied from the execution buffer rows of step `src_step`, so they are
//                   applied only at step src_step + 1 (the buffer still holds that step's rows); a later
//                   apply drops them (ack.admitted = 0) and applies only the evictions.
//   ack             (GPU writes, manager reads): seq applied, the step it was applied at, admitted flag.
//
// Step numbers count decode steps of the layer from 0; the device keeps its own counter.
#pragma once

#include <cstddef>
#include <cstdint>

// The pointer helpers below are used by the host (manager) and by the kernels.
#if defined(__CUDACC__)
#define RETROINFER_HOST_DEVICE __host__ __device__
#else
#define RETROINFER_HOST_DEVICE
#endif

namespace retroinfer::buffer {

struct RingSlotHeader {
  uint64_t begin;  // step + 1 while writing / written; 0 = never written
  uint64_t end;    // step + 1 once the payload is complete
};

struct MailboxHeader {
  uint64_t seq;        // update number, from 1; written last (release)
  uint64_t src_step;   // the step whose execution buffer holds the admitted rows
  int32_t num_evictions;
  int32_t num_admissions;
  int32_t num_pages;   // pages used by the admissions
  int32_t pad;
};

struct MailboxEviction {
  int32_t head;     // flat head
  int32_t cluster;  // cluster id within the head
};

struct MailboxAdmission {
  int32_t head;        // flat head
  int32_t cluster;     // cluster id within the head
  int32_t exec_row;    // first row of the cluster in the head's execution buffer at src_step
  int32_t num_rows;    // tokens of the cluster
  int32_t page_begin;  // first of ceil(num_rows / page_tokens) entries in the mailbox page list
  int32_t pad;
};

struct AckRecord {
  uint64_t seq;       // last applied update (0 = none)
  uint64_t step;      // the device step at which it was applied
  uint64_t admitted;  // 1: admissions copied; 0: dropped (late), evictions applied
  uint64_t pad;
};

// Byte offsets of the channels inside one region (each 64-byte aligned).
struct WaveProtocolLayout {
  int heads = 0;            // H
  int k = 0;                // K: retrieval clusters per head
  int ring_slots = 0;
  int max_evictions = 0;
  int max_admissions = 0;
  int max_admit_pages = 0;
  size_t ring_offset = 0, ring_slot_bytes = 0;
  size_t mailbox_offset = 0, evictions_offset = 0, admissions_offset = 0, pages_offset = 0;
  size_t ack_offset = 0;
  size_t total_bytes = 0;

  static constexpr size_t align(size_t x) { return (x + 63) / 64 * 64; }

  static WaveProtocolLayout make(int heads, int k, int ring_slots, int max_evictions, int max_admissions,
                                 int max_admit_pages) {
    WaveProtocolLayout l;
    l.heads = heads;
    l.k = k;
    l.ring_slots = ring_slots;
    l.max_evictions = max_evictions;
    l.max_admissions = max_admissions;
    l.max_admit_pages = max_admit_pages;
    const size_t payload = size_t(heads) * size_t(k) * 4 * 2;
    l.ring_slot_bytes = align(sizeof(RingSlotHeader) + payload);
    l.ring_offset = 0;
    size_t at = l.ring_offset + l.ring_slot_bytes * size_t(ring_slots);
    l.mailbox_offset = at;
    at += align(sizeof(MailboxHeader));
    l.evictions_offset = at;
    at += align(sizeof(MailboxEviction) * size_t(max_evictions));
    l.admissions_offset = at;
    at += align(sizeof(MailboxAdmission) * size_t(max_admissions));
    l.pages_offset = at;
    at += align(sizeof(int32_t) * size_t(max_admit_pages));
    l.ack_offset = at;
    at += align(sizeof(AckRecord));
    l.total_bytes = at;
    return l;
  }

  // Pointers into a region of total_bytes (valid for host and, for mapped memory, device pointers).
  RETROINFER_HOST_DEVICE RingSlotHeader* ring_header(void* base, int slot) const {
    return reinterpret_cast<RingSlotHeader*>(static_cast<char*>(base) + ring_offset + ring_slot_bytes * size_t(slot));
  }
  RETROINFER_HOST_DEVICE int32_t* ring_ids(void* base, int slot) const {
    return reinterpret_cast<int32_t*>(reinterpret_cast<char*>(ring_header(base, slot)) + sizeof(RingSlotHeader));
  }
  RETROINFER_HOST_DEVICE int32_t* ring_rows(void* base, int slot) const { return ring_ids(base, slot) + size_t(heads) * size_t(k); }
  RETROINFER_HOST_DEVICE MailboxHeader* mailbox(void* base) const {
    return reinterpret_cast<MailboxHeader*>(static_cast<char*>(base) + mailbox_offset);
  }
  RETROINFER_HOST_DEVICE MailboxEviction* evictions(void* base) const {
    return reinterpret_cast<MailboxEviction*>(static_cast<char*>(base) + evictions_offset);
  }
  RETROINFER_HOST_DEVICE MailboxAdmission* admissions(void* base) const {
    return reinterpret_cast<MailboxAdmission*>(static_cast<char*>(base) + admissions_offset);
  }
  RETROINFER_HOST_DEVICE int32_t* pages(void* base) const { return reinterpret_cast<int32_t*>(static_cast<char*>(base) + pages_offset); }
  RETROINFER_HOST_DEVICE AckRecord* ack(void* base) const { return reinterpret_cast<AckRecord*>(static_cast<char*>(base) + ack_offset); }
};

}  // namespace retroinfer::buffer
