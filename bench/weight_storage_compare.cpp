// Block weights against f32 weights on one prompt, teacher-forced: loads a model twice (WeightStorage::kBlocks
// and kF32), prefills both with the prompt (chat template), then feeds both the f32 path's greedy tokens and
// prints, per step, each path's top-2 token ids, the f32 path's top-2 margin (absolute and as a share of its
// logit range) and the largest logit difference over the vocabulary as a share of that range, one JSON line
// per step. A step whose top-1 differs shows whether the f32 path had a near tie there.
//   weight_storage_compare MODEL.gguf PROMPT.txt STEPS [THREADS]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/text_generate.h"
#include "retroinfer/tokenizer.h"

namespace {

using retroinfer::Session;

struct Top2 {
  int first = 0, second = 0;
  float margin = 0.0f;
};

Top2 top2(const std::vector<float>& l) {
  Top2 t;
  for (int i = 1; i < static_cast<int>(l.size()); ++i)
    if (l[i] > l[t.first]) t.first = i;
  t.second = t.first == 0 ? 1 : 0;
  for (int i = 0; i < static_cast<int>(l.size()); ++i)
    if (i != t.first && l[i] > l[t.second]) t.second = i;
  t.margin = l[t.first] - l[t.second];
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retroinfer;
  if (argc < 4) {
    std::fprintf(stderr, "usage: weight_storage_compare MODEL.gguf PROMPT.txt STEPS [THREADS]\n");
    return 2;
  }
  try {
    set_num_threads(argc > 4 ? std::atoi(argv[4]) : 2);
    std::stringstream text;
    text << std::ifstream(argv[2]).rdbuf();
    LoadedModel blocks = load_model(argv[1]);  // LoadOptions::cpu_weights = kBlocks
    ModelOptions f32;
    f32.weight_storage = WeightStorage::kF32;
    const auto wide = Model::load(*blocks.file, f32);
    const std::vector<int32_t> prompt = encode_prompt(*blocks.tokenizer, text.str(), true);
    const int steps = std::atoi(argv[3]);
    SessionOptions so;
    so.attention.kind = AttentionKind::kFull;
    so.max_context = static_cast<int64_t>(prompt.size()) + steps + 1;
    Session sb(*blocks.model, so), sf(*wide, so);
    std::vector<float> lb = sb.prefill(prompt), lf = sf.prefill(prompt);
    for (int i = 0; i < steps; ++i) {
      const Top2 tb = top2(lb), tf = top2(lf);
      const auto [lo, hi] = std::minmax_element(lf.begin(), lf.end());
      const double range = static_cast<double>(*hi) - *lo;
      double worst = 0.0;
      for (size_t j = 0; j < lf.size(); ++j) worst = std::max(worst, std::fabs(static_cast<double>(lb[j]) - lf[j]));
      const nlohmann::json j = {{"step", i}, {"prompt_tokens", prompt.size()}, {"f32_top", {tf.first, tf.second}},
                                {"blocks_top", {tb.first, tb.second}}, {"f32_margin", tf.margin},
                                {"f32_margin_of_range", tf.margin / range}, {"max_diff_of_range", worst / range}};
      std::printf("%s\n", j.dump().c_str());
      sb.decode(tf.first, lb);  // both fed the f32 path's greedy token
      sf.decode(tf.first, lf);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weight_storage_compare: %s\n", e.what());
    return 1;
  }
  return 0;
}
