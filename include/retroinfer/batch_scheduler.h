// Continuous batching (iteration-level scheduling) of generation requests over one EngineModel.
//
// A worker thread runs iterations. Each iteration:
//   1. admits waiting requests (first come, first served) while fewer than max_batch run or prefill: for each
//      it makes the session (make_generation_session: context and memory checks) and prefills the prompt,
//      either at once (prefill_step_tokens = 0: the whole prompt delays the running sequences by its duration)
//      or prefill_step_tokens at a time (whole prefill chunks, at least one, per iteration: the running
//      sequences decode between the parts; SequenceSession::begin_prefill / prefill_step). When its prompt is
//      done it samples the first token and joins the running sequences;
//   2. ends the requests whose cancel flag is set (StopReason::kCallback; one still prefilling fails with an
//      Error saying it was cancelled before it started);
//   3. runs ONE decode step for every running sequence:
//        cpu:  one Session::decode_batch call over all of them (every weight read once per step for the
//              whole batch, the point of batching);
//        cuda: one JoinedDecode call (sequence_session.h; CudaJoinedDecoder, cuda_model.h) over all of them
//              when two or more run and all can join (one model, every layer's KV on the GPU): every
//              product reads its weights once per step for the whole batch, each sequence keeps its own
//              position, KV and attention; otherwise (host-tier layers) each sequence decodes in turn;
//      then samples each sequence's next token with its own options (GenerationStepper: its own Sampler,
//      EOS, stop strings, max_new_tokens) and retires the finished ones; their slots are refilled at the
//      next iteration.
// Each request's tokens equal what generate() gives it alone with the same options (on the CPU batched decode
// reproduces single decode bit for bit; on CUDA the joined step's logits equal single decode's up to the
// products' summation order, which a greedy choice between two logits that close could tell apart;
// sampling is per request).
//
// Threading contract: submit(), stats() and shutdown() may be called from any thread at once. A request's
// callbacks (token_text, on_token, on_prefill) run on the worker thread, one request's at a time; they must
// not call back into the scheduler's submit/shutdown from there (on_token may return false to stop its own
// request) and should return quickly (a slow callback delays the whole batch). An exception of one request
// (its context or memory check, a callback throwing, a failed decode of its sequence) is delivered through
// that request's future only; a failure of a whole batched step fails the requests of that step. shutdown()
// (and the destructor) stop the worker after its current iteration, join it, and fail every request not
// finished yet, waiting or running, with an Error saying the scheduler shut down. The worker runs the
// forward passes with the constructing thread's thread count (num_threads(), model.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "retroinfer/engine_model.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/prefix_cache.h"

namespace retroinfer {

struct BatchRequest {
  std::vector<int32_t> prompt;  // token ids (tokenization and chat templates stay with the caller)
  GenerateOptions options;      // max_new_tokens, sampler, EOS, stop strings
  GenerateCallbacks callbacks;  // run on the worker thread (see the threading contract)
  // Optional: called once right after the result (summary or exception) is set, on the thread that set it
  // (the worker; submit's caller when refused after shutdown). For waiters that multiplex the streamed
  // tokens with the end of the request. Must not throw (an exception is dropped).
  std::function<void()> on_done;
};

struct BatchSchedulerOptions {
  int max_batch = 8;       // sequences decoding or prefilling at once (>= 1)
  // > 0: a new request's prompt is prefilled about this many tokens per iteration (whole chunks of
  // session.prefill_chunk, at least one), interleaved with the running sequences' decode steps; 0: the whole
  // prompt at admission. The tokens are the same either way. CUDA sessions prefill the whole prompt in their
  // first part (SequenceSession's default). Must be >= 0.
  int64_t prefill_step_tokens = 0;
  SessionOptions session;  // attention method, KV dtype, prefill chunk; max_context is set per request
  // Optional (shared with the caller: the server reports its stats): each request loads the longest cached
  // prefix of its prompt instead of prefilling it, and adds its prompt's blocks once prefilled (prefix_cache.h).
  // CPU sessions only (a CUDA session's request fails with the runner's Error).
  std::shared_ptr<PrefixCache> prefix_cache;
};

// A submitted request: its result and its cancel switch.
struct BatchHandle {
  std::future<GenerateSummary> result;    // the summary, or the request's exception
  std::shared_ptr<std::atomic<bool>> cancel_flag;
  // Asks the scheduler to end the request at its next iteration (stop_reason kCallback; the tokens so far
  // are kept; a request still waiting fails with an Error saying it was cancelled before it started).
  // Safe from any thread; no effect once finished.
  void cancel() const { cancel_flag->store(true); }
};

class BatchScheduler {
 public:
  // Borrows `model` (it must outlive the scheduler) and starts the worker. Throws Error for max_batch < 1.
  BatchScheduler(const EngineModel& model, const BatchSchedulerOptions& opt);
  ~BatchScheduler();  // shutdown()
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  // Queues a request; never blocks on generation. After shutdown() the handle's future holds an Error.
  BatchHandle submit(BatchRequest request);
  // Stops and joins the worker; fails unfinished requests (see above). Idempotent.
  void shutdown();

  struct Stats {
    int64_t submitted = 0;
    int64_t completed = 0;     // futures fulfilled with a summary
    int64_t failed = 0;        // futures fulfilled with an exception
    int64_t decode_steps = 0;  // iterations that decoded (one batched step each on the CPU)
    int64_t joined_steps = 0;  // of those, steps of non-CPU sessions run as one JoinedDecode call (CUDA)
    int64_t decoded_tokens = 0;  // sum of the batch sizes of those steps
    int max_running = 0;       // the most sequences that decoded in one step (<= max_batch)
  };
  Stats stats() const;
  const BatchSchedulerOptions& options() const { return opt_; }

 private:
  struct Impl;
  const BatchSchedulerOptions opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retroinfer
