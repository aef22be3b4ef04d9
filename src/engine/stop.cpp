#include <algorithm>

#include "retroinfer/generate.h"

namespace retroinfer {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::feed(std::string_view text) {
  pending_.append(text);
  Result r;
  // Earliest full match wins.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    r.emit = pending_.substr(0, first);
    r.stopped = true;
    pending_.clear();
    return r;
  }
  // Keep the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  r.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string s;
  s.swap(pending_);
  return s;
}

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kEos: return "eos";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kCallback: return "callback";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kConstraintComplete: return "constraint_complete";
  }
  return "?";
}

}  // namespace retroinfer
