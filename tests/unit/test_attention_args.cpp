// Bad arguments to make_attention and decode give retroinfer::Error with a message that names the
// problem, for every attention kind.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/error.h"

using namespace retroinfer;

namespace {

constexpr AttentionKind kAllKinds[] = {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest,
                                       AttentionKind::kStreaming, AttentionKind::kOracle};

// Runs f, expects retroinfer::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle, const std::string& where) {
  try {
    f();
    ADD_FAILURE() << where << ": no error (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << where << ": message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

AttentionConfig cfg_of(AttentionKind k) {
  AttentionConfig c;
  c.kind = k;
  return c;
}

}  // namespace

TEST(AttentionArgs, ZeroHeadsAndBadGrouping) {
  for (AttentionKind k : kAllKinds) {
    const std::string name(attention_kind_name(k));
    expect_error([&] { make_attention(cfg_of(k), {0, 8, 128}); }, "num_heads_q must be positive", name);
    expect_error([&] { make_attention(cfg_of(k), {32, 0, 128}); }, "num_heads_kv must be positive", name);
    expect_error([&] { make_attention(cfg_of(k), {32, 8, 0}); }, "head_dim must be positive", name);
    expect_error([&] { make_attention(cfg_of(k), {30, 8, 128}); }, "must be a multiple of num_heads_kv", name);
  }
}

TEST(AttentionArgs, BudgetFractionsOutOfRange) {
  for (AttentionKind k : kAllKinds) {
    const std::string name(attention_kind_name(k));
    AttentionConfig c = cfg_of(k);
    c.retrieval_fraction = 1.5;
    expect_error([&] { make_attention(c, {4, 2, 8}); }, "retrieval_fraction must be in [0, 1]", name);
    c = cfg_of(k);
    c.estimation_fraction = -0.1;
    expect_error([&] { make_attention(c, {4, 2, 8}); }, "estimation_fraction must be in [0, 1]", name);
    c = cfg_of(k);
    c.retrieval_fraction = 0.6;
    c.estimation_fraction = 0.6;
    expect_error([&] { make_attention(c, {4, 2, 8}); }, "must be <= 1", name);
    c = cfg_of(k);
    c.quest_page_tokens = 0;
    expect_error([&] { make_attention(c, {4, 2, 8}); }, "quest_page_tokens", name);
    c = cfg_of(k);
    c.window_tokens = -1;
    expect_error([&] { make_attention(c, {4, 2, 8}); }, "window_tokens", name);
  }
}

TEST(AttentionArgs, MismatchedKvShapeAndEmptyCache) {
  for (AttentionKind k : kAllKinds) {
    const std::string name(attention_kind_name(k));
    auto m = make_attention(cfg_of(k), {4, 2, 8});
    EXPECT_EQ(m->kind(), k);
    std::vector<float> q(4 * 8, 0.5f), out(4 * 8);
    std::vector<float> row(3 * 8, 1.0f);
    KvCache wrong_heads(3, 8, DType::kF32);
    wrong_heads.append(row.data(), row.data(), 1);
    expect_error([&] { m->decode(wrong_heads, q.data(), out.data()); }, "KV cache has 3 heads", name);
    expect_error([&] { m->on_prefill(wrong_heads); }, "KV cache has 3 heads", name);
    KvCache wrong_dim(2, 4, DType::kBF16);
    wrong_dim.append(row.data(), row.data(), 1);
    expect_error([&] { m->decode(wrong_dim, q.data(), out.data()); }, "of dim 4", name);
    KvCache empty(2, 8, DType::kF32);
    expect_error([&] { m->decode(empty, q.data(), out.data()); }, "empty KV cache", name);
  }
}

TEST(AttentionArgs, UnknownKindName) {
  expect_error([] { parse_attention_kind("questy"); }, "unknown attention method 'questy'", "parse");
  for (AttentionKind k : kAllKinds) EXPECT_EQ(parse_attention_kind(attention_kind_name(k)), k);
}

TEST(AttentionArgs, BaselinesRejectNullPointers) {
  for (AttentionKind k : {AttentionKind::kQuest, AttentionKind::kStreaming, AttentionKind::kOracle}) {
    auto m = make_attention(cfg_of(k), {4, 2, 8});
    std::vector<float> row(2 * 8, 1.0f), out(4 * 8);
    KvCache kv(2, 8, DType::kF32);
    kv.append(row.data(), row.data(), 1);
    expect_error([&] { m->decode(kv, nullptr, out.data()); }, "non-null q and out",
                 std::string(attention_kind_name(k)));
  }
}
