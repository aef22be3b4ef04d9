// When each layer folds generated tokens into its wave index during decode (DESIGN.md §3; the wave
// buffer's index updates, docs/wave-buffer.md).
//
// Token layout of one (sequence, layer) at `total` tokens: sinks [0, sinks), indexed tokens
// [sinks, index_end), steady tail [index_end, total). Decode attends exactly to the sinks and the steady
// tail (the steady zone) and to the selected clusters of [sinks, index_end): every token is in exactly
// one zone. The prompt's index ends at max(sinks, prompt - window). Generated tokens join the steady tail; block b of
// `interval` tokens, [index_end0 + b * interval, index_end0 + (b + 1) * interval), becomes due once all of
// it has left the recent window (total >= its end + window). Layers are staggered: layer l folds a due
// block in at total = due + l, so at most one layer of the model does an update per decode step and the
// side-stream copy of one layer overlaps the other layers' steps.
//
// Pure arithmetic, no state: the engine asks update_due() each step; tests check the zone invariants.
#pragma once

#include <cstdint>

namespace retroinfer::buffer {

class IndexUpdatePlan {
 public:
  // prompt_tokens: tokens indexed at prefill (>= 0); sinks, window: steady-zone parts (>= 0);
  // interval: tokens per update (> 0, paper: 1024); layers: layers staggered (> 0).
  IndexUpdatePlan(int64_t prompt_tokens, int sinks, int window, int interval, int layers);

  // First token not in layer `layer`'s index when `total` tokens (prompt + generated) exist.
  int64_t index_end(int layer, int64_t total) const;
  // Steady-zone rows (sinks + steady tail) of `layer` at `total` tokens.
  int64_t steady_rows(int layer, int64_t total) const {
    const int64_t tail = total - index_end(layer, total);
    return sink_end(total) + (tail > 0 ? tail : 0);
  }
  // The block layer `layer` must index when the token count reaches `total` (its first token), or -1.
  // The block's tokens are [result, result + interval()).
  int64_t update_due(int layer, int64_t total) const;
  // The most steady rows any layer ever holds: the steady zone's capacity to allocate.
  int64_t max_steady_rows() const;

  int64_t index_end0() const { return index_end0_; }
  int interval() const { return interval_; }
  int layers() const { return layers_; }

 private:
  int64_t sink_end(int64_t total) const { return total < sinks_ ? total : sinks_; }

  int64_t index_end0_;
  int sinks_, window_, interval_, layers_;
};

}  // namespace retroinfer::buffer
