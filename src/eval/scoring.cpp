#include "eval/scoring.h"

#include <algorithm>
#include <cctype>

#include "retroinfer/error.h"

namespace retroinfer::eval {
namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  std::transform(o.begin(), o.end(), o.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return o;
}

int found(std::string_view output, const std::vector<std::string>& references) {
  RETROINFER_CHECK(!references.empty(), "eval: a sample without references cannot be scored");
  const std::string out = lower(output);
  int n = 0;
  for (const auto& r : references) n += out.find(lower(r)) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

double string_match_all(std::string_view output, const std::vector<std::string>& references) {
  return static_cast<double>(found(output, references)) / static_cast<double>(references.size());
}

double string_match_part(std::string_view output, const std::vector<std::string>& references) {
  return found(output, references) > 0 ? 1.0 : 0.0;
}

}  // namespace retroinfer::eval
