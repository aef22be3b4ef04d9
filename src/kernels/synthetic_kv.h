// The generator configuration behind cuda::SyntheticKv (cuda_synthetic.h), for the device fill and for
// tests that rebuild the same K/V on the host. Host-only.
#pragma once

#include "core/synthetic.h"
#include "retroinfer/cuda_synthetic.h"

namespace retroinfer::cuda {

// KV head h's generator config: one KV head (and one query head: queries do not change K/V, their RNG
// stream is separate), the shape's head_dim, tokens, RoPE, one decode step (the minimum), seed
// SyntheticKv::head_seed(shape.seed, h); every other knob at the fidelity tool's default.
eval::SyntheticConfig synthetic_kv_head_config(const SyntheticKvShape& shape, int h);

}  // namespace retroinfer::cuda
