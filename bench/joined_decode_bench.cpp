// CUDA continuous-batching decode throughput: CudaJoinedDecoder (one call over B one-sequence sessions, every
// weight read once per step) against one decode() per session in turn (each with its decode CUDA graphs), JSON
// lines.
//   joined_decode_bench SHAPE|MODEL [batches=1,4,8,16] [prompt=1024] [steps=16] [method=full|retro]
// SHAPE: a model_shape() name (random bf16 weights, e.g. llama3-8b); MODEL: a model file (its weights
// uploaded as bf16). For each batch size B: B sessions, each prefilled with its own `prompt` random tokens,
// then 3 warm-up steps and `steps` timed steps per mode; tokens/s = B * steps / seconds (greedy argmax fed
// back; the logits come back to the host every step in both modes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_args.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/model_shapes.h"

using namespace retroinfer;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SHAPE|MODEL [batches=1,4,8,16] [prompt=1024] [steps=16] [method=full|retro]\n",
                 argv[0]);
    return 2;
  }
  try {
    const std::string what = argv[1];
    const auto batches = bench::parse_list<int>(argc > 2 ? argv[2] : "1,4,8,16");
    const int prompt = argc > 3 ? std::atoi(argv[3]) : 1024;
    const int steps = argc > 4 ? std::atoi(argv[4]) : 16;
    const std::string method = argc > 5 ? argv[5] : "full";
    std::unique_ptr<Model> cpu;
    std::unique_ptr<cuda::CudaModel> gm;
    bool shape = true;
    try {
      gm = cuda::CudaModel::random(model_shape(what), 7);
    } catch (const Error&) {
      shape = false;
      cpu = Model::load(what);
      gm = cuda::CudaModel::upload(*cpu);
    }
    const ModelConfig& c = gm->config();
    const int64_t vocab = c.vocab_size;
    cuda::CudaSessionOptions o;
    o.attention.kind = method == "retro" ? AttentionKind::kRetro : AttentionKind::kFull;
    o.max_context = prompt + 2 * (steps + 3) + 8;  // both modes' warm-up and timed steps
    auto argmax = [&](const float* v) { return static_cast<int32_t>(std::max_element(v, v + vocab) - v); };
    for (int b : batches) {
      std::vector<std::unique_ptr<cuda::CudaSequenceSession>> sessions;
      std::vector<cuda::CudaSession*> ptrs;
      std::vector<int32_t> next(b);
      std::mt19937 rng(17);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(std::min<int64_t>(vocab, 32000)) - 1);
      for (int i = 0; i < b; ++i) {
        std::vector<int32_t> p(prompt);
        for (auto& t : p) t = pick(rng);
        sessions.push_back(std::make_unique<cuda::CudaSequenceSession>(*gm, o));
        const auto l = sessions.back()->prefill(p);
        next[i] = argmax(l.data());
        ptrs.push_back(&sessions.back()->session());
      }
      cuda::CudaJoinedDecoder dec(*gm);
      std::vector<float> logits(b * vocab);
      for (const bool joined : {true, false}) {
        if (b == 1 && joined) continue;  // one session: its own decode (graphs) is the reference
        auto step = [&] {
          if (joined) {
            dec.decode(ptrs, next, logits);
          } else {
            for (int i = 0; i < b; ++i)
              sessions[i]->decode(next[i], std::span<float>(logits.data() + i * vocab, vocab));
          }
          for (int i = 0; i < b; ++i) next[i] = argmax(logits.data() + i * vocab);
        };
        for (int w = 0; w < 3; ++w) step();  // tuning, graph capture
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) step();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        nlohmann::json j = {{"bench", "joined_decode"},
                            {"model", shape ? what : cpu->path()},
                            {"weights", shape ? "random bf16" : "bf16"},
                            {"device", cuda::device_description()},
                            {"method", method},
                            {"mode", joined ? "joined" : "turns"},
                            {"batch", b},
                            {"prompt", prompt},
                            {"steps", steps},
                            {"seconds", sec},
                            {"ms_per_step", 1e3 * sec / steps},
                            {"tokens_per_s", b * steps / sec}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "joined_decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
