// libFuzzer target: safetensors container parsing and conversion of every tensor to f32. Any outcome
// other than success or retroinfer::Error is a bug.
#include <vector>

#include "io/safetensors_reader.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer;
  try {
    const io::SafetensorsContents s = io::parse_safetensors(data, size, "fuzz.safetensors");
    std::vector<float> buf;
    for (const io::SafetensorsTensor& t : s.tensors) {
      buf.resize(t.nbytes / weight_type_block_bytes(t.type));
      dequantize(t.type, t.data, static_cast<int64_t>(buf.size()), buf.data());
    }
  } catch (const Error&) {
  }
  return 0;
}
