// Python Session (one sequence: prefill, decode, fork) and the AttentionConfig keyword arguments.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <climits>
#include <deque>
#include <optional>
#include <string>
#include <variant>

#include "bindings.h"
#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"
#include "retroinfer/key_calibration_store.h"

namespace retroinfer::python {
namespace {

// The AttentionConfig fields reachable by keyword: the table of retroinfer/attention_params.h (the keyword
// of `seed` is attention_seed: generate's `seed` is the sampler's).
std::string field_names() {
  std::string s;
  for (const AttentionParam& p : attention_params()) s += (s.empty() ? "" : ", ") + std::string(p.keyword);
  return s;
}

}  // namespace

const char* with_keywords(const char* doc) {
  static const std::string keywords = [] {
    std::string s = "\n\nAttention keywords (AttentionConfig fields):";
    for (const AttentionParam& p : attention_params())
      s += "\n  " + std::string(p.keyword) + ": " + attention_param_help(p) +
           (std::holds_alternative<bool AttentionConfig::*>(p.field) ? " (when False)" : "");
    return s;
  }();
  // Docstrings live as long as the module: one string per call site, kept.
  static std::deque<std::string> docs;
  return docs.emplace_back(std::string(doc) + keywords).c_str();
}

namespace {

// A Python int (not a bool) within [lo, hi].
long long int_value(const char* name, const py::handle& v, long long lo, long long hi) {
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    throw py::type_error(std::string("attention parameter ") + name + " takes an int, got " +
                         std::string(py::str(py::type::of(v).attr("__name__"))));
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0 || x < lo || x > hi)
    RETROINFER_FAIL("attention parameter ", name, " = ", std::string(py::str(v)), " is out of range [", lo, ", ", hi, "]");
  return x;
}

double float_value(const char* name, const py::handle& v) {
  if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr())))
    throw py::type_error(std::string("attention parameter ") + name + " takes a number, got " +
                         std::string(py::str(py::type::of(v).attr("__name__"))));
  return py::cast<double>(v);
}

void set_field(AttentionConfig& c, const AttentionParam& p, const py::handle& v) {
  const std::string name(p.keyword);
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!PyBool_Check(v.ptr())) throw py::type_error("attention parameter " + name + " takes a bool");
          c.*member = v.ptr() == Py_True;
        } else if constexpr (std::is_same_v<T, int>) {
          c.*member = static_cast<int>(int_value(name.c_str(), v, INT_MIN, INT_MAX));
        } else if constexpr (std::is_same_v<T, int64_t>) {
          c.*member = int_value(name.c_str(), v, LLONG_MIN, LLONG_MAX);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          c.*member = static_cast<uint64_t>(int_value(name.c_str(), v, 0, LLONG_MAX));
        } else {
          c.*member = static_cast<T>(float_value(name.c_str(), v));
        }
      },
      p.field);
}

// logits ([n] or [rows, cols]) handed to numpy without a copy: the vector moves into the array's owner.
py::array_t<float> to_numpy(std::vector<float>&& v, int64_t rows, int64_t cols) {
  auto* owned = new std::vector<float>(std::move(v));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  std::vector<py::ssize_t> shape;
  if (rows < 0) shape = {static_cast<py::ssize_t>(owned->size())};
  else shape = {static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)};
  return py::array_t<float>(shape, owned->data(), owner);
}

py::dict stats_dict(const AttentionStats& s) {
  py::dict d;
  d["context_tokens"] = s.context_tokens;
  d["exact_tokens"] = s.exact_tokens;
  d["retrieved_clusters"] = s.retrieved_clusters;
  d["estimated_clusters"] = s.estimated_clusters;
  d["exact_token_share"] = s.context_tokens > 0 ? static_cast<double>(s.exact_tokens) / s.context_tokens : 0.0;
  return d;
}

}  // namespace

void apply_attention_kwargs(AttentionConfig& c, const py::kwargs& kwargs) {
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::cast<std::string>(key);
    const AttentionParam* p = nullptr;
    for (const AttentionParam& q : attention_params())
      if (name == q.keyword) p = &q;
    if (!p) throw py::type_error("unknown attention parameter '" + name + "'; known: " + field_names());
    set_field(c, *p, value);
  }
}

py::dict attention_config_dict(const AttentionConfig& c) {
  py::dict d;
  d["attention"] = std::string(attention_kind_name(c.kind));
  for (const AttentionParam& p : attention_params())
    std::visit([&](auto member) { d[py::str(std::string(p.keyword))] = c.*member; }, p.field);
  return d;
}

const char* const kKvPlacementKeywordsDoc =
    "\n\nKV placement keywords (the CUDA runner; the CPU runner takes kv_placement=\"auto\" only):"
    "\n  kv_placement: \"auto\" (the GPU when it fits, else retro's layers split between the GPU and pinned host "
    "memory, else refused), \"gpu\", \"split\" (gpu_layers on the GPU, the rest on the host) or \"host\" (every "
    "layer's KV in host memory, the GPU keeping a block cache); split and host are retro only"
    "\n  gpu_layers: split: layers whose KV stays on the GPU (-1: as many as fit)"
    "\n  cache_fraction: host-tier layers' GPU block cache per KV head, a fraction of the context (0.05)"
    "\n  cache_page_tokens: tokens per block-cache page (0: retro's tokens per cluster, at most 8)"
    "\n  host_store: host-tier layers' store, \"bf16\", \"int8\" (a scale per token row; half the PCIe bytes) or "
    "\"int4\" (a scale per 32 values of the row minus its cluster's mean; 28% of bf16's bytes)"
    "\n  gpu_memory_limit, host_memory_limit: bytes the session may use (0: what is free)";

py::object kv_placement_dict(const std::optional<KvPlacementReport>& r) {
  if (!r) return py::none();
  py::dict d;
  d["kv_placement"] = std::string(buffer::kv_placement_name(r->placement));
  d["gpu_layers"] = r->gpu_layers;
  d["host_layers"] = r->host_layers;
  if (r->host_layers > 0) {
    d["cache_hits"] = r->cache_hits;
    d["cache_misses"] = r->cache_misses;
    d["host_store"] = std::string(store_dtype_name(r->host_store));
    const double ratio = r->cache_hit_ratio();
    d["cache_hit_ratio"] = ratio >= 0.0 ? py::object(py::float_(ratio)) : py::object(py::none());
    d["step_pcie_bytes"] = r->step_pcie_bytes;
    d["pcie_bytes"] = r->pcie_bytes;
    d["pcie_decode_steps"] = r->decode_steps;
  }
  return d;
}

namespace {

// Takes the KV placement keywords out of kwargs into kv; returns the rest (the attention keywords).
py::kwargs take_kv_placement_kwargs(KvPlacementOptions& kv, const py::kwargs& kwargs) {
  py::kwargs rest;
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::cast<std::string>(key);
    if (name == "kv_placement") {
      if (!PyUnicode_Check(value.ptr())) throw py::type_error("kv_placement takes a str: auto, gpu, split or host");
      kv.placement = buffer::parse_kv_placement(py::cast<std::string>(value));
    } else if (name == "gpu_layers") {
      kv.gpu_layers = static_cast<int>(int_value("gpu_layers", value, INT_MIN, INT_MAX));
    } else if (name == "cache_fraction") {
      kv.cache_fraction = float_value("cache_fraction", value);
    } else if (name == "cache_page_tokens") {
      kv.page_tokens = static_cast<int>(int_value("cache_page_tokens", value, INT_MIN, INT_MAX));
    } else if (name == "host_store") {
      if (!PyUnicode_Check(value.ptr())) throw py::type_error("host_store takes a str: bf16, int8 or int4");
      kv.host_store = parse_store_dtype(py::cast<std::string>(value));
    } else if (name == "gpu_memory_limit") {
      kv.gpu_memory_limit = int_value("gpu_memory_limit", value, LLONG_MIN, LLONG_MAX);
    } else if (name == "host_memory_limit") {
      kv.host_memory_limit = int_value("host_memory_limit", value, LLONG_MIN, LLONG_MAX);
    } else {
      rest[key] = value;
    }
  }
  return rest;
}

}  // namespace

SessionOptions session_options(const LoadedModel& m, const std::string& attention, const py::object& kv_dtype,
                               const py::object& prefill_chunk, int64_t max_context, const py::kwargs& kwargs) {
  SessionOptions so = default_session_options(m.engine->device(), parse_attention_kind(attention),
                                              m.model->config().head_dim);
  if (!kv_dtype.is_none()) so.kv_dtype = parse_dtype(py::cast<std::string>(kv_dtype));
  if (!prefill_chunk.is_none()) so.prefill_chunk = static_cast<int>(int_value("prefill_chunk", prefill_chunk, 1, INT_MAX));
  RETROINFER_CHECK(max_context >= 0, "session: max_context must be >= 0 (0 = the model's maximum), got ", max_context);
  so.max_context = max_context;
  const py::kwargs attention_kwargs = take_kv_placement_kwargs(so.kv_placement, kwargs);
  validate_kv_placement(so.kv_placement, m.engine->device());
  apply_attention_kwargs(so.attention, attention_kwargs);  // validated where the session is made (make_session)
  if (is_scaled_8bit(so.kv_dtype) && m.engine->device() == Device::kCpu) {
    // The CPU runner's 8-bit caches store keys relative to the model's key calibration: from the on-disk store,
    // else a 2048-token prefill (kept there for the next process).
    py::gil_scoped_release nogil;
    load_or_compute_key_calibration(*m.model, m.tokenizer.get(), default_key_calibration_dir());
  }
  return so;
}

void bind_session(py::module_& m) {
  py::class_<PySession>(m, "Session",
                        "One sequence on the model's device (Model.session): prefill once, then decode token by "
                        "token. Logits come back as float32 numpy arrays. One caller at a time (calls from several "
                        "threads are serialised).")
      .def(
          "prefill",
          [](PySession& self, const py::object& tokens, bool all_logits) {
            const std::vector<int32_t> ids = token_list(tokens, "prefill tokens");
            std::vector<float> logits;
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(*self.mu);
              logits = self.s->prefill(ids, all_logits);
            }
            const int64_t vocab = self.s->model_config().vocab_size;
            return all_logits ? to_numpy(std::move(logits), static_cast<int64_t>(ids.size()), vocab)
                              : to_numpy(std::move(logits), -1, 0);
          },
          py::arg("tokens"), py::arg("all_logits") = false,
          "Runs the prompt (once per session, before any decode) and builds the attention method's index. "
          "Returns the logits of the last position ([vocab] float32), or of every position ([n, vocab]) with "
          "all_logits=True.")
      .def(
          "decode",
          [](PySession& self, int64_t token) {
            RETROINFER_CHECK(token >= INT32_MIN && token <= INT32_MAX, "decode: token id ", token, " is out of range");
            std::vector<float> logits(static_cast<size_t>(self.s->model_config().vocab_size));
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(*self.mu);
              self.s->decode(static_cast<int32_t>(token), logits);
            }
            return to_numpy(std::move(logits), -1, 0);
          },
          py::arg("token"), "Appends one token at position num_tokens and returns the next-token logits ([vocab] float32).")
      .def(
          "fork",
          [](const PySession& self, const std::optional<std::string>& attention, const py::kwargs& kwargs) {
            AttentionConfig c = self.s->attention_config();
            if (attention) c.kind = parse_attention_kind(*attention);
            apply_attention_kwargs(c, kwargs);  // validated by fork_session
            PySession out{self.m, nullptr};
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(*self.mu);
              out.s = self.s->fork_session(c);
            }
            return out;
          },
          py::arg("attention") = py::none(),
          with_keywords("A new session over a copy of this prefilled session's KV cache with another attention "
                        "method (and parameters: the attention keywords, starting from this session's), its index "
                        "built."))
      .def_property_readonly("num_tokens", [](const PySession& self) { return self.s->position(); },
                             "Tokens in the cache.")
      .def_property_readonly("max_context", [](const PySession& self) { return self.s->max_context(); },
                             "Tokens this session may hold.")
      .def_property_readonly("device", [](const PySession& self) { return std::string(device_name(self.s->device())); })
      .def_property_readonly("attention", [](const PySession& self) {
        return std::string(attention_kind_name(self.s->attention_config().kind));
      })
      .def_property_readonly("attention_config",
                             [](const PySession& self) { return attention_config_dict(self.s->attention_config()); },
                             "The attention parameters in force (a dict).")
      .def_property_readonly(
          "kv_placement",
          [](const PySession& self) {
            std::optional<KvPlacementReport> r;
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(*self.mu);
              r = self.s->kv_placement_report();
            }
            return kv_placement_dict(r);
          },
          "Where the KV lives (CUDA runner; None on the CPU): kv_placement (gpu | split | host), gpu_layers, "
          "host_layers and, with host-tier layers, cache_hits, cache_misses, cache_hit_ratio (the GPU block "
          "cache's share of retrieved clusters since prefill), step_pcie_bytes and pcie_bytes (the misses' K/V "
          "bytes read from host memory: last step, all steps), pcie_decode_steps.")
      .def_property_readonly("last_stats", [](const PySession& self) { return stats_dict(self.s->last_stats()); },
                             "What the last decode step read, summed over layers: context_tokens, exact_tokens, "
                             "retrieved_clusters, estimated_clusters, exact_token_share.")
      .def("__repr__", [](const PySession& self) {
        return "<retroinfer.Session " + std::string(attention_kind_name(self.s->attention_config().kind)) + " on " +
               std::string(device_name(self.s->device())) + ", " + std::to_string(self.s->position()) + "/" +
               std::to_string(self.s->max_context()) + " tokens>";
      });

  m.def(
      "attention_config",
      [](const std::string& attention, int head_dim, const py::kwargs& kwargs) {
        AttentionConfig c;
        c.kind = parse_attention_kind(attention);
        if (head_dim > 0) c.tokens_per_cluster = default_tokens_per_cluster(head_dim);
        apply_attention_kwargs(c, kwargs);
        validate(c);
        return attention_config_dict(c);
      },
      py::arg("attention") = "retro", py::arg("head_dim") = 0,
      with_keywords("The attention parameters a session would use (defaults, head_dim's cluster size when "
                    "head_dim > 0, then the given keywords), validated: raises retroinfer.Error with the C++ "
                    "message on a bad value."));
}

}  // namespace retroinfer::python
