#include "io/gguf_reader.h"

#include <algorithm>
#include <limits>
#include <set>

#include "io/byte_reader.h"
#include "retroinfer/error.h"

namespace retroinfer::io {

std::string ggml_type_name(uint32_t code) {
  static const char* const kNames[] = {
      "F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0",    "Q5_1",    "Q8_0",  "Q8_1",
      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32",   "I64",     "F64",   "IQ1_M",
      "BF16"};
  if (code < sizeof(kNames) / sizeof(kNames[0])) return kNames[code];
  return "type " + std::to_string(code);
}

namespace {

// Smallest encoded size of one value of type t (used to bound counts against the bytes left before
// anything is allocated).
size_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: return 8;   // length only
    case GgufType::kArray: return 12;   // element type + count
  }
  return 1;
}

bool valid_type_code(uint32_t c) { return c <= static_cast<uint32_t>(GgufType::kFloat64); }

class Parser {
 public:
  Parser(const uint8_t* data, size_t size, const std::string& file) : r_(data, size, file), file_(file) {}

  GgufContents run();

 private:
  GgufValue read_value(GgufType t, const std::string& key, int depth);
  GgufType read_type(const std::string& key, const char* which);

  ByteReader r_;
  const std::string& file_;
  uint64_t elements_ = 0;  // array elements read so far, over all metadata
};

GgufType Parser::read_type(const std::string& key, const char* which) {
  const size_t at = r_.pos();
  const uint32_t c = r_.read<uint32_t>(std::string("metadata '") + key + "' " + which);
  RETROINFER_CHECK(valid_type_code(c), file_, ": metadata '", key, "' has invalid ", which, " code ", c,
                   " at offset ", at, " (valid: 0..12)");
  return static_cast<GgufType>(c);
}

GgufValue Parser::read_value(GgufType t, const std::string& key, int depth) {
  GgufValue v;
  v.type = t;
  auto what = [&] { return "metadata '" + key + "' value"; };
  switch (t) {
    case GgufType::kUint8: v.value = static_cast<uint64_t>(r_.read<uint8_t>(what())); break;
    case GgufType::kInt8: v.value = static_cast<int64_t>(r_.read<int8_t>(what())); break;
    case GgufType::kUint16: v.value = static_cast<uint64_t>(r_.read<uint16_t>(what())); break;
    case GgufType::kInt16: v.value = static_cast<int64_t>(r_.read<int16_t>(what())); break;
    case GgufType::kUint32: v.value = static_cast<uint64_t>(r_.read<uint32_t>(what())); break;
    case GgufType::kInt32: v.value = static_cast<int64_t>(r_.read<int32_t>(what())); break;
    case GgufType::kUint64: v.value = r_.read<uint64_t>(what()); break;
    case GgufType::kInt64: v.value = r_.read<int64_t>(what()); break;
    case GgufType::kFloat32: v.value = static_cast<double>(r_.read<float>(what())); break;
    case GgufType::kFloat64: v.value = r_.read<double>(what()); break;
    case GgufType::kBool: {
      const size_t at = r_.pos();
      const uint8_t b = r_.read<uint8_t>(what());
      RETROINFER_CHECK(b <= 1, file_, ": metadata '", key, "' bool at offset ", at, " is ", int(b),
                       " (must be 0 or 1)");
      v.value = b == 1;
      break;
    }
    case GgufType::kString: v.value = r_.read_string(what()); break;
    case GgufType::kArray: {
      RETROINFER_CHECK(depth < kGgufMaxArrayDepth, file_, ": metadata '", key, "' nests arrays deeper than ",
                       kGgufMaxArrayDepth, " levels");
      v.elem_type = read_type(key, "array element type");
      const size_t at = r_.pos();
      const uint64_t n = r_.read<uint64_t>("metadata '" + key + "' array length");
      const size_t min_bytes = min_value_bytes(v.elem_type);
      RETROINFER_CHECK(n <= r_.remaining() / min_bytes, file_, ": metadata '", key, "' array length ", n,
                       " at offset ", at, " cannot fit in the ", r_.remaining(),
                       " bytes left (each element takes at least ", min_bytes, "); file size ", r_.size());
      elements_ += n;
      RETROINFER_CHECK(elements_ <= kGgufMaxMetadataElements, file_, ": metadata '", key, "' array length ", n,
                       " brings the metadata past ", kGgufMaxMetadataElements, " array elements (limit against "
                       "crafted files; real models use under 1M)");
      std::vector<GgufValue> a;
      a.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(v.elem_type, key, depth + 1));
      v.value = std::move(a);
      break;
    }
  }
  return v;
}

GgufContents Parser::run() {
  GgufContents g;
  g.metadata = GgufMetadata(file_);
  const uint32_t magic = r_.read<uint32_t>("header magic");
  RETROINFER_CHECK(magic == kGgufMagic, file_, ": bad magic 0x", std::hex, magic, std::dec,
                   ": not a GGUF file (expected the bytes 'GGUF')");
  g.version = r_.read<uint32_t>("header version");
  if (g.version == 0x02000000u || g.version == 0x03000000u)
    RETROINFER_FAIL(file_, ": big-endian GGUF (version bytes ", std::hex, g.version, std::dec,
                    ") is not supported; convert the model on a little-endian machine");
  RETROINFER_CHECK(g.version == 2 || g.version == 3, file_, ": GGUF version ", g.version,
                   " is not supported (only 2 and 3; re-convert version-1 files with llama.cpp)");
  const uint64_t n_tensors = r_.read<uint64_t>("header tensor_count");
  const uint64_t n_kv = r_.read<uint64_t>("header metadata_kv_count");
  // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes; a KV pair at
  // least 8 (key length) + 4 (type) + 1 (value).
  RETROINFER_CHECK(n_tensors <= r_.remaining() / 24, file_, ": header tensor_count ", n_tensors,
                   " cannot fit in a file of ", r_.size(), " bytes");
  RETROINFER_CHECK(n_kv <= r_.remaining() / 13, file_, ": header metadata_kv_count ", n_kv,
                   " cannot fit in a file of ", r_.size(), " bytes");

  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = r_.pos();
    std::string key = r_.read_string("metadata key #" + std::to_string(i));
    RETROINFER_CHECK(!g.metadata.has(key), file_, ": metadata key '", key, "' at offset ", at, " is duplicated");
    const GgufType t = read_type(key, "value type");
    GgufValue v = read_value(t, key, 0);
    g.metadata.set(std::move(key), std::move(v));
  }

  if (const GgufValue* a = g.metadata.find("general.alignment")) {
    const auto* u = std::get_if<uint64_t>(&a->value);
    RETROINFER_CHECK(a->type == GgufType::kUint32 && u != nullptr, file_,
                     ": metadata 'general.alignment' must be uint32, found ", gguf_type_name(a->type));
    RETROINFER_CHECK(*u != 0 && (*u & (*u - 1)) == 0 && *u <= (1u << 20), file_, ": metadata 'general.alignment' is ",
                     *u, ": must be a power of two <= 2^20");
    g.alignment = static_cast<uint32_t>(*u);
  }

  std::set<std::string, std::less<>> names;
  g.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    const size_t at = r_.pos();
    t.name = r_.read_string("tensor info #" + std::to_string(i) + " name");
    RETROINFER_CHECK(!t.name.empty(), file_, ": tensor info #", i, " at offset ", at, " has an empty name");
    RETROINFER_CHECK(names.insert(t.name).second, file_, ": tensor '", t.name, "' is listed twice");
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t n_dims = r_.read<uint32_t>(what + " n_dims");
    RETROINFER_CHECK(n_dims >= 1 && n_dims <= kGgufMaxDims, file_, ": ", what, " has n_dims ", n_dims,
                     " (must be 1..", kGgufMaxDims, ")");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r_.read<uint64_t>(what + " dim " + std::to_string(d));
      RETROINFER_CHECK(ne >= 1 && ne <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), file_, ": ",
                       what, " dim ", d, " is ", ne, " (must be >= 1)");
      RETROINFER_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(ne), &numel), file_, ": ", what,
                       " element count overflows int64 (dims too large)");
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    t.ggml_type = r_.read<uint32_t>(what + " type");
    switch (static_cast<GgmlType>(t.ggml_type)) {
      case GgmlType::kF32: t.type = WeightType::kF32; break;
      case GgmlType::kF16: t.type = WeightType::kF16; break;
      case GgmlType::kBF16: t.type = WeightType::kBF16; break;
      case GgmlType::kQ8_0: t.type = WeightType::kQ8_0; break;
      case GgmlType::kQ4_0: t.type = WeightType::kQ4_0; break;
      case GgmlType::kQ4_1: t.type = WeightType::kQ4_1; break;
      case GgmlType::kQ5_0: t.type = WeightType::kQ5_0; break;
      case GgmlType::kQ5_1: t.type = WeightType::kQ5_1; break;
      case GgmlType::kQ4_K: t.type = WeightType::kQ4_K; break;
      case GgmlType::kQ5_K: t.type = WeightType::kQ5_K; break;
      case GgmlType::kQ6_K: t.type = WeightType::kQ6_K; break;
      default:
        RETROINFER_FAIL(file_, ": ", what, " has ggml type ", ggml_type_name(t.ggml_type), " (", t.ggml_type,
                        "), not supported: use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K");
    }
    const int block = weight_type_block_elems(t.type);
    RETROINFER_CHECK(t.dims[0] % block == 0, file_, ": ", what, " of type ", weight_type_name(t.type),
                     " has innermost dim ", t.dims[0], ", not a multiple of its block size ", block);
    // numel / block * block_bytes <= numel * 4 cannot overflow after the check below.
    RETROINFER_CHECK(numel <= std::numeric_limits<int64_t>::max() / 4, file_, ": ", what, " is too large");
    t.nbytes = static_cast<size_t>(numel / block) * static_cast<size_t>(weight_type_block_bytes(t.type));
    t.offset = r_.read<uint64_t>(what + " data offset");
    RETROINFER_CHECK(t.offset % g.alignment == 0, file_, ": ", what, " data offset ", t.offset,
                     " is not a multiple of the alignment ", g.alignment);
    g.tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = r_.pos();
  g.data_offset = (end_of_infos + g.alignment - 1) / g.alignment * g.alignment;
  const uint64_t file_size = r_.size();
  RETROINFER_CHECK(g.tensors.empty() || g.data_offset <= file_size, file_, ": data section offset ",
                   g.data_offset, " is past the end of the file (size ", file_size, ")");
  const uint64_t data_size = g.data_offset <= file_size ? file_size - g.data_offset : 0;
  std::vector<std::pair<uint64_t, size_t>> ranges;  // (offset, index) for the overlap check
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    GgufTensor& t = g.tensors[i];
    RETROINFER_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, file_, ": tensor '", t.name,
                     "' data [offset ", g.data_offset + t.offset, ", ", t.nbytes,
                     " bytes] extends past end of file (size ", file_size, ")");
    ranges.emplace_back(t.offset, i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const GgufTensor& a = g.tensors[ranges[k - 1].second];
    const GgufTensor& b = g.tensors[ranges[k].second];
    RETROINFER_CHECK(a.offset + a.nbytes <= b.offset, file_, ": tensors '", a.name, "' [offset ", a.offset, ", ",
                     a.nbytes, " bytes] and '", b.name, "' [offset ", b.offset, "] overlap in the data section");
  }
  return g;
}

}  // namespace

GgufContents parse_gguf(const uint8_t* data, size_t size, const std::string& file) {
  Parser p(data, size, file);
  GgufContents g = p.run();
  for (GgufTensor& t : g.tensors) t.data = data + g.data_offset + t.offset;
  return g;
}

}  // namespace retroinfer::io
