// Faults injected on the CUDA side (retroinfer/fault_injection.h; docs/reliability.md): device memory
// exhausted at each allocation of a session in turn, pinned host memory refused (PinnedHost's fallback, then
// its Error), and a decode step failing. Each must be an Error naming what failed, leave no device memory
// behind, and leave the device usable: a session made afterwards decodes exactly as before.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "buffer/cuda/pinned_host.h"
#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_device.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

using cuda::CudaModel;
using cuda::CudaSession;
using cuda::CudaSessionOptions;
using fault::Point;

class CudaFaults : public ::testing::Test {
 protected:
  void TearDown() override { fault::disarm_all(); }
};

CudaSessionOptions full_options() {
  CudaSessionOptions o;
  o.attention.kind = AttentionKind::kFull;
  o.max_context = 128;
  o.prefill_chunk = 32;
  return o;
}

// Greedy tokens of `steps` decode steps after a prefill of `prompt`.
std::vector<int32_t> greedy(CudaSession& s, const std::vector<int32_t>& prompt, int steps) {
  const std::vector<float> first = s.prefill({prompt});
  std::vector<int32_t> tok{argmax(first)}, next(1), out;
  for (int i = 0; i < steps; ++i) {
    s.decode_greedy(tok, next);
    out.push_back(next[0]);
    tok = next;
  }
  return out;
}

TEST_F(CudaFaults, DeviceBufferOutOfMemoryIsAnError) {
  RETROINFER_REQUIRE_GPU();
  fault::ScopedFault f(Point::kDeviceAlloc);
  gputest::expect_error([] { cuda::DeviceBuffer b(1 << 20); }, "out of memory", "injected cudaMalloc failure");
  EXPECT_EQ(f.fired(), 1);
  cuda::DeviceBuffer ok(1 << 20);  // fired once: the next allocation works
  EXPECT_NE(ok.data(), nullptr);
}

// Every device allocation of a session's construction fails in turn: each is an Error, the device memory comes
// back, and a session made afterwards gives the same tokens as one made before.
TEST_F(CudaFaults, SessionAllocationFailingAtEachPointReleasesEverything) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile file(c, 21);
  auto m = Model::load(file);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const auto prompt = gputest::random_tokens(40, c.vocab_size, 3);
  std::vector<int32_t> ref;
  {
    CudaSession s(*gm, full_options(), 1);
    ref = greedy(s, prompt, 8);
  }
  fault::arm(Point::kDeviceAlloc, 0, 0);  // count the allocations of one session's life
  {
    CudaSession s(*gm, full_options(), 1);
    (void)greedy(s, prompt, 8);
  }
  const int64_t allocations = fault::passes(Point::kDeviceAlloc);
  ASSERT_GT(allocations, 0);
  const int64_t free_before = cuda::device_memory_info().first;
  for (int64_t k = 0; k < allocations; ++k) {
    fault::arm(Point::kDeviceAlloc, k, 1);
    try {
      CudaSession s(*gm, full_options(), 1);
      (void)greedy(s, prompt, 8);
      ADD_FAILURE() << "allocation " << k << " of " << allocations << " failed without an Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << "allocation " << k << ": " << e.what();
    }
    EXPECT_EQ(fault::fired(Point::kDeviceAlloc), 1) << "allocation " << k;
    // The caching of the CUDA runtime can keep a little; 16 MiB bounds it far below one session's buffers.
    EXPECT_GE(cuda::device_memory_info().first, free_before - (int64_t{16} << 20)) << "allocation " << k;
  }
  fault::disarm(Point::kDeviceAlloc);
  CudaSession s(*gm, full_options(), 1);
  EXPECT_EQ(greedy(s, prompt, 8), ref);
  std::printf("[cuda faults] %lld device allocations of a session failed in turn: each an Error, memory back\n",
              static_cast<long long>(allocations));
}

TEST_F(CudaFaults, PinnedHostFallsBackThenFailsClearly) {
  RETROINFER_REQUIRE_GPU();
  const size_t bytes = cuda::register_pin_threshold();
  {
    fault::ScopedFault f(Point::kPinnedHostAlloc, 0, 1);  // the mmap + register path fails: cudaHostAlloc instead
    cuda::PinnedHost h(bytes);
    EXPECT_FALSE(h.registered());
    EXPECT_NE(h.host(), nullptr);
    EXPECT_EQ(f.fired(), 1);
  }
  {
    fault::ScopedFault f(Point::kPinnedHostAlloc, 0, -1);  // both paths fail
    gputest::expect_error([&] { cuda::PinnedHost h(bytes); }, "pinning", "both pinned paths refused");
    gputest::expect_error([&] { cuda::PinnedHost h(4096, false); }, "pinning", "cudaHostAlloc refused");
  }
  cuda::PinnedHost h(bytes);
  EXPECT_NE(h.host(), nullptr);
}

// A decode step that fails is an Error of that call; the session is unchanged and goes on with the same tokens.
TEST_F(CudaFaults, DecodeStepFailureLeavesTheSessionUsable) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile file(c, 22);
  auto m = Model::load(file);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const auto prompt = gputest::random_tokens(40, c.vocab_size, 5);
  std::vector<int32_t> ref;
  {
    CudaSession s(*gm, full_options(), 1);
    ref = greedy(s, prompt, 8);
  }
  CudaSession s(*gm, full_options(), 1);
  const std::vector<float> first = s.prefill({prompt});
  std::vector<int32_t> tok{argmax(first)}, next(1), out;
  std::vector<float> logits(c.vocab_size);
  for (int i = 0; i < 8; ++i) {
    if (i == 3) {
      fault::ScopedFault f(Point::kDecodeStep);
      gputest::expect_error([&] { s.decode_greedy(tok, next); }, "injected fault decode_step", "greedy step");
      fault::arm(Point::kDecodeStep);
      gputest::expect_error([&] { s.decode(tok, logits); }, "injected fault decode_step", "logits step");
      EXPECT_EQ(s.positions(), (std::vector<int64_t>{static_cast<int64_t>(prompt.size()) + 3}));
    }
    s.decode_greedy(tok, next);
    out.push_back(next[0]);
    tok = next;
  }
  EXPECT_EQ(out, ref);
}

}  // namespace
}  // namespace retroinfer
