// Model runner: load errors, memory and context refusals, chunking and decode consistency, bf16 KV, and
// the generator (stop tokens, stop strings, callbacks, summary) on the tiny-llama3 fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model_tokenizer.h"
#include "retroinfer/model_file.h"
#include "model/prefill_attention.h"
#include "model/prefill_attention_tiles.h"
#include "model/weights.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTiny = fs::path(RETROINFER_TEST_DATA) / "models" / "tiny-llama3";

bool have_tiny() { return fs::exists(kTiny / "model.safetensors"); }
#define REQUIRE_TINY() \
  if (!have_tiny()) GTEST_SKIP() << "fixture " << kTiny << " absent (scripts/make_tiny_models.py)"

std::vector<int32_t> reference_tokens() {
  std::ifstream f(kTiny / "reference.json");
  return json::parse(f).at("tokens").get<std::vector<int32_t>>();
}

// Session options with exact attention (the AttentionConfig default is retro).
SessionOptions full(int chunk = 512, int64_t max_context = 0) {
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.prefill_chunk = chunk;
  so.max_context = max_context;
  return so;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Writes a safetensors file of f32 tensors (name, shape) filled with 0.01.
void write_safetensors(const fs::path& p, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts) {
  json h = json::object();
  size_t off = 0;
  for (const auto& [name, shape] : ts) {
    size_t n = 1;
    for (auto s : shape) n *= static_cast<size_t>(s);
    h[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + 4 * n}}};
    off += 4 * n;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream f(p, std::ios::binary);
  const uint64_t len = hs.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  const float v = 0.01f;
  for (size_t i = 0; i < off / 4; ++i) f.write(reinterpret_cast<const char*>(&v), 4);
}

// A copy of the tiny-llama3 config with a model.safetensors holding `ts`.
fs::path broken_model(const std::string& name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts) {
  const fs::path d = fs::path(::testing::TempDir()) / ("retroinfer_model_" + name);
  fs::create_directories(d);
  fs::copy_file(kTiny / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
  write_safetensors(d / "model.safetensors", ts);
  return d;
}

TEST(ModelLoad, BadPathIsAClearError) {
  const std::string msg = error_of([] { Model::load("/nonexistent/retroinfer/model-dir"); });
  EXPECT_NE(msg.find("/nonexistent/retroinfer/model-dir"), std::string::npos) << msg;
}

TEST(ModelLoad, MissingTensorIsNamed) {
  REQUIRE_TINY();
  const fs::path d = broken_model("missing", {{"model.embed_tokens.weight", {512, 64}}, {"lm_head.weight", {512, 64}}});
  const std::string msg = error_of([&] { Model::load(d.string()); });
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(ModelLoad, WrongShapeIsNamed) {
  REQUIRE_TINY();
  const fs::path d = broken_model("shape", {{"model.embed_tokens.weight", {512, 32}}});
  const std::string msg = error_of([&] { Model::load(d.string()); });
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[512, 64]"), std::string::npos) << msg;
}

TEST(ModelLoad, TokenizerOfTheModel) {
  REQUIRE_TINY();
  auto f = ModelFile::open(kTiny.string());  // safetensors without tokenizer.json beside it
  EXPECT_NE(error_of([&] { load_model_tokenizer(*f); }).find("tokenizer.json"), std::string::npos);
  std::string gguf;
  try {
    gguf = locate_model("smollm2");
  } catch (const Error&) {
    GTEST_SKIP() << "SmolLM2 not installed";
  }
  auto g = ModelFile::open(gguf);  // GGUF: the vocabulary comes from the metadata
  auto tok = load_model_tokenizer(*g);
  EXPECT_EQ(tok->vocab_size(), g->config().vocab_size);
  EXPECT_EQ(tok->decode(tok->encode("In the beginning")), "In the beginning");
}

TEST(ModelLoad, MemoryEstimateIsExactForWeightsAndKv) {
  REQUIRE_TINY();
  for (const char* name : {"tiny-llama3", "tiny-qwen2"}) {  // untied; tied with QKV bias
    auto m = Model::load((kTiny.parent_path() / name).string());
    const MemoryEstimate e = estimate_memory(m->config(), 100, DType::kBF16, 512);
    EXPECT_EQ(e.weight_bytes, m->weight_bytes()) << name;
    EXPECT_EQ(e.kv_bytes, 2 * 2 * 2 * 16 * 2 * 100) << name;  // K+V x layers x kv heads x dim x bf16 x tokens
    Session s(*m, full());
    s.prefill(std::vector<int32_t>(100, 3));
    int64_t held = 0;
    for (int l = 0; l < 2; ++l) held += 2 * s.kv(l).size() * s.kv(l).num_heads_kv() * s.kv(l).row_bytes();
    EXPECT_EQ(held, estimate_memory(m->config(), 100, DType::kF32, 512).kv_bytes) << name;
  }
  EXPECT_GT(available_memory_bytes(), 0);
}

TEST(ModelLoad, MemoryRefusals) {
  REQUIRE_TINY();
  ModelOptions tight;
  tight.memory_limit_bytes = 1 << 16;  // 64 KiB < 560 KB of f32 weights
  EXPECT_NE(error_of([&] { Model::load(kTiny.string(), tight); }).find("MiB"), std::string::npos);
  // Room for the weights and a short context only.
  const MemoryEstimate w = estimate_memory(Model::load(kTiny.string())->config(), 0, DType::kF32, 1);
  ModelOptions some;
  some.memory_limit_bytes = w.weight_bytes + 128 * 1024;
  auto m = Model::load(kTiny.string(), some);
  SessionOptions so = full();
  so.max_context = 16;  // 16 tokens: 8 KiB of KV + ~70 KiB of 16-token scratch, fits
  EXPECT_NO_THROW(Session(*m, so));
  so.max_context = 500;  // 500 tokens: 256 KiB of KV alone
  const std::string msg = error_of([&] { Session(*m, so); });
  EXPECT_NE(msg.find("500 tokens"), std::string::npos) << msg;
}

TEST(ModelLoad, ContextLimits) {
  REQUIRE_TINY();
  auto m = Model::load(kTiny.string());
  SessionOptions so = full();
  so.max_context = 513;  // max_position_embeddings = 512
  EXPECT_NE(error_of([&] { Session(*m, so); }).find("maximum context of 512"), std::string::npos);
  GenerateOptions go;
  go.max_new_tokens = 100;
  const std::vector<int32_t> prompt(450, 5);
  EXPECT_NE(error_of([&] { generate(*m, full(), prompt, go); }).find("550 tokens"), std::string::npos);
  so.max_context = 4;
  Session s(*m, so);
  const std::vector<int32_t> five(5, 7);
  EXPECT_THROW(s.prefill(five), Error);
  const std::vector<int32_t> bad = {1, 512};
  Session s2(*m, full());
  EXPECT_NE(error_of([&] { s2.prefill(bad); }).find("outside the vocabulary"), std::string::npos);
}

// Max |a - b| / max |b| over two logit arrays.
double rel_diff(const float* a, const float* b, size_t n) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst / scale;
}

TEST(ModelForward, ChunkSizeAndDecodePathAgree) {
  REQUIRE_TINY();
  auto m = Model::load(kTiny.string());
  const int64_t vocab = m->config().vocab_size;
  std::vector<int32_t> toks = reference_tokens();
  toks.resize(100);
  Session a(*m, full(512));
  const auto ref = a.prefill(toks, true);
  Session b(*m, full(7));  // 100 = 14 * 7 + 2
  const auto chunked = b.prefill(toks, true);
  // Same arithmetic up to BLAS blocking of different row counts: f32 rounding, 1e-5 of the logit scale.
  for (int64_t p : {0, 6, 7, 50, 99}) EXPECT_LT(rel_diff(&chunked[p * vocab], &ref[p * vocab], vocab), 1e-5) << p;
  // Prefill of 60 tokens then decode of 40 gives the logits of the full prefill at each position.
  Session c(*m, full());
  c.prefill(std::span(toks).first(60));
  std::vector<float> lg(vocab);
  for (int64_t p = 60; p < 100; ++p) {
    c.decode(toks[p], lg);
    ASSERT_LT(rel_diff(lg.data(), &ref[p * vocab], vocab), 1e-5) << "position " << p;
  }
  EXPECT_EQ(c.last_stats().context_tokens, 100 * m->config().num_layers * m->config().num_heads_kv);
}

TEST(ModelForward, Bf16KvCacheStaysClose) {
  REQUIRE_TINY();
  auto m = Model::load(kTiny.string());
  std::vector<int32_t> toks = reference_tokens();
  Session f32s(*m, full());
  SessionOptions bo = full();
  bo.kv_dtype = DType::kBF16;
  Session bf(*m, bo);
  const auto a = f32s.prefill(toks);
  const auto b = bf.prefill(toks);
  // bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3 per K/V element); through two layers the
  // logits move by a few times that, far below the 5e-2 bound, and by more than f32 rounding.
  const double d = rel_diff(b.data(), a.data(), a.size());
  EXPECT_LT(d, 5e-2);
  EXPECT_GT(d, 1e-6);
  EXPECT_EQ(bf.kv(0).dtype(), DType::kBF16);
}

// Both prefill attentions of the runner (BLAS; fused, where the processor has AVX2 + FMA) against the scalar
// reference of the attention module, over several key blocks (T up to 2060 > 4 * kKeyBlock), chunk offsets,
// chunks of several row tiles (n 600 and 700 > 2 * kRowTile: tiles on every thread, key blocks skipped past a
// tile's last row), GQA groups (7 query heads per KV head: strips of 6 rows that straddle positions), head
// dims 16 and 32 and both KV dtypes.
TEST(PrefillAttention, MatchesReference) {
  static_assert(2060 > 4 * model::kKeyBlock && 600 > 2 * model::kRowTile, "the cases below no longer span the tiles");
  static_assert(2060 > 4 * model::kFusedKeyBlock && 600 > 2 * model::kFusedTileRows, "nor the fused kernel's");
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (const AttentionShape shape : {AttentionShape{6, 2, 16}, AttentionShape{7, 1, 32}}) {
    const int hq = shape.num_heads_q, hkv = shape.num_heads_kv, d = shape.head_dim;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (auto [pos0, n] :
           {std::pair<int64_t, int64_t>{0, 37}, {0, 1}, {1000, 100}, {2000, 60}, {300, 600}, {0, 700}, {5, 3}}) {
        KvCache kv(hkv, d, dt);
        const int64_t T = pos0 + n;
        std::vector<float> k(T * hkv * d), v(T * hkv * d), q(n * hq * d);
        for (auto& x : k) x = nd(rng);
        for (auto& x : v) x = nd(rng);
        for (auto& x : q) x = 2.0f * nd(rng);  // peaky softmax: large logits stress the online rescaling
        kv.append(k.data(), v.data(), T);
        std::vector<float> want(q.size());
        prefill_attention(kv, shape, 0.0f, pos0, n, q.data(), want.data());
        for (const bool fused : {false, true}) {
          if (fused && !model::fused_prefill_attention_supported(shape)) continue;
          std::vector<float> got(q.size(), std::nanf(""));
          model::PrefillAttentionScratch sc;
          if (fused) {
            model::fused_prefill_attention(kv, shape, 0.0f, pos0, n, q.data(), got.data(), sc);
          } else {
            model::blas_prefill_attention(kv, shape, 0.0f, pos0, n, q.data(), got.data(), sc);
          }
          // Outputs are convex combinations of N(0,1) values (|o| < ~4); f32 sums of <= 2060 terms in
          // another order differ by ~1e-6; 1e-4 absolute is a safe bound that a wrong mask or scale breaks.
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i)
            worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
          EXPECT_LT(worst, 1e-4) << (fused ? "fused" : "blas") << " heads " << hq << "/" << hkv << " d " << d
                                 << " dtype " << dtype_name(dt) << " pos0 " << pos0 << " n " << n;
        }
      }
    }
  }
}

// The fused kernel refuses a head_dim its register blocks do not tile, with a message naming the fallback.
TEST(PrefillAttention, FusedRefusesUnsupportedHeadDim) {
  const AttentionShape shape{2, 1, 24};
  EXPECT_FALSE(model::fused_prefill_attention_supported(shape));
  KvCache kv(1, 24, DType::kF32);
  std::vector<float> k(4 * 24, 0.5f), q(4 * 2 * 24, 0.25f), out(q.size());
  kv.append(k.data(), k.data(), 4);
  model::PrefillAttentionScratch sc;
  try {
    model::fused_prefill_attention(kv, shape, 0.0f, 0, 4, q.data(), out.data(), sc);
    ADD_FAILURE() << "head_dim 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blas_prefill_attention"), std::string::npos) << e.what();
  }
  // The dispatcher takes the BLAS path instead and matches the reference.
  std::vector<float> want(q.size());
  prefill_attention(kv, shape, 0.0f, 0, 4, q.data(), want.data());
  model::cpu_prefill_attention(kv, shape, 0.0f, 0, 4, q.data(), out.data(), sc);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5);
}

// retro inside the model: with every cluster retrieved (and nothing estimated) it is exact attention, so
// the decode logits equal full attention's; with the paper budgets it reads a fraction of the cache.
TEST(ModelForward, RetroWithFullRetrievalEqualsFull) {
  REQUIRE_TINY();
  auto m = Model::load(kTiny.string());
  const int64_t vocab = m->config().vocab_size;
  const std::vector<int32_t> toks = reference_tokens();  // 300 tokens: 232 indexed beyond sink 4 + window 64
  SessionOptions r = full();
  r.attention.kind = AttentionKind::kRetro;
  r.attention.retrieval_fraction = 1.0;
  r.attention.estimation_fraction = 0.0;
  Session a(*m, full()), b(*m, r);
  std::vector<float> la = a.prefill(toks), lb = b.prefill(toks);
  for (int step = 0; step < 8; ++step) {
    const int32_t t = argmax(la);
    a.decode(t, la);
    b.decode(t, lb);
    // Same tokens in another summation order (cluster by cluster): f32 rounding only.
    ASSERT_LT(rel_diff(lb.data(), la.data(), vocab), 1e-5) << "step " << step;
    EXPECT_EQ(b.last_stats().exact_tokens, b.last_stats().context_tokens);
  }
  SessionOptions paper = full();
  paper.attention.kind = AttentionKind::kRetro;
  Session c(*m, paper);
  std::vector<float> lc = c.prefill(toks);
  c.decode(argmax(lc), lc);
  EXPECT_LT(c.last_stats().exact_tokens, c.last_stats().context_tokens);
  for (float x : lc) ASSERT_TRUE(std::isfinite(x));
}

// index_prompt builds the layers' indexes in parallel (each layer's k-means on one thread): every decode
// step's attention output equals, bit for bit, that of retro indexes built one layer after another from the same
// caches on this thread.
TEST(ModelForward, RetroIndexOfParallelLayersEqualsSerialBuilds) {
  REQUIRE_TINY();
  auto m = Model::load(kTiny.string());
  const ModelConfig& c = m->config();
  SessionOptions so = full();
  so.attention.kind = AttentionKind::kRetro;
  Session s(*m, so);
  std::vector<float> logits = s.prefill(reference_tokens());
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};
  std::vector<std::unique_ptr<AttentionMethod>> serial;
  for (int l = 0; l < c.num_layers; ++l) {
    serial.push_back(make_attention(so.attention, shape));
    serial.back()->on_prefill(s.kv(l));
  }
  int compared = 0;
  std::vector<float> want(static_cast<size_t>(c.num_heads_q) * c.head_dim);
  s.set_attention_observer([&](int l, const KvCache& kv, const float* q, const float* out) {
    serial[l]->decode(kv, q, want.data());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out[i], want[i]) << "layer " << l << " element " << i;
    ++compared;
  });
  for (int step = 0; step < 4; ++step) s.decode(argmax(logits), logits);
  EXPECT_EQ(compared, 4 * c.num_layers);
  EXPECT_LT(s.last_stats().exact_tokens, s.last_stats().context_tokens);  // the index is in use
}

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tiny()) GTEST_SKIP() << "fixture absent";
    model_ = Model::load(kTiny.string());
    prompt_ = reference_tokens();
    prompt_.resize(64);
    so_.attention.kind = AttentionKind::kFull;
    GenerateOptions go;
    go.max_new_tokens = 12;
    go.ignore_eos = true;
    greedy_ = generate(*model_, so_, prompt_, go).tokens;
    ASSERT_EQ(greedy_.size(), 12u);
  }
  static std::string text_of(int32_t t) {
    std::string s = "<";  // built step by step: GCC 12 warns (-Wrestrict, falsely) on "<" + to_string(t)
    s += std::to_string(t);
    s += '>';
    return s;
  }
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_, greedy_;
  SessionOptions so_;
};

TEST_F(GenerateTest, SummaryCountsAndFullReadsEverything) {
  GenerateOptions go;
  go.max_new_tokens = 6;
  go.ignore_eos = true;
  std::string streamed;
  int calls = 0, prefill_calls = 0;
  GenerateCallbacks cb;
  cb.token_text = text_of;
  cb.on_token = [&](int32_t, std::string_view t) {
    streamed += t;
    ++calls;
    return true;
  };
  cb.on_prefill = [&](int64_t done, int64_t total) {
    ++prefill_calls;
    EXPECT_EQ(total, 64);
    EXPECT_LE(done, total);
  };
  SessionOptions so = so_;
  so.prefill_chunk = 16;
  const GenerateSummary s = generate(*model_, so, prompt_, go, cb);
  EXPECT_EQ(prefill_calls, 4);
  EXPECT_EQ(s.prompt_tokens, 64);
  EXPECT_EQ(s.generated_tokens, 6);
  EXPECT_EQ(s.decode_steps, 5);
  EXPECT_EQ(calls, 6);
  EXPECT_EQ(s.stop_reason, StopReason::kMaxTokens);
  EXPECT_EQ(std::vector<int32_t>(greedy_.begin(), greedy_.begin() + 6), s.tokens);
  EXPECT_EQ(streamed, s.text);
  std::string want;
  for (int i = 0; i < 6; ++i) want += text_of(greedy_[i]);
  EXPECT_EQ(s.text, want);
  // Full attention reads every cached token: steps at contexts 65..69, 2 layers x 2 KV heads.
  EXPECT_DOUBLE_EQ(s.kv_read_share, 1.0);
  EXPECT_EQ(s.context_tokens, (65 + 66 + 67 + 68 + 69) * 4);
  EXPECT_DOUBLE_EQ(s.mean_exact_tokens_per_head, 67.0);
  EXPECT_GT(s.prefill_tokens_per_s, 0.0);
}

TEST_F(GenerateTest, StopsOnEosStopStringAndCallback) {
  GenerateOptions go;
  go.max_new_tokens = 12;
  go.eos_token_ids = {greedy_[2]};
  auto s = generate(*model_, so_, prompt_, go);
  EXPECT_EQ(s.stop_reason, StopReason::kEos);
  EXPECT_EQ(s.tokens.size(), 3u);

  go.eos_token_ids = {-1};
  go.stop_strings = {text_of(greedy_[4]).substr(1)};  // "<id>" without its "<": spans into the next token's text? no: ends it
  GenerateCallbacks cb;
  cb.token_text = text_of;
  s = generate(*model_, so_, prompt_, go, cb);
  EXPECT_EQ(s.stop_reason, StopReason::kStopString);
  EXPECT_EQ(s.tokens.size(), 5u);
  std::string want;
  for (int i = 0; i < 4; ++i) want += text_of(greedy_[i]);
  EXPECT_EQ(s.text, want + "<");

  go.stop_strings.clear();
  int n = 0;
  cb.on_token = [&](int32_t, std::string_view) { return ++n < 2; };
  s = generate(*model_, so_, prompt_, go, cb);
  EXPECT_EQ(s.stop_reason, StopReason::kCallback);
  EXPECT_EQ(s.tokens.size(), 2u);

  go.stop_strings = {"x"};
  EXPECT_THROW(generate(*model_, so_, prompt_, go), Error);  // stop strings need a detokenizer
}

TEST_F(GenerateTest, ForkedSessionContinuesLikeAFreshOne) {
  SessionOptions so = so_;
  so.max_context = 64 + 12;
  Session base(*model_, so);
  const std::vector<float> logits = base.prefill(prompt_);
  auto forked = base.fork(so_.attention);
  GenerateOptions go;
  go.max_new_tokens = 12;
  go.ignore_eos = true;
  const GenerateSummary s = continue_generation(*forked, logits, go);
  EXPECT_EQ(s.tokens, greedy_);
  EXPECT_EQ(s.decode_steps, 11);
  EXPECT_EQ(base.position(), 64);  // the original keeps its own cache
  EXPECT_EQ(forked->position(), 64 + 11);
  Session fresh(*model_, so);
  EXPECT_THROW(fresh.fork(so_.attention), Error);  // nothing prefilled yet
}

TEST_F(GenerateTest, SeededSamplingRepeats) {
  GenerateOptions go;
  go.max_new_tokens = 10;
  go.ignore_eos = true;
  go.sampler.temperature = 1.0f;
  go.sampler.top_p = 0.9f;
  go.sampler.seed = 7;
  const auto a = generate(*model_, so_, prompt_, go).tokens;
  const auto b = generate(*model_, so_, prompt_, go).tokens;
  EXPECT_EQ(a, b);
  go.sampler.seed = 8;
  EXPECT_NE(a, generate(*model_, so_, prompt_, go).tokens);
}


// OpenBLAS's kernel choice is reported, and a core type the user set is never second-guessed (the CLI restarts
// itself only when OpenBLAS fell back to its generic kernels with OPENBLAS_CORETYPE unset).
TEST(Threads, BlasCoreIsReportedAndAGivenCoreTypeStands) {
  EXPECT_STRNE(blas_core_name(), "");
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before != nullptr ? before : "";
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  EXPECT_EQ(better_blas_core(), nullptr);
  if (before != nullptr)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  // Without the variable: a better core only when OpenBLAS chose the generic one.
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && std::strcmp(blas_core_name(), "Prescott") != 0) {
    EXPECT_EQ(better_blas_core(), nullptr);
  }
}

}  // namespace
}  // namespace retroinfer
