// The tokenizer that belongs to a model file: tokenizer.json beside a Hugging Face checkpoint, or the
// vocabulary stored in GGUF metadata.
#pragma once

#include <memory>

#include "retroinfer/model_file.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {

// Throws Error naming the file when neither source exists or the vocabulary is malformed.
std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFile& file);

}  // namespace retroinfer
