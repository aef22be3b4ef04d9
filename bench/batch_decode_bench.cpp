// CPU decode throughput of Session::decode_batch against one decode() per sequence, JSON lines.
//   batch_decode_bench MODEL [batches=1,4] [prompt=64] [steps=32] [threads=2]
// For each batch size B: B full-attention sessions, each prefilled with its own `prompt` tokens, then
// `steps` decode steps either as one decode_batch call over the B sessions ("batched") or as B decode()
// calls in turn ("sequential"); tokens/s = B * steps / seconds (sampling excluded: greedy argmax fed back).
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_args.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

using namespace retroinfer;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [batches=1,4] [prompt=64] [steps=32] [threads=2]\n", argv[0]);
    return 2;
  }
  try {
    const auto batches = bench::parse_list<int>(argc > 2 ? argv[2] : "1,4");
    const int prompt = argc > 3 ? std::atoi(argv[3]) : 64;
    const int steps = argc > 4 ? std::atoi(argv[4]) : 32;
    set_num_threads(argc > 5 ? std::atoi(argv[5]) : 2);
    const auto model = Model::load(argv[1]);
    const int64_t vocab = model->config().vocab_size;
    for (int b : batches) {
      for (const bool batched : {true, false}) {
        if (b == 1 && !batched) continue;  // the same as batched with one sequence
        std::vector<std::unique_ptr<Session>> sessions;
        std::vector<Session*> ptrs;
        std::vector<int32_t> next(b);
        SessionOptions so;
        so.max_context = prompt + steps + 1;
        uint32_t seed = 17;
        for (int i = 0; i < b; ++i) {
          std::vector<int32_t> p(prompt);
          for (auto& t : p) t = static_cast<int32_t>((seed = seed * 1664525u + 1013904223u) % 1000u) + 100;
          sessions.push_back(std::make_unique<Session>(*model, so));
          next[i] = argmax(sessions.back()->prefill(p));
          ptrs.push_back(sessions.back().get());
        }
        std::vector<float> logits(b * vocab);
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) {
          if (batched) {
            Session::decode_batch(ptrs, next, logits);
          } else {
            for (int i = 0; i < b; ++i) ptrs[i]->decode(next[i], std::span<float>(logits.data() + i * vocab, vocab));
          }
          for (int i = 0; i < b; ++i) next[i] = argmax(std::span<const float>(logits.data() + i * vocab, vocab));
        }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        nlohmann::json j = {{"bench", "batch_decode"}, {"model", model->path()}, {"mode", batched ? "batched" : "sequential"},
                            {"batch", b}, {"prompt", prompt}, {"steps", steps}, {"threads", num_threads()},
                            {"seconds", sec}, {"tokens_per_s", b * steps / sec}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
