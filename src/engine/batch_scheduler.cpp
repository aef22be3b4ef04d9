// Continuous batching over one EngineModel (include/retroinfer/batch_scheduler.h): a worker thread that
// admits, prefills, batch-decodes, samples and retires requests one iteration at a time.
#include "retroinfer/batch_scheduler.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "retroinfer/error.h"

namespace retroinfer {
namespace {

struct Pending {
  BatchRequest req;
  std::promise<GenerateSummary> promise;
  std::shared_ptr<std::atomic<bool>> cancel;
};

// A request between its prefill and its last token (worker thread only).
struct Running {
  std::unique_ptr<Pending> p;
  std::unique_ptr<SequenceSession> session;
  std::unique_ptr<GenerationStepper> stepper;
  std::vector<float> logits;  // [vocab]: the per-sequence decode path (non-CPU)
  double prefill_s = 0.0;     // time in prefill (summed over the parts of a stepped prefill)
  int64_t reused = 0;         // prompt tokens loaded from the prefix cache
};

void done(Pending& p) {
  if (!p.req.on_done) return;
  try {
    p.req.on_done();
  } catch (...) {  // the result is already set: nowhere to deliver it (documented: must not throw)
  }
}

std::exception_ptr shutdown_error(const char* when) {
  return std::make_exception_ptr(Error(std::string("batch scheduler: shut down ") + when +
                                       " this request finished; nothing more will be generated for it"));
}

}  // namespace

struct BatchScheduler::Impl {
  const EngineModel& model;
  const BatchSchedulerOptions opt;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Pending>> waiting;  // guarded by mu
  bool stop = false;                             // guarded by mu
  Stats stats;                                   // guarded by mu
  std::vector<std::unique_ptr<Running>> running; // worker thread only
  std::vector<std::unique_ptr<Running>> prefilling;  // stepped prefills in progress (worker thread only)
  std::vector<float> batch_logits;               // [running, vocab]: the batched decode's output (worker only)
  std::unique_ptr<JoinedDecode> joiner;          // the non-CPU sessions' batched decode (worker only; dropped idle)
  std::thread worker;

  Impl(const EngineModel& m, const BatchSchedulerOptions& o) : model(m), opt(o) {}

  void count(bool ok) {
    std::lock_guard<std::mutex> lk(mu);
    ++(ok ? stats.completed : stats.failed);
  }
  // Counted before the future is set, so that a caller who got its result sees it in stats().
  void fail(Pending& p, std::exception_ptr e) {
    count(false);
    p.promise.set_exception(std::move(e));
    done(p);
  }
  void finish(Running& r) {
    GenerateSummary s = r.stepper->finish();
    s.kv_placement = r.session->kv_placement_report();
    s.reused_tokens = r.reused;
    count(true);
    r.p->promise.set_value(std::move(s));
    done(*r.p);
  }

  // Session and prefill of a new request: at once, then its first token (prefill_part), or, with
  // prefill_step_tokens, its first part now and the rest in prefill_steps().
  void start(std::unique_ptr<Pending> p) {
    if (p->cancel->load()) {
      fail(*p, std::make_exception_ptr(Error("batch scheduler: the request was cancelled before it started")));
      return;
    }
    auto r = std::make_unique<Running>();
    try {
      const BatchRequest& q = p->req;
      r->session = make_generation_session(model, opt.session, q.prompt, q.options, q.callbacks);
      // A session that cannot take a prefix (the CUDA runner's GPU / host split) prefills in full.
      if (opt.prefix_cache && r->session->supports_prefix())
        r->reused = reuse_prefix(*opt.prefix_cache, *r->session, q.prompt, opt.session.kv_dtype,
                                 opt.session.prefill_chunk);
      r->session->begin_prefill(q.prompt, q.callbacks.on_prefill);
      r->p = std::move(p);
    } catch (...) {
      fail(r->p ? *r->p : *p, std::current_exception());
      return;
    }
    if (opt.prefill_step_tokens > 0) {
      prefilling.push_back(std::move(r));
    } else {
      prefill_part(std::move(r), std::numeric_limits<int64_t>::max());
    }
  }

  // The next part of r's prefill; when its prompt is done, its first token: it joins `running` unless
  // already finished. Returns r while its prefill goes on (null otherwise).
  std::unique_ptr<Running> prefill_part(std::unique_ptr<Running> r, int64_t max_tokens) {
    try {
      const auto t0 = std::chrono::steady_clock::now();
      const bool done = r->session->prefill_step(max_tokens);
      r->prefill_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!done) return r;
      r->logits = r->session->take_prefill_logits();
      const BatchRequest& q = r->p->req;
      if (opt.prefix_cache && r->session->supports_prefix())
        remember_prefix(*opt.prefix_cache, *r->session, q.prompt, opt.session.kv_dtype, opt.session.prefill_chunk);
      r->stepper = std::make_unique<GenerationStepper>(*r->session, q.options, q.callbacks);
      r->stepper->set_prefill(q.prompt, r->prefill_s);
      if (r->stepper->step(r->logits)) {
        running.push_back(std::move(r));
      } else {
        finish(*r);
      }
    } catch (...) {
      fail(*r->p, std::current_exception());
    }
    return nullptr;
  }

  // One part of every stepped prefill in progress (cancelled ones fail: they never started generating).
  void prefill_steps() {
    std::vector<std::unique_ptr<Running>> next;
    for (auto& r : prefilling) {
      if (r->p->cancel->load()) {
        fail(*r->p, std::make_exception_ptr(Error("batch scheduler: the request was cancelled before it started "
                                                  "(during its prefill)")));
        continue;
      }
      if (auto rest = prefill_part(std::move(r), opt.prefill_step_tokens)) next.push_back(std::move(rest));
    }
    prefilling = std::move(next);
  }

  // One decode step of every running sequence, then each one's next token; finished ones leave `running`.
  void decode_step() {
    std::vector<std::unique_ptr<Running>> next;
    next.reserve(running.size());
    for (auto& r : running) {
      if (r->p->cancel->load()) {
        r->stepper->cancel();
        finish(*r);
      } else {
        next.push_back(std::move(r));
      }
    }
    running = std::move(next);
    if (running.empty()) return;
    const auto n = static_cast<int64_t>(running.size());
    const int64_t vocab = model.config().vocab_size;
    // After each sequence's decode: count it, sample its next token (a throwing callback fails that
    // request only); true when it goes on.
    auto advance = [&](Running& r, std::span<const float> logits) {
      try {
        r.stepper->count_decode(r.session->last_stats());
        if (r.stepper->step(logits)) return true;
        finish(r);
      } catch (...) {
        fail(*r.p, std::current_exception());
      }
      return false;
    };
    {  // counted before any request of the step can finish (see fail/finish)
      std::lock_guard<std::mutex> lk(mu);
      ++stats.decode_steps;
      stats.decoded_tokens += n;
      stats.max_running = std::max(stats.max_running, static_cast<int>(n));
    }
    std::vector<Session*> cpu;
    cpu.reserve(running.size());
    for (auto& r : running) {
      Session* s = r->session->device() == Device::kCpu ? dynamic_cast<Session*>(r->session.get()) : nullptr;
      if (!s) break;
      cpu.push_back(s);
    }
    std::vector<bool> go_on(running.size(), false);
    if (static_cast<int64_t>(cpu.size()) == n) {
      std::vector<int32_t> tokens(n);
      for (int64_t i = 0; i < n; ++i) tokens[i] = running[i]->stepper->next_token();
      batch_logits.resize(n * vocab);
      try {
        Session::decode_batch(cpu, tokens, batch_logits);
      } catch (...) {
        // Every input was checked by the steppers (context, vocabulary): a failure here is one of the
        // whole step, delivered to each of its requests.
        const std::exception_ptr e = std::current_exception();
        for (auto& r : running) fail(*r->p, e);
        running.clear();
        return;
      }
      for (int64_t i = 0; i < n; ++i)
        go_on[i] = advance(*running[i], std::span<const float>(batch_logits.data() + i * vocab, vocab));
    } else if (joinable()) {
      // Continuous batching across non-CPU sessions (CUDA: one model, one sequence each, any KV placement):
      // one JoinedDecode call, every weight read once for all of them.
      std::vector<SequenceSession*> ss(n);
      std::vector<int32_t> tokens(n);
      for (int64_t i = 0; i < n; ++i) {
        ss[i] = running[i]->session.get();
        tokens[i] = running[i]->stepper->next_token();
      }
      batch_logits.resize(n * vocab);
      try {
        joiner->decode(ss, tokens, batch_logits);
      } catch (...) {
        const std::exception_ptr e = std::current_exception();
        for (auto& r : running) fail(*r->p, e);
        running.clear();
        joiner.reset();
        return;
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        ++stats.joined_steps;
      }
      for (int64_t i = 0; i < n; ++i)
        go_on[i] = advance(*running[i], std::span<const float>(batch_logits.data() + i * vocab, vocab));
    } else {
      // No batched decode for these sessions: one sequence after the other.
      for (int64_t i = 0; i < n; ++i) {
        Running& r = *running[i];
        try {
          r.logits.resize(vocab);
          r.session->decode(r.stepper->next_token(), r.logits);
        } catch (...) {
          fail(*r.p, std::current_exception());
          continue;
        }
        go_on[i] = advance(r, r.logits);
      }
    }
    next.clear();
    for (int64_t i = 0; i < n; ++i)
      if (go_on[i]) next.push_back(std::move(running[i]));
    running = std::move(next);
    if (running.empty()) joiner.reset();  // its row buffers are not kept while nothing runs
  }

  // Whether the running sessions (two or more) share one non-null join key; makes or keeps `joiner` for it.
  bool joinable() {
    if (running.size() < 2) return false;
    const void* key = running[0]->session->join_key();
    if (key == nullptr) return false;
    for (const auto& r : running)
      if (r->session->join_key() != key) return false;
    if (!joiner || joiner->key() != key) joiner = running[0]->session->make_joined_decode();
    return joiner != nullptr && joiner->key() == key;
  }

  void loop() {
    for (;;) {
      std::vector<std::unique_ptr<Pending>> admit, dropped;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !waiting.empty() || !running.empty() || !prefilling.empty(); });
        if (stop) break;
        // Cancelled while waiting (e.g. a streaming client gone while the batch was full): out at once.
        for (auto it = waiting.begin(); it != waiting.end();) {
          if ((*it)->cancel->load()) {
            dropped.push_back(std::move(*it));
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
        while (static_cast<int>(running.size() + prefilling.size() + admit.size()) < opt.max_batch &&
               !waiting.empty()) {
          admit.push_back(std::move(waiting.front()));
          waiting.pop_front();
        }
      }
      for (auto& p : dropped)
        fail(*p, std::make_exception_ptr(Error("batch scheduler: the request was cancelled before it started")));
      for (auto& p : admit) start(std::move(p));
      prefill_steps();
      decode_step();
    }
    for (auto& r : running) fail(*r->p, shutdown_error("before"));
    running.clear();
    for (auto& r : prefilling) fail(*r->p, shutdown_error("before"));
    prefilling.clear();
    std::deque<std::unique_ptr<Pending>> left;
    {
      std::lock_guard<std::mutex> lk(mu);
      left.swap(waiting);
    }
    for (auto& p : left) fail(*p, shutdown_error("before"));
  }
};

BatchScheduler::BatchScheduler(const EngineModel& model, const BatchSchedulerOptions& opt)
    : opt_(opt), impl_(std::make_unique<Impl>(model, opt)) {
  RETROINFER_CHECK(opt.max_batch >= 1, "batch scheduler: max_batch must be >= 1, got ", opt.max_batch);
  RETROINFER_CHECK(opt.prefill_step_tokens >= 0, "batch scheduler: prefill_step_tokens must be >= 0, got ",
                   opt.prefill_step_tokens);
  // omp_set_num_threads is per thread: the worker takes the constructing thread's setting (--threads).
  const int threads = num_threads();
  impl_->worker = std::thread([this, threads] {
    set_num_threads(threads);
    impl_->loop();
  });
}

BatchScheduler::~BatchScheduler() { shutdown(); }

BatchHandle BatchScheduler::submit(BatchRequest request) {
  auto p = std::make_unique<Pending>();
  p->req = std::move(request);
  p->cancel = std::make_shared<std::atomic<bool>>(false);
  BatchHandle h{p->promise.get_future(), p->cancel};
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    ++impl_->stats.submitted;
    if (!impl_->stop) {
      impl_->waiting.push_back(std::move(p));
    }
  }
  if (p) {  // refused: the scheduler has shut down
    {
      std::lock_guard<std::mutex> lk(impl_->mu);
      ++impl_->stats.failed;
    }
    p->promise.set_exception(std::make_exception_ptr(
        Error("batch scheduler: shut down; it accepts no new requests (submit to a running scheduler)")));
    done(*p);
  } else {
    impl_->cv.notify_one();
  }
  return h;
}

void BatchScheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->worker.joinable() && impl_->worker.get_id() != std::this_thread::get_id()) impl_->worker.join();
}

BatchScheduler::Stats BatchScheduler::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats;
}

}  // namespace retroinfer
