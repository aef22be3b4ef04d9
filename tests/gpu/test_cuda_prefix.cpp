// Prefix reuse on the CUDA runner (docs/prefix-cache.md): not implemented yet, so every entry point refuses with an
// Error that names the runner and what to use instead — never a crash: load_prefix, export_kv, the engine's prefix
// cache (reuse_prefix) and a snapshot's context in generate(), and the server with a prefix cache.
#include <gtest/gtest.h>

#include <memory>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/prefix_cache.h"

namespace retroinfer {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CudaPrefix, RefusedWithAClearErrorEverywhere) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile f(c, 5);
  auto m = Model::load(f);
  const EngineModel engine(*m, EngineOptions{Device::kCuda, DeviceWeights::kBf16});
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.kv_dtype = DType::kBF16;
  so.max_context = 64;
  auto s = make_session(engine, so);
  EXPECT_FALSE(s->supports_prefix());
  KvPrefix p;
  p.tokens = {1, 2, 3};
  EXPECT_NE(error_of([&] { s->load_prefix(p); }).find("the cuda runner does not reuse a prefilled prefix"),
            std::string::npos);
  s->prefill(std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_NE(error_of([&] { s->export_kv(0, 2); }).find("the cuda runner does not export its K/V"), std::string::npos);

  PrefixCache cache({.block_tokens = 2, .capacity_bytes = 1 << 20});
  GenerateOptions g;
  g.max_new_tokens = 2;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  EXPECT_NE(error_of([&] { generate(engine, so, prompt, g, {}, &cache); }).find("cuda runner"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(engine, so, prompt, g, {}, nullptr, &p); }).find("cuda runner"), std::string::npos);
}

}  // namespace
}  // namespace retroinfer
