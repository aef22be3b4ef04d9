// One sequence's prefill + decode behind one interface, whatever runs it: the CPU runner (Session,
// model.h) or the CUDA runner (cuda::CudaSequenceSession, cuda_model.h). Generation (generate.h), the
// accuracy harness (`retroinfer eval`) and the benchmarks take this interface, so `--device cpu|cuda`
// chooses the implementation and nothing else changes.
//
// Threading contract: one caller at a time per object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/model_config.h"

namespace retroinfer {

// Called during prefill after every chunk: (tokens done, tokens total).
using PrefillProgress = std::function<void(int64_t done, int64_t total)>;

enum class Device : uint8_t { kCpu, kCuda };
std::string_view device_name(Device d);   // "cpu" | "cuda"
Device parse_device(std::string_view s);  // "cpu" | "cuda" (throws Error otherwise)

class SequenceSession;

// One decode step of several sessions in one call, every weight read once for all of them (continuous
// batching across sessions that joined at different times and hold different positions): the batch
// scheduler's path for sessions that are not CPU sessions (those batch through Session::decode_batch).
// Made by a session (SequenceSession::make_joined_decode); takes the sessions whose join_key() is key().
class JoinedDecode {
 public:
  virtual ~JoinedDecode() = default;
  virtual const void* key() const = 0;
  // tokens [n] (one per session), logits [n, vocab]: each session advances as decode(tokens[i]) advances it,
  // its logits equal to that call's up to the products' summation order. Throws Error for a session it does
  // not take, a duplicate, a full session or a token outside the vocabulary (checked before any work); a
  // failure after that fails the step of every session in it.
  virtual void decode(std::span<SequenceSession* const> sessions, std::span<const int32_t> tokens,
                      std::span<float> logits) = 0;
};

class SequenceSession {
 public:
  virtual ~SequenceSession() = default;

  // Runs the prompt (once, before any decode) and builds the attention method's index.
  // Returns logits [n, vocab] for every position when all_logits, else [vocab] of the last position.
  virtual std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                                     const PrefillProgress& progress = {}) = 0;
  // One decode step at position(): appends `token`, writes logits [vocab].
  virtual void decode(int32_t token, std::span<float> logits) = 0;
  // A new session over a copy of this prefilled one's KV with another attention config (index built).
  virtual std::unique_ptr<SequenceSession> fork_session(const AttentionConfig& attention) const = 0;

  virtual int64_t position() const = 0;      // tokens in the cache
  virtual int64_t max_context() const = 0;   // tokens this session may hold
  virtual const ModelConfig& model_config() const = 0;
  virtual const AttentionConfig& attention_config() const = 0;
  // Attention statistics of the last decode step, summed over layers.
  virtual const AttentionStats& last_stats() const = 0;
  virtual Device device() const = 0;

  // Continuous batching (JoinedDecode above): sessions with the same non-null join_key() can decode one
  // token each in one make_joined_decode()->decode() call. Default: null (decode alone). The CUDA session: its
  // model when it holds one sequence and is prefilled, whatever its KV placement (host-tier layers join).
  virtual const void* join_key() const { return nullptr; }
  virtual std::unique_ptr<JoinedDecode> make_joined_decode() const { return nullptr; }

  // Prefill in steps, so that a caller can interleave a long prompt with other work (the batch scheduler's
  // prefill_step_tokens):
  //   begin_prefill(tokens, progress)  checks the prompt (non-empty, nothing prefilled or stepping yet) and
  //                                    keeps a copy;
  //   prefill_step(max_tokens)         runs at least one more part of it, at most about max_tokens tokens
  //                                    (>= 1) when the prompt goes on, and returns true once it is done;
  //   take_prefill_logits()            then returns what prefill(tokens) returns ([vocab] of the last
  //                                    position) and ends the stepping.
  // The session is then in the state prefill(tokens) leaves; progress is called as prefill's. The default runs
  // the whole prompt through prefill() in the first step (the CUDA session). The CPU session (Session) runs
  // prefill's own chunks (SessionOptions::prefill_chunk) a few per step: bit-identical to one prefill call.
  // Misuse (a step without begin, a take before the last step, begin twice) throws Error. A step that throws
  // (e.g. a token outside the vocabulary) ends the stepping, as a failed prefill() ends.
  virtual void begin_prefill(std::span<const int32_t> tokens, const PrefillProgress& progress = {});
  virtual bool prefill_step(int64_t max_tokens);
  std::vector<float> take_prefill_logits();
  bool prefill_stepping() const { return steps_.active; }  // between begin_prefill and take_prefill_logits

 protected:
  struct PrefillSteps {
    std::vector<int32_t> tokens;
    PrefillProgress progress;
    std::vector<float> logits;  // [vocab] once done
    int64_t done = 0;           // tokens prefilled so far
    bool active = false, finished = false;
  };
  PrefillSteps steps_;
  // prefill_step's preconditions (a stepping begun and not done, max_tokens >= 1); throws Error.
  void check_prefill_step(int64_t max_tokens) const;
};

}  // namespace retroinfer
