// Loads a model with retroinfer and generates a few tokens greedily with the wave index (retro attention):
//   generate_once MODEL [PROMPT] [MAX_TOKENS]
// MODEL is a .gguf file, a Hugging Face folder, or "smollm2" (the pip package of scripts/setup.sh).
#include <cstdio>
#include <exception>
#include <string>

#include "retroinfer/model_file.h"
#include "retroinfer/text_generate.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [PROMPT] [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  const std::string prompt = argc > 2 ? argv[2] : "The capital of France is";
  const int max_tokens = argc > 3 ? std::stoi(argv[3]) : 8;
  try {
    retroinfer::LoadOptions load;
    load.engine.device = retroinfer::Device::kCpu;
    const retroinfer::LoadedModel m = retroinfer::load_model(retroinfer::locate_model(argv[1]), load);
    const int head_dim = m.model->config().head_dim;
    const retroinfer::SessionOptions session =
        retroinfer::default_session_options(load.engine.device, retroinfer::AttentionKind::kRetro, head_dim);
    const std::vector<int32_t> ids = retroinfer::encode_prompt(*m.tokenizer, prompt);
    retroinfer::GenerateOptions opt;
    opt.max_new_tokens = max_tokens;
    retroinfer::TextGenerateCallbacks cb;
    cb.on_text = [](int32_t, std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    };
    std::printf("%s", prompt.c_str());
    const retroinfer::GenerateSummary s = retroinfer::generate_text(*m.engine, *m.tokenizer, session, ids, opt, cb);
    std::printf("\n[%lld prompt tokens, %lld generated, %.1f tok/s, %s attention]\n",
                static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.generated_tokens),
                s.decode_tokens_per_s, s.attention.c_str());
    return s.generated_tokens > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
