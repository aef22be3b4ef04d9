// streaming: being written in this session (the factory entry point exists so the library links).
#include "attention/methods.h"
#include "retroinfer/error.h"

namespace retroinfer::attention {
std::unique_ptr<AttentionMethod> make_streaming(const AttentionConfig&, const AttentionShape&) {
  RETROINFER_FAIL("attention method 'streaming' is not built yet");
}
}  // namespace retroinfer::attention
