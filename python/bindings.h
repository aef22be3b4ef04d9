// Shared pieces of the Python bindings (bindings.cpp: module, errors, tokenizer, model, generate;
// bindings_session.cpp: Session). The Python objects hold the loaded model through a shared_ptr, so a
// Tokenizer or Session outlives the Model object it came from safely.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "retroinfer/text_generate.h"

namespace retroinfer::python {

namespace py = pybind11;

// The loaded model shared by Model, Tokenizer and Session objects. Immutable after load (EngineModel's
// and Tokenizer's contracts allow concurrent use from any thread).
using SharedModel = std::shared_ptr<const LoadedModel>;

// Python Tokenizer: a model's tokenizer (kept alive through the model) or a standalone one.
struct PyTokenizer {
  std::shared_ptr<const Tokenizer> tok;
};

// Python Model.
struct PyModel {
  SharedModel m;
};

// Python Session: one sequence on the model's device. The mutex serialises calls from several Python
// threads (SequenceSession allows one caller at a time; the GIL is released while it computes).
struct PySession {
  SharedModel m;
  std::unique_ptr<SequenceSession> s;
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
};

// UTF-8 bytes of a Python str or bytes object. Throws Error for a str that cannot be encoded (a lone
// surrogate) or bytes that are not valid UTF-8 (naming the first bad byte offset); TypeError otherwise.
std::string utf8_text(const py::handle& obj, const char* what);

// A list/tuple/iterable of Python ints (or a 1-D integer numpy array) as int32 ids; Error for values out of
// int32 range, TypeError for non-integers.
std::vector<int32_t> token_list(const py::handle& obj, const char* what);

// Session options for `attention` on the model's device: default_session_options, then kv_dtype
// ("f32" | "bf16" | None = the device's), prefill_chunk (None = the device's), max_context (0 = the model's
// maximum), the KV placement keywords in `kwargs` (kv_placement "auto" | "gpu" | "split" | "host",
// gpu_layers, cache_fraction, cache_page_tokens, gpu_memory_limit and host_memory_limit in bytes: the
// KvPlacementOptions fields, checked against the device by validate_kv_placement), then the AttentionConfig
// fields named in the other kwargs (unknown names raise TypeError). The attention fields are validated where
// the session is made (make_session: retroinfer.Error with the C++ message).
SessionOptions session_options(const LoadedModel& m, const std::string& attention, const py::object& kv_dtype,
                               const py::object& prefill_chunk, int64_t max_context, const py::kwargs& kwargs);
// The KV placement report (SequenceSession::kv_placement_report) as a dict, or None (the CPU runner): the
// keys of add_kv_placement_json (kv_placement, gpu_layers, host_layers, and with host-tier layers cache_hits,
// cache_misses, cache_hit_ratio, step_pcie_bytes, pcie_bytes, pcie_decode_steps).
py::object kv_placement_dict(const std::optional<KvPlacementReport>& r);
// The KV placement keywords, listed for docstrings.
extern const char* const kKvPlacementKeywordsDoc;
// The AttentionConfig fields as a dict (kind as its name).
py::dict attention_config_dict(const AttentionConfig& c);
// Applies the AttentionConfig fields named in kwargs to c (no validation).
void apply_attention_kwargs(AttentionConfig& c, const py::kwargs& kwargs);
// doc followed by the attention keywords with their help and defaults (retroinfer/attention_params.h); the
// text lives as long as the module.
const char* with_keywords(const char* doc);

void bind_session(py::module_& m);

}  // namespace retroinfer::python
