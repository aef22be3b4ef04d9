// Options and helpers shared by the CLI commands that run a model (generate, bench generate).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/tokenizer.h"

namespace CLI {
class App;
}

namespace retroinfer::cli {

struct ModelCliOptions {
  std::string model = "smollm2";  // path or short name (see locate_model)
  int threads = 0;                // 0: OpenMP default
  std::string kv_dtype = "f32";
  int prefill_chunk = 512;
  // AttentionConfig passthrough; a negative value keeps the default.
  double retrieval_fraction = -1.0;
  double estimation_fraction = -1.0;
  double outlier_fraction = -1.0;
  int sink_tokens = -1;
  int window_tokens = -1;
  int64_t budget_tokens = -2;  // -1 derives it from retrieval_fraction; -2 keeps the default
  int tokens_per_cluster = -1;
  bool no_estimation = false;
};

// Adds --model, --threads, --kv-dtype, --prefill-chunk and the attention parameters to cmd.
void add_model_options(CLI::App* cmd, ModelCliOptions& o);

SessionOptions make_session_options(const ModelCliOptions& o, AttentionKind kind);

struct LoadedModel {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  double load_seconds = 0.0;
};
// Applies --threads, locates, opens and loads the model and its tokenizer.
LoadedModel load_model(const ModelCliOptions& o);

// A one-line prefill progress bar on stderr ("\r" updates).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  double t0_;
  bool active_ = false;
};

}  // namespace retroinfer::cli
