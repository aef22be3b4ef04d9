// text_generate.h: the pieces `retroinfer generate` and the Python bindings share (end-of-generation ids,
// session defaults, prompt encoding, generation with a streaming detokenizer), on the tiny model fixture
// with the byte-level test tokenizer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/text_generate.h"
#include "test_server_util.h"

namespace retroinfer {
namespace {

TEST(TextGenerate, EndOfGenerationIdsMergeTokenizerAndConfig) {
  ModelConfig c;
  EXPECT_EQ(end_of_generation_ids(c, nullptr), std::vector<int32_t>{-1});  // none known: matches nothing
  c.eos_token_ids = {2, 256};
  EXPECT_EQ(end_of_generation_ids(c, nullptr), (std::vector<int32_t>{2, 256}));
  const auto tok = test::byte_tokenizer();  // eos <|end|> = 256
  EXPECT_EQ(end_of_generation_ids(c, tok.get()), (std::vector<int32_t>{256, 2}));
}

TEST(TextGenerate, SessionDefaultsFollowDeviceAndHeadDim) {
  const SessionOptions a = default_session_options(Device::kCpu, AttentionKind::kRetro, 64);
  EXPECT_EQ(a.attention.kind, AttentionKind::kRetro);
  EXPECT_EQ(a.attention.tokens_per_cluster, default_tokens_per_cluster(64));
  EXPECT_EQ(a.kv_dtype, DType::kF32);
  EXPECT_EQ(a.prefill_chunk, 512);
  const SessionOptions b = default_session_options(Device::kCuda, AttentionKind::kFull);
  EXPECT_EQ(b.attention.tokens_per_cluster, AttentionConfig{}.tokens_per_cluster);
  EXPECT_EQ(b.kv_dtype, DType::kBF16);
  EXPECT_EQ(b.prefill_chunk, 2048);
}

TEST(TextGenerate, EncodePromptPlainAndChat) {
  auto tok = test::byte_tokenizer();
  EXPECT_EQ(encode_prompt(*tok, "hi"), tok->encode("hi", true, true));
  EXPECT_THROW(encode_prompt(*tok, "hi", /*chat=*/true), Error);  // no chat template known
  tok->set_chat_format(ChatFormat::kChatML);
  const std::vector<ChatMessage> msgs = {{"system", "S"}, {"user", "hi"}};
  EXPECT_EQ(encode_prompt(*tok, "hi", true, "S"), tok->encode(tok->apply_chat_template(msgs, true), false, true));
}

TEST(TextGenerate, StreamedTextEqualsSummaryAndStopsLikeGenerate) {
  const Model* m = test::server_tiny_model();
  if (!m) GTEST_SKIP() << "fixture tests/data/models/tiny-llama3 absent";
  const EngineModel engine(*m);
  const auto tok = test::byte_tokenizer();
  const std::vector<int32_t> prompt = tok->encode("The quick brown fox jumps over the lazy dog.", true, true);
  const SessionOptions so = default_session_options(Device::kCpu, AttentionKind::kFull, m->config().head_dim);
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.ignore_eos = true;
  std::string streamed;
  std::vector<int32_t> seen;
  TextGenerateCallbacks cb;
  cb.on_text = [&](int32_t t, std::string_view text) {
    streamed += text;
    seen.push_back(t);
    return true;
  };
  const GenerateSummary s = generate_text(engine, *tok, so, prompt, go, cb);
  ASSERT_EQ(s.tokens.size(), 24u);
  EXPECT_EQ(streamed, s.text);
  EXPECT_GE(seen.size(), s.tokens.size());  // one call per token (+ the tail)
  // Same tokens as generate() without text: the detokenizer only watches.
  const GenerateSummary plain = generate(engine, so, prompt, go);
  EXPECT_EQ(plain.tokens, s.tokens);
  // A callback returning false stops after that token.
  int calls = 0;
  cb.on_text = [&](int32_t, std::string_view) { return ++calls < 5; };
  const GenerateSummary stopped = generate_text(engine, *tok, so, prompt, go, cb);
  EXPECT_EQ(stopped.stop_reason, StopReason::kCallback);
  EXPECT_EQ(stopped.tokens.size(), 5u);
  EXPECT_EQ(calls, 5);  // no tail call after the callback said stop
}

}  // namespace
}  // namespace retroinfer
