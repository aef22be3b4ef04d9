// cuda::SyntheticKv (synthetic K/V for benchmarks) against the host generator it wraps: the same seed
// gives the same bf16 bits (exact equality), for every sequence of a batch, head_dim 64 and 128, a stride
// larger than the tokens (rows past the tokens keep their sentinel), and heads that differ from each other.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/synthetic_kv.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer {
namespace {

void run_synthetic_case(int hkv, int d, int64_t tokens, int64_t stride, int num_seqs, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "hkv=" << hkv << " d=" << d << " tokens=" << tokens << " stride=" << stride
                                  << " seqs=" << num_seqs << " seed=" << seed);
  cuda::SyntheticKvShape shape;
  shape.num_heads_kv = hkv;
  shape.head_dim = d;
  shape.tokens = tokens;
  shape.seed = seed;
  cuda::SyntheticKv syn(shape);
  const size_t elems = static_cast<size_t>(num_seqs) * hkv * stride * d;
  cuda::DeviceBuffer k(elems * 2), v(elems * 2);
  k.fill_bytes(0xff);  // bf16 NaN sentinel: rows past `tokens` must keep it
  v.fill_bytes(0xff);
  syn.fill(k.as<uint16_t>(), v.as<uint16_t>(), num_seqs, stride);
  cuda::synchronize();
  std::vector<uint16_t> hk(elems), hv(elems);
  k.download(hk.data(), elems * 2);
  v.download(hv.data(), elems * 2);

  int64_t mismatches = 0, unwritten = 0, overwritten = 0;
  std::vector<std::vector<uint16_t>> ref_k(hkv);
  for (int h = 0; h < hkv; ++h) {
    KvCache ref(1, d, DType::kBF16);
    eval::generate_synthetic(cuda::synthetic_kv_head_config(shape, h), ref);
    ASSERT_EQ(ref.size(), tokens);
    ref_k[h].resize(static_cast<size_t>(tokens) * d);
    std::memcpy(ref_k[h].data(), ref.key_row(0, 0), ref_k[h].size() * 2);
    for (int s = 0; s < num_seqs; ++s) {
      const size_t base = (static_cast<size_t>(s) * hkv + h) * stride * d;
      mismatches += std::memcmp(&hk[base], ref.key_row(0, 0), static_cast<size_t>(tokens) * d * 2) != 0;
      mismatches += std::memcmp(&hv[base], ref.value_row(0, 0), static_cast<size_t>(tokens) * d * 2) != 0;
      for (int64_t t = tokens; t < stride; ++t)
        for (int i = 0; i < d; ++i) {
          overwritten += hk[base + t * d + i] != 0xffff;
          overwritten += hv[base + t * d + i] != 0xffff;
        }
      for (int64_t t = 0; t < tokens; ++t) unwritten += hk[base + t * d] == 0xffff;
    }
    EXPECT_EQ(std::memcmp(syn.host_keys(h), ref.key_row(0, 0), static_cast<size_t>(tokens) * d * 2), 0);
  }
  // The heads are different generator runs: their keys must differ.
  int64_t same_heads = 0;
  for (int h = 1; h < hkv; ++h) same_heads += ref_k[h] == ref_k[0];
  std::printf("[synthetic_kv] hkv %d d %d tokens %lld stride %lld seqs %d: mismatched (seq, head, K|V) blocks %lld, "
              "rows past tokens overwritten %lld, identical heads %lld, generate %.3f s\n",
              hkv, d, static_cast<long long>(tokens), static_cast<long long>(stride), num_seqs,
              static_cast<long long>(mismatches), static_cast<long long>(overwritten),
              static_cast<long long>(same_heads),
              syn.generate_seconds());
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(overwritten, 0);
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(same_heads, 0);
}

TEST(CudaSyntheticKv, SameBitsAsTheHostGenerator) {
  RETROINFER_REQUIRE_GPU();
  run_synthetic_case(2, 128, 1000, 1000, 1, 7);
  run_synthetic_case(3, 64, 777, 801, 3, 11);
  run_synthetic_case(8, 128, 4099, 4224, 2, 12345);
}

TEST(CudaSyntheticKv, BadShapesAreErrors) {
  RETROINFER_REQUIRE_GPU();
  cuda::SyntheticKvShape s;
  s.num_heads_kv = 2;
  s.head_dim = 128;
  s.tokens = 100;  // shorter than the generator's minimum (sink + 256 + needles)
  EXPECT_THROW(cuda::SyntheticKv{s}, Error);
  s.tokens = 512;
  s.head_dim = 7;
  EXPECT_THROW(cuda::SyntheticKv{s}, Error);
  s.head_dim = 64;
  cuda::SyntheticKv ok(s);
  cuda::DeviceBuffer k(size_t{2} * 2 * 512 * 64), v(size_t{2} * 2 * 512 * 64);
  EXPECT_THROW(ok.fill(k.as<uint16_t>(), v.as<uint16_t>(), 1, 511), Error);  // stride < tokens
  EXPECT_THROW(ok.fill(k.as<uint16_t>(), v.as<uint16_t>(), 0, 512), Error);
}

}  // namespace
}  // namespace retroinfer
