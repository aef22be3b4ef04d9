// The model's weights as the CPU forward pass reads them: linear-layer matrices in their stored block types or
// f32 (weight_matrix.h, by ModelOptions::weight_storage), norms and biases in f32.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weight_matrix.h"
#include "retroinfer/model.h"

namespace retroinfer {

struct Model::Weights {
  struct Layer {
    std::vector<float> attn_norm;    // [hidden]
    model::WeightMatrix wqkv;        // [(hq + 2 hkv) * head_dim, hidden]: q rows, then k, then v
    std::vector<float> bqkv;         // [(hq + 2 hkv) * head_dim] or empty (no QKV bias)
    model::WeightMatrix wo;          // [hidden, hq * head_dim]
    std::vector<float> mlp_norm;     // [hidden]
    model::WeightMatrix wgate_up;    // [2 * intermediate, hidden]: gate rows, then up rows
    model::WeightMatrix wdown;       // [hidden, intermediate]
  };
  model::WeightMatrix embed;       // [vocab, hidden]; a token's row is widened when it is looked up
  std::vector<Layer> layers;       // [num_layers]
  std::vector<float> final_norm;   // [hidden]
  model::WeightMatrix lm_head;     // [vocab, hidden]; empty when tied (then `embed` is used)
  const model::WeightMatrix& lm_head_matrix() const { return lm_head.empty() ? embed : lm_head; }
  int64_t bytes() const;
};

}  // namespace retroinfer
