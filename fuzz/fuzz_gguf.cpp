// libFuzzer target: GGUF container parsing, then (for inputs that parse) the whole model open path
// (config from metadata, name mapping, q/k un-permutation, required tensors) and dequantization of every
// tensor. Any outcome other than success or retroinfer::Error is a bug.
#include <vector>

#include "fuzz_common.h"
#include "io/gguf_reader.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer;
  try {
    const io::GgufContents g = io::parse_gguf(data, size, "fuzz.gguf");
    std::vector<float> buf;
    for (const io::GgufTensor& t : g.tensors) {
      const size_t n = t.nbytes / weight_type_block_bytes(t.type) * weight_type_block_elems(t.type);
      buf.resize(n);
      dequantize(t.type, t.data, static_cast<int64_t>(n), buf.data());
    }
  } catch (const Error&) {
    return 0;
  }
  try {
    const auto m = ModelFile::open(fuzz::scratch_file(data, size, ".gguf"));
    for (const std::string& name : m->tensor_names()) (void)m->to_f32(m->get(name));
  } catch (const Error&) {
  }
  return 0;
}
