// Synthetic K/V for benchmarks of the CUDA runner at contexts where a real prefill would take too long
// (CudaSession::fill_synthetic): the keys and values of the fidelity tool's generator (src/eval/synthetic.h:
// topics, Zipf words, sinks, needles, RoPE with Llama-3.1 scaling), generated once on the host and copied
// into any number of layers' K/V buffers. Host-only header (no CUDA types).
//
// Generation: KV head h of the layer is one call of eval::generate_synthetic with a single KV head and
// seed head_seed(seed, h) (every head an independent text; the heads run in parallel threads, about
// 2.5 us per token and head on one core, so 1M tokens x 8 heads take ~3 s on 8 cores). Every sequence of a
// batch and every layer gets the same tokens: one layer is generated, then copied.
// Values are bit-identical to the host generator's bf16 K/V cache (tests/gpu/test_cuda_synthetic.cpp).
//
// Use in CudaSession::fill_synthetic(tokens, seed): one SyntheticKv{Hkv, head_dim, tokens, seed,
// cfg.rope_theta, llama3 factor (1 for other RoPE types)}; per layer fill() the layer's K/V buffers (GPU
// tier) or the staging buffer (host tier) on the session's stream, then that layer's prefill_done().
#pragma once

#include <cstdint>
#include <memory>

#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda {

struct SyntheticKvShape {
  int num_heads_kv = 0;               // KV heads of one layer
  int head_dim = 0;                   // even, >= 8
  int64_t tokens = 0;                 // >= 268 (the generator's needles need room: sink + 256 + 8)
  uint64_t seed = 1;
  double rope_theta = 500000.0;       // the model's RoPE base
  double rope_llama3_factor = 8.0;    // llama3 scaling factor (original 8192); 1 = no scaling
};

class SyntheticKv {
 public:
  // Generates the layer into pinned host memory (2 x num_heads_kv x tokens x head_dim bf16). Synchronous;
  // throws Error on a bad shape or when pinned memory cannot be had.
  explicit SyntheticKv(const SyntheticKvShape& shape);
  ~SyntheticKv();
  SyntheticKv(const SyntheticKv&) = delete;
  SyntheticKv& operator=(const SyntheticKv&) = delete;

  // Writes rows [0, tokens) of every (sequence, KV head) of
  //   k, v  device [num_seqs, num_heads_kv, kv_stride, head_dim] bf16, kv_stride >= tokens;
  // rows [tokens, kv_stride) are left as they are. Sequence 0 is copied from pinned host memory (one copy
  // per head), the others from sequence 0 on the device. Asynchronous on `s` (the pinned source stays
  // valid).
  void fill(uint16_t* k, uint16_t* v, int num_seqs, int64_t kv_stride, Stream s = nullptr) const;

  const SyntheticKvShape& shape() const;
  // Head h's generated rows on the host: [tokens, head_dim] bf16 (tests, checks).
  const uint16_t* host_keys(int h) const;
  const uint16_t* host_values(int h) const;
  int64_t host_bytes() const;         // pinned bytes held
  double generate_seconds() const;    // wall time of the generation

  // The generator seed of KV head h: splitmix64 of seed ^ (h + 1) * 0x9e3779b97f4a7c15.
  static uint64_t head_seed(uint64_t seed, int h);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retroinfer::cuda
