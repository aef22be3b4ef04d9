// The device choice (engine_model.h): parsing of --device / --weights, the clear error for cuda where it
// cannot run (a CPU-only build, or a CUDA build on a machine without a GPU, as in CI), and the CPU path of
// make_session giving exactly the CPU Session. Uses the tiny model fixture (skips when absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

#if RETROINFER_WITH_CUDA
#include "retroinfer/cuda_backend.h"
#endif

#include "tiny_model_util.h"

#include "error_of.h"

namespace retroinfer {
namespace {


// Whether cuda can run here: the build has the backend and a device answers.
bool cuda_usable() {
#if RETROINFER_WITH_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

// The message check_device must give when cuda cannot run here.
std::string expected_cuda_error() {
#if RETROINFER_WITH_CUDA
  return cuda::device_description();
#else
  return "this build has no CUDA backend";
#endif
}

TEST(EngineModel, DeviceNamesParse) {
  EXPECT_EQ(resolve_device("cpu"), Device::kCpu);
  EXPECT_EQ(resolve_device("cuda"), Device::kCuda);  // resolving does not check usability
  EXPECT_EQ(resolve_device("auto"), cuda_usable() ? Device::kCuda : Device::kCpu);
  EXPECT_NE(test::error_of([] { resolve_device("gpu"); }).find("expected cpu, cuda or auto"), std::string::npos);
  EXPECT_THROW(resolve_device(""), Error);
  EXPECT_THROW(resolve_device("CPU"), Error);  // names are exact, as the CLI's
  EXPECT_EQ(parse_device_weights("bf16"), DeviceWeights::kBf16);
  EXPECT_EQ(parse_device_weights("f32"), DeviceWeights::kF32);
  EXPECT_EQ(device_weights_name(parse_device_weights("f32")), "f32");
  EXPECT_NE(test::error_of([] { parse_device_weights("fp16"); }).find("expected bf16 or f32"), std::string::npos);
#if RETROINFER_WITH_CUDA
  EXPECT_TRUE(cuda_backend_built());
#else
  EXPECT_FALSE(cuda_backend_built());
#endif
}

TEST(EngineModel, PerDeviceDefaults) {
  EXPECT_EQ(default_kv_dtype(Device::kCpu), DType::kF32);
  EXPECT_EQ(default_kv_dtype(Device::kCuda), DType::kBF16);
  EXPECT_EQ(default_prefill_chunk(Device::kCpu), 512);
  EXPECT_EQ(default_prefill_chunk(Device::kCuda), 2048);
}

TEST(EngineModel, CudaWhereItCannotRunIsAClearError) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here (the GPU tests cover the cuda path)";
  EXPECT_NO_THROW(check_device(Device::kCpu));
  const std::string e = test::error_of([] { check_device(Device::kCuda); });
  EXPECT_NE(e.find("device cuda: "), std::string::npos) << e;
  EXPECT_NE(e.find(expected_cuda_error()), std::string::npos) << e;
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;  // says what to do
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  EngineOptions eo;
  eo.device = Device::kCuda;
  const std::string e2 = test::error_of([&] { EngineModel em(*m, eo); });
  EXPECT_NE(e2.find(expected_cuda_error()), std::string::npos) << e2;
}

TEST(EngineModel, CpuSessionIsTheCpuRunner) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const EngineModel em(*m);
  EXPECT_EQ(em.device(), Device::kCpu);
  EXPECT_EQ(em.device_weight_bytes(), 0);
  EXPECT_EQ(em.description().rfind("cpu (", 0), 0u) << em.description();
  SessionOptions so;
  so.attention.kind = AttentionKind::kRetro;
  so.attention.window_tokens = 16;
  so.prefill_chunk = 64;
  so.max_context = 140;
  std::vector<int32_t> toks(130);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  const std::unique_ptr<SequenceSession> s = make_session(em, so);
  ASSERT_NE(dynamic_cast<Session*>(s.get()), nullptr);
  EXPECT_EQ(s->device(), Device::kCpu);
  EXPECT_EQ(s->max_context(), 140);
  EXPECT_EQ(s->attention_config().kind, AttentionKind::kRetro);
  Session direct(*m, so);
  EXPECT_EQ(s->prefill(std::span<const int32_t>(toks).first(120)),
            direct.prefill(std::span<const int32_t>(toks).first(120)));
  std::vector<float> a(m->config().vocab_size), b(a.size());
  for (int i = 120; i < 125; ++i) {
    s->decode(toks[i], a);
    direct.decode(toks[i], b);
    ASSERT_EQ(a, b) << "step " << i;  // the same runner on the same inputs: bit-identical
  }
  EXPECT_EQ(s->position(), 125);
  AttentionConfig full;
  full.kind = AttentionKind::kFull;
  const std::unique_ptr<SequenceSession> f = s->fork_session(full);
  EXPECT_EQ(f->position(), 125);
  EXPECT_EQ(f->attention_config().kind, AttentionKind::kFull);
  // Bad options are refused before any work.
  SessionOptions bad = so;
  bad.prefill_chunk = 0;
  EXPECT_NE(test::error_of([&] { make_session(em, bad); }).find("prefill_chunk"), std::string::npos);
  bad = so;
  bad.max_context = -1;
  EXPECT_THROW(make_session(em, bad), Error);
}

}  // namespace
}  // namespace retroinfer
