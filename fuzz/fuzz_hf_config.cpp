// libFuzzer target: Hugging Face config.json parsing and validation. Any outcome other than success or
// retroinfer::Error is a bug.
#include "fuzz_common.h"
#include "retroinfer/error.h"
#include "retroinfer/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)retroinfer::parse_hf_config(retroinfer::fuzz::scratch_file(data, size, ".json"));
  } catch (const retroinfer::Error&) {
  }
  return 0;
}
