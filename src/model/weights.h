// The model's weights in f32, laid out for the forward pass.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/model.h"

namespace retroinfer {

struct Model::Weights {
  struct Layer {
    std::vector<float> attn_norm;  // [hidden]
    std::vector<float> wqkv;       // [(hq + 2 hkv) * head_dim, hidden], row-major: q rows, then k, then v
    std::vector<float> bqkv;       // [(hq + 2 hkv) * head_dim] or empty (no QKV bias)
    std::vector<float> wo;         // [hidden, hq * head_dim]
    std::vector<float> mlp_norm;   // [hidden]
    std::vector<float> wgate_up;   // [2 * intermediate, hidden]: gate rows, then up rows
    std::vector<float> wdown;      // [hidden, intermediate]
  };
  std::vector<float> embed;        // [vocab, hidden]
  std::vector<Layer> layers;       // [num_layers]
  std::vector<float> final_norm;   // [hidden]
  std::vector<float> lm_head;      // [vocab, hidden]; empty when tied (then `embed` is used)
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
  int64_t bytes() const;
};

}  // namespace retroinfer
