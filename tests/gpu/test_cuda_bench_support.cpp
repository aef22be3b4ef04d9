// What `retroinfer bench decode` relies on besides the runner: the bandwidth probes (plausible, ordered
// figures) and CudaSession::plan against the device's free memory (limits resolved from the device, the
// refusal before allocation).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "retroinfer/cuda_device.h"
#include "retroinfer/session_planner.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model_shapes.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

TEST(CudaBenchSupport, BandwidthProbes) {
  RETROINFER_REQUIRE_GPU();
  const cuda::BandwidthFigures f = cuda::measure_bandwidth(size_t{256} << 20, size_t{64} << 20, 5);
  std::printf("[bandwidth] HBM copy %.0f GB/s (read + write), pinned host->device %.1f GB/s\n", f.hbm_gb_s,
              f.h2d_gb_s);
  // Any GPU of sm_90 class: HBM copies run at > 500 GB/s and PCIe (Gen4 x16 or better, or a C2C link)
  // at > 5 GB/s; the device copy is faster than the host link on every such system.
  EXPECT_GT(f.hbm_gb_s, 500.0);
  EXPECT_GT(f.h2d_gb_s, 5.0);
  EXPECT_GT(f.hbm_gb_s, f.h2d_gb_s);
  EXPECT_THROW(cuda::measure_bandwidth(1024, 1024, 1), Error);
}

TEST(CudaBenchSupport, SessionPlanUsesTheDevicesFreeMemory) {
  RETROINFER_REQUIRE_GPU();
  const ModelConfig cfg = with_max_context(model_shape("llama3-8b"), 1 << 20);
  cuda::CudaSessionOptions opt;
  opt.attention.kind = AttentionKind::kFull;
  opt.max_context = 4096;
  const int64_t free_now = cuda::device_memory_info().first;
  const cuda::CudaSessionPlan p = cuda::CudaSession::plan(cfg, opt, 1, 0);
  std::printf("[session plan] device free %.2f GiB, plan limit %.2f GiB, needs %.3f GiB\n", free_now / 1073741824.0,
              p.gpu_free_bytes / 1073741824.0, p.gpu_bytes / 1073741824.0);
  // The limit is the free memory less the reserve (free memory may move by a few MiB between the calls).
  EXPECT_NEAR(double(p.gpu_free_bytes), double(free_now - buffer::kGpuReserveBytes), double(64 << 20));
  EXPECT_EQ(p.gpu_layers, 32);
  EXPECT_EQ(p.host_layers, 0);
  // The limit is the session's; the weights are reported on both sides (needed and free).
  opt.gpu_memory_limit = int64_t{40} << 30;
  const cuda::CudaSessionPlan w = cuda::CudaSession::plan(cfg, opt, 1, int64_t{15} << 30);
  EXPECT_EQ(w.gpu_bytes, p.gpu_bytes + (int64_t{15} << 30));
  EXPECT_EQ(w.gpu_free_bytes, int64_t{55} << 30);
  // Far more than the device and the host hold: refused, naming both sides.
  opt.gpu_memory_limit = 0;
  opt.max_context = 1 << 20;
  opt.attention.kind = AttentionKind::kRetro;
  opt.placement = KvPlacement::kSplit;
  try {
    cuda::CudaSession::plan(cfg, opt, 64, 0);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("of GPU memory"), std::string::npos) << m;
    EXPECT_NE(m.find("of pinned host memory"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was allocated"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace retroinfer
