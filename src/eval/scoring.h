// Answer scoring as RULER does it: case-insensitive substring match of the reference strings in the
// model's output.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace retroinfer::eval {

// RULER string_match_all for one sample: the share of references found in the output, in [0, 1].
// Throws Error when references is empty.
double string_match_all(std::string_view output, const std::vector<std::string>& references);
// RULER string_match_part for one sample: 1 when any reference is found, else 0.
double string_match_part(std::string_view output, const std::vector<std::string>& references);

}  // namespace retroinfer::eval
