// Dequantization of the ggml block types beyond Q8_0 / Q4_0 / Q4_1 (those are in model_file.cpp): Q5_0, Q5_1
// and the K-quants Q4_K, Q5_K, Q6_K, as llama.cpp lays them out. Internal to src/io.
#pragma once

#include <cstdint>

#include "retroinfer/model_file.h"

namespace retroinfer {

// blocks whole blocks of type t (Q5_0, Q5_1, Q4_K, Q5_K or Q6_K) from src to f32 at dst
// [blocks * weight_type_block_elems(t)]. Every bit pattern decodes (a block has no invalid encoding); a block's
// f16 scale may be inf or NaN in a damaged file, and then so are its values.
void dequantize_ggml_blocks(WeightType t, const uint8_t* src, int64_t blocks, float* dst);

}  // namespace retroinfer
