#include "io/safetensors_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "retroinfer/error.h"

namespace retroinfer::io {

namespace {

using nlohmann::json;

// Element size of every safetensors dtype (to check offsets even for dtypes we then reject); 0 = unknown.
int dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

uint64_t get_u64(const json& v) { return v.is_number_unsigned() ? v.get<uint64_t>() : 0; }

}  // namespace

SafetensorsContents parse_safetensors(const uint8_t* data, size_t size, const std::string& file) {
  RETROINFER_CHECK(size >= 8, file, ": only ", size, " bytes: a safetensors file starts with an 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, data, 8);
  RETROINFER_CHECK(header_len <= kSafetensorsMaxHeader, file, ": header length ", header_len, " exceeds the limit of ",
                   kSafetensorsMaxHeader, " bytes (not a safetensors file?)");
  RETROINFER_CHECK(header_len <= size - 8, file, ": header length ", header_len, " extends past end of file (size ",
                   size, ")");
  const char* hdr = reinterpret_cast<const char*>(data + 8);
  const json j = json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  RETROINFER_CHECK(!j.is_discarded(), file, ": the ", header_len, "-byte header is not valid JSON");
  RETROINFER_CHECK(j.is_object(), file, ": the header must be a JSON object, found ", j.type_name());
  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  SafetensorsContents out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) for the overlap check
  std::vector<size_t> order;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      RETROINFER_CHECK(v.is_object(), file, ": '__metadata__' must be an object of strings, found ", v.type_name());
      for (const auto& [k, s] : v.items()) {
        RETROINFER_CHECK(s.is_string(), file, ": '__metadata__'.'", k, "' must be a string, found ", s.type_name());
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    RETROINFER_CHECK(v.is_object(), file, ": ", what, " must be an object, found ", v.type_name());
    RETROINFER_CHECK(v.contains("dtype") && v["dtype"].is_string(), file, ": ", what, " has no string 'dtype'");
    RETROINFER_CHECK(v.contains("shape") && v["shape"].is_array(), file, ": ", what, " has no array 'shape'");
    RETROINFER_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2 &&
                         v["data_offsets"][0].is_number_unsigned() && v["data_offsets"][1].is_number_unsigned(),
                     file, ": ", what, " needs 'data_offsets' = [begin, end] with non-negative integers");
    const std::string dtype = v["dtype"].get<std::string>();
    const int elem = dtype_bytes(dtype);
    RETROINFER_CHECK(elem > 0, file, ": ", what, " has unknown dtype '", dtype, "'");
    SafetensorsTensor t;
    t.name = name;
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      RETROINFER_CHECK(d.is_number_unsigned(), file, ": ", what, " shape entry ", d.dump(),
                       " must be a non-negative integer");
      const uint64_t x = get_u64(d);
      RETROINFER_CHECK(x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                           !__builtin_mul_overflow(numel, x, &numel),
                       file, ": ", what, " shape ", v["shape"].dump(), " overflows");
      t.shape.push_back(static_cast<int64_t>(x));
    }
    const uint64_t begin = get_u64(v["data_offsets"][0]), end = get_u64(v["data_offsets"][1]);
    RETROINFER_CHECK(begin <= end && end <= data_size, file, ": ", what, " data_offsets [", begin, ", ", end,
                     "] are outside the data section of ", data_size, " bytes (file size ", size, ")");
    uint64_t want = 0;
    RETROINFER_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &want) && want == end - begin, file,
                     ": ", what, " holds ", end - begin, " bytes but dtype ", dtype, " x shape ", v["shape"].dump(),
                     " needs ", numel, " x ", elem);
    if (dtype == "F32") t.type = WeightType::kF32;
    else if (dtype == "F16") t.type = WeightType::kF16;
    else if (dtype == "BF16") t.type = WeightType::kBF16;
    else RETROINFER_FAIL(file, ": ", what, " has dtype ", dtype, ", not supported (F32, F16, BF16 only)");
    t.data = base + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    ranges.emplace_back(begin, end);
    out.tensors.push_back(std::move(t));
  }
  std::vector<size_t> idx(ranges.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t k = 1; k < idx.size(); ++k) {
    const auto& a = ranges[idx[k - 1]];
    const auto& b = ranges[idx[k]];
    // Empty tensors occupy no bytes and may share an offset.
    RETROINFER_CHECK(a.second <= b.first || a.first == a.second || b.first == b.second, file, ": tensors '",
                     out.tensors[idx[k - 1]].name, "' [", a.first, ", ", a.second, ") and '",
                     out.tensors[idx[k]].name, "' [", b.first, ", ", b.second, ") overlap");
  }
  return out;
}

}  // namespace retroinfer::io
