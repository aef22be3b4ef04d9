// A CudaModel's device weights (cuda_model.cpp fills them). Matrices are stored in the model's WeightType
// (bf16 bits or f32), row-major in the layout of the CPU runner (src/model/weights.h); norm weights and
// biases are always f32 (small, and exact for every source type). Host-only header.
#pragma once

#include <vector>

#include "retroinfer/cuda_model.h"

namespace retroinfer::cuda {

struct CudaModel::Weights {
  struct Layer {
    const float* attn_norm = nullptr;  // [hidden] f32
    const void* wqkv = nullptr;        // [(hq + 2 hkv) * head_dim, hidden]: q rows, then k, then v
    const float* bqkv = nullptr;       // [(hq + 2 hkv) * head_dim] f32, or nullptr (no QKV bias)
    const void* wo = nullptr;          // [hidden, hq * head_dim]
    const float* mlp_norm = nullptr;   // [hidden] f32
    const void* wgate_up = nullptr;    // [2 * intermediate, hidden]: gate rows, then up rows
    const void* wdown = nullptr;       // [hidden, intermediate]
  };
  WeightType type = WeightType::kBf16;
  const void* embed = nullptr;        // [vocab, hidden]
  const void* lm_head = nullptr;      // [vocab, hidden]; == embed when the embeddings are tied
  const float* final_norm = nullptr;  // [hidden] f32
  std::vector<Layer> layers;          // [num_layers]
};

}  // namespace retroinfer::cuda
