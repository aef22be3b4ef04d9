// Command-line helpers shared by the benchmark programs in bench/.
#pragma once

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace retroinfer::bench {

// "32768,131072" -> {32768, 131072} (T integral: atoll; floating: atof; std::string: the items as they are);
// empty items are skipped.
template <typename T>
std::vector<T> parse_list(const char* s) {
  std::vector<T> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) {
        if constexpr (std::is_same_v<T, std::string>) v.push_back(cur);
        else if constexpr (std::is_floating_point_v<T>) v.push_back(static_cast<T>(std::atof(cur.c_str())));
        else v.push_back(static_cast<T>(std::atoll(cur.c_str())));
      }
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return v;
}

}  // namespace retroinfer::bench
