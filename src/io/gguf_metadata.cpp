// GgufMetadata: typed access to GGUF key/value metadata.
#include <limits>
#include <optional>

#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

namespace retroinfer {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

namespace {

std::string describe(const GgufValue& v) {
  if (v.type == GgufType::kArray)
    return "array of " + std::string(gguf_type_name(v.elem_type));
  return std::string(gguf_type_name(v.type));
}

// Integer value of v (any integer type); nullopt when v is not an integer or does not fit int64.
std::optional<int64_t> as_int(const GgufValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> as_float(const GgufValue& v) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  return std::nullopt;
}

const std::vector<GgufValue>& as_array(const GgufMetadata& m, std::string_view key, const GgufValue& v,
                                       const char* want) {
  const auto* a = std::get_if<std::vector<GgufValue>>(&v.value);
  RETROINFER_CHECK(a != nullptr, m.file(), ": GGUF metadata '", key, "' is ", describe(v), ", expected ",
                   want);
  return *a;
}

}  // namespace

const GgufValue* GgufMetadata::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufValue& GgufMetadata::get(std::string_view key) const {
  const GgufValue* v = find(key);
  RETROINFER_CHECK(v != nullptr, file_, ": GGUF metadata key '", key, "' is missing");
  return *v;
}

std::vector<std::string> GgufMetadata::keys() const {
  std::vector<std::string> out;
  out.reserve(kv_.size());
  for (const auto& [k, v] : kv_) out.push_back(k);
  return out;
}

std::string GgufMetadata::get_string(std::string_view key) const {
  const GgufValue& v = get(key);
  const auto* s = std::get_if<std::string>(&v.value);
  RETROINFER_CHECK(s != nullptr, file_, ": GGUF metadata '", key, "' is ", describe(v), ", expected string");
  return *s;
}

int64_t GgufMetadata::get_int(std::string_view key) const {
  const GgufValue& v = get(key);
  const auto i = as_int(v);
  RETROINFER_CHECK(i.has_value(), file_, ": GGUF metadata '", key, "' is ", describe(v),
                   ", expected an integer that fits int64");
  return *i;
}

double GgufMetadata::get_float(std::string_view key) const {
  const GgufValue& v = get(key);
  const auto d = as_float(v);
  RETROINFER_CHECK(d.has_value(), file_, ": GGUF metadata '", key, "' is ", describe(v), ", expected a number");
  return *d;
}

bool GgufMetadata::get_bool(std::string_view key) const {
  const GgufValue& v = get(key);
  const auto* b = std::get_if<bool>(&v.value);
  RETROINFER_CHECK(b != nullptr, file_, ": GGUF metadata '", key, "' is ", describe(v), ", expected bool");
  return *b;
}

std::vector<std::string> GgufMetadata::get_string_array(std::string_view key) const {
  const auto& a = as_array(*this, key, get(key), "array of string");
  std::vector<std::string> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto* s = std::get_if<std::string>(&a[i].value);
    RETROINFER_CHECK(s != nullptr, file_, ": GGUF metadata '", key, "'[", i, "] is ", describe(a[i]),
                     ", expected string");
    out.push_back(*s);
  }
  return out;
}

std::vector<int64_t> GgufMetadata::get_int_array(std::string_view key) const {
  const auto& a = as_array(*this, key, get(key), "array of integers");
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = as_int(a[i]);
    RETROINFER_CHECK(x.has_value(), file_, ": GGUF metadata '", key, "'[", i, "] is ", describe(a[i]),
                     ", expected an integer that fits int64");
    out.push_back(*x);
  }
  return out;
}

std::vector<float> GgufMetadata::get_float_array(std::string_view key) const {
  const auto& a = as_array(*this, key, get(key), "array of numbers");
  std::vector<float> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = as_float(a[i]);
    RETROINFER_CHECK(x.has_value(), file_, ": GGUF metadata '", key, "'[", i, "] is ", describe(a[i]),
                     ", expected a number");
    out.push_back(static_cast<float>(*x));
  }
  return out;
}

std::string GgufMetadata::get_string_or(std::string_view key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
int64_t GgufMetadata::get_int_or(std::string_view key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double GgufMetadata::get_float_or(std::string_view key, double dflt) const {
  return has(key) ? get_float(key) : dflt;
}
bool GgufMetadata::get_bool_or(std::string_view key, bool dflt) const {
  return has(key) ? get_bool(key) : dflt;
}

}  // namespace retroinfer
