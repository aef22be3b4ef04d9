// The Python extension module retroinfer._retroinfer: load(), Model (config, tokenizer, generate, session),
// Tokenizer, GenerateResult, and the exception class retroinfer.Error (a RuntimeError) that every
// retroinfer::Error becomes. Generation reuses text_generate.h, the same functions `retroinfer generate`
// calls. The GIL is released while the model computes; Python callbacks take it back.
#include <pybind11/stl.h>

#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "retroinfer/model_file.h"
#include "retroinfer/error.h"
#include "retroinfer/snapshot.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer::python {

std::string utf8_text(const py::handle& obj, const char* what) {
  if (PyUnicode_Check(obj.ptr())) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (!p) {
      PyErr_Clear();
      RETROINFER_FAIL(what, ": the text cannot be encoded as UTF-8 (it holds a lone surrogate); pass valid Unicode");
    }
    return std::string(p, static_cast<size_t>(n));
  }
  std::string s;
  if (PyBytes_Check(obj.ptr())) s = std::string(PyBytes_AS_STRING(obj.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(obj.ptr())));
  else if (PyByteArray_Check(obj.ptr()))
    s = std::string(PyByteArray_AS_STRING(obj.ptr()), static_cast<size_t>(PyByteArray_GET_SIZE(obj.ptr())));
  else
    throw py::type_error(std::string(what) + ": expected str or bytes, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = tokenizer::utf8_valid_prefix_len(s, pos);
    RETROINFER_CHECK(len > 0, what, ": the bytes are not valid UTF-8 (byte ", pos, " of ", s.size(), ", value 0x", std::hex,
                     static_cast<int>(static_cast<unsigned char>(s[pos])), std::dec, "); decode them to str first");
    pos += len;
  }
  return s;
}

std::vector<int32_t> token_list(const py::handle& obj, const char* what) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
    throw py::type_error(std::string(what) + ": expected a sequence of token ids (ints), got text");
  std::vector<int32_t> ids;
  for (const py::handle item : py::iter(obj)) {
    if (PyBool_Check(item.ptr()) || !PyIndex_Check(item.ptr()))
      throw py::type_error(std::string(what) + ": token ids must be ints, got " +
                           std::string(py::str(py::type::of(item).attr("__name__"))));
    const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    RETROINFER_CHECK(overflow == 0 && v >= INT32_MIN && v <= INT32_MAX, what, ": token id ", std::string(py::str(item)),
                     " at index ", ids.size(), " is out of range");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

namespace {

py::str to_str(const std::string& bytes) {
  // Text from the detokenizer is valid UTF-8; raw decode() of arbitrary ids may not be: replace, never fail.
  PyObject* o = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  d["architecture"] = c.architecture;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_layers"] = c.num_layers;
  d["num_heads_q"] = c.num_heads_q;
  d["num_heads_kv"] = c.num_heads_kv;
  d["head_dim"] = c.head_dim;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope_theta;
  py::dict rs;
  rs["type"] = c.rope_scaling.type;
  rs["factor"] = c.rope_scaling.factor;
  rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
  rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
  rs["original_max_position"] = c.rope_scaling.original_max_position;
  rs["beta_fast"] = c.rope_scaling.beta_fast;
  rs["beta_slow"] = c.rope_scaling.beta_slow;
  rs["attention_factor"] = c.rope_scaling.attention_factor;
  d["rope_scaling"] = rs;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["max_context"] = model_max_context(c);
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["attention_bias"] = c.attention_bias;
  d["bos_token_id"] = c.bos_token_id;
  d["eos_token_ids"] = c.eos_token_ids;
  d["sliding_window"] = c.sliding_window;
  return d;
}

std::vector<ChatMessage> chat_messages(const py::iterable& messages) {
  std::vector<ChatMessage> out;
  for (const py::handle m : messages) {
    if (py::isinstance<py::dict>(m)) {
      const py::dict d = py::reinterpret_borrow<py::dict>(m);
      if (!d.contains("role") || !d.contains("content"))
        throw py::type_error("chat message: a dict needs 'role' and 'content'");
      out.push_back({utf8_text(d["role"], "chat role"), utf8_text(d["content"], "chat content")});
    } else {
      const py::tuple t = py::cast<py::tuple>(m);
      if (t.size() != 2) throw py::type_error("chat message: expected a dict or a (role, content) pair");
      out.push_back({utf8_text(t[0], "chat role"), utf8_text(t[1], "chat content")});
    }
  }
  return out;
}

std::shared_ptr<const Tokenizer> need_tokenizer(const SharedModel& m, const char* what) {
  RETROINFER_CHECK(m->tokenizer != nullptr, what, ": this model was loaded without a tokenizer (tokenizer=\"\"); "
                   "pass token ids, or load it with its tokenizer");
  return {m, m->tokenizer.get()};  // aliasing: keeps the whole model alive
}

// with_keywords(doc) with the KV placement keywords between doc and the attention keywords.
const char* with_placement_keywords(const char* doc) {
  return with_keywords((std::string(doc) + kKvPlacementKeywordsDoc).c_str());
}

py::dict summary_stats(const GenerateSummary& s) {
  py::dict d;
  d["prompt_tokens"] = s.prompt_tokens;
  d["reused_tokens"] = s.reused_tokens;
  d["generated_tokens"] = s.generated_tokens;
  d["decode_steps"] = s.decode_steps;
  d["prefill_s"] = s.prefill_seconds;
  d["decode_s"] = s.decode_seconds;
  d["ttft_s"] = s.time_to_first_token_s;
  d["prefill_tok_s"] = s.prefill_tokens_per_s;
  d["decode_tok_s"] = s.decode_tokens_per_s;
  d["exact_tokens"] = s.exact_tokens;
  d["context_tokens"] = s.context_tokens;
  d["kv_read_share"] = s.kv_read_share;
  d["mean_exact_tokens_per_head"] = s.mean_exact_tokens_per_head;
  if (s.kv_placement) d.attr("update")(kv_placement_dict(s.kv_placement));
  return d;
}

GenerateSummary run_generate(const PyModel& self, const py::object& prompt, int max_tokens, const std::string& attention,
                             float temperature, float top_p, int top_k, uint64_t seed, const py::object& stop, bool chat,
                             const std::string& system, bool ignore_eos, const py::object& on_token,
                             const py::object& kv_dtype, const py::object& prefill_chunk, const py::object& snapshot,
                             const py::kwargs& kwargs) {
  const LoadedModel& lm = *self.m;
  const SessionOptions so = session_options(lm, attention, kv_dtype, prefill_chunk, 0, kwargs);
  // With a snapshot the prompt continues its context: its tokens first, then the prompt's (text without the
  // tokenizer's special prefix), as `retroinfer generate --snapshot`.
  std::optional<Snapshot> snap;
  std::vector<int32_t> ids;
  if (!snapshot.is_none()) {
    RETROINFER_CHECK(!chat, "generate: chat=True wraps the whole prompt in the chat template; with snapshot= the "
                     "prompt continues the saved context (save the context with chat=True)");
    const std::string path = py::str(snapshot);
    py::gil_scoped_release nogil;
    snap = load_snapshot(path);
    check_snapshot(*snap, model_identity(*lm.model, lm.tokenizer.get()), so.kv_dtype, so.attention, path);
    ids = snap->context.tokens;
  }
  // Prompt: text is encoded as `retroinfer generate` encodes it; ids are taken as they are.
  const bool is_text = PyUnicode_Check(prompt.ptr()) || PyBytes_Check(prompt.ptr()) || PyByteArray_Check(prompt.ptr());
  if (is_text) {
    const std::string text = utf8_text(prompt, "generate prompt");
    const Tokenizer& tok = *need_tokenizer(self.m, "generate with a text prompt");
    const std::vector<int32_t> more = snap ? tok.encode(text, false, true) : encode_prompt(tok, text, chat, system);
    ids.insert(ids.end(), more.begin(), more.end());
  } else {
    RETROINFER_CHECK(!chat, "generate: chat=True needs a text prompt, not token ids");
    const std::vector<int32_t> more = token_list(prompt, "generate prompt");
    ids.insert(ids.end(), more.begin(), more.end());
  }
  RETROINFER_CHECK(!ids.empty(), "generate: the prompt encodes to no tokens");
  const KvPrefix* context = snap ? &snap->context : nullptr;
  GenerateOptions go;
  go.max_new_tokens = max_tokens;
  go.sampler.temperature = temperature;
  go.sampler.top_k = top_k;
  go.sampler.top_p = top_p;
  go.sampler.seed = seed;
  validate(go.sampler);
  go.ignore_eos = ignore_eos;
  if (!stop.is_none()) {
    if (PyUnicode_Check(stop.ptr())) go.stop_strings.push_back(utf8_text(stop, "stop"));
    else
      for (const py::handle s : py::iter(stop)) go.stop_strings.push_back(utf8_text(s, "stop"));
  }

  // Every token passes through the callback, with the GIL: Ctrl-C (a pending signal) and an exception
  // from on_token stop the generation and are re-raised once the GIL is ours again.
  bool py_error = false;
  auto on_text = [&](int32_t token, std::string_view text) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      py_error = true;
      return false;
    }
    if (on_token.is_none()) return true;
    try {
      const py::object r = on_token(token, to_str(std::string(text)));
      return !(r.ptr() == Py_False);
    } catch (py::error_already_set& e) {
      e.restore();
      py_error = true;
      return false;
    }
  };
  GenerateSummary s;
  {
    py::gil_scoped_release nogil;
    if (lm.tokenizer) {
      TextGenerateCallbacks cb;
      cb.on_text = on_text;
      s = generate_text(*lm.engine, *lm.tokenizer, so, ids, go, cb, context);
    } else {  // token ids only: no text, no stop strings
      RETROINFER_CHECK(go.stop_strings.empty(), "generate: stop strings need a tokenizer; this model has none");
      go.eos_token_ids = end_of_generation_ids(lm.model->config(), nullptr);
      GenerateCallbacks cb;
      cb.on_token = on_text;
      s = generate(*lm.engine, so, ids, go, cb, nullptr, context);
    }
  }
  if (py_error) throw py::error_already_set();
  return s;
}

// The module in parts: the tokenizer, the generation result, the model; bindings_session.cpp the session.
void bind_tokenizer(py::module_& m) {
  py::class_<PyTokenizer>(m, "Tokenizer",
                          "Byte-level BPE tokenizer (Model.tokenizer, or Tokenizer.from_file for a tokenizer.json).")
      .def_static(
          "from_file",
          [](const std::string& path) {
            std::shared_ptr<const Tokenizer> t = Tokenizer::from_json_file(path);
            return PyTokenizer{std::move(t)};
          },
          py::arg("path"), "Loads a Hugging Face tokenizer.json.")
      .def(
          "encode",
          [](const PyTokenizer& self, const py::object& text, bool add_special, bool parse_special) {
            const std::string s = utf8_text(text, "encode");
            py::gil_scoped_release nogil;
            return self.tok->encode(s, add_special, parse_special);
          },
          py::arg("text"), py::arg("add_special") = false, py::arg("parse_special") = true,
          "Text (str, or bytes holding valid UTF-8) -> token ids. add_special adds the BOS/EOS the tokenizer "
          "prescribes; parse_special recognises special tokens written in the text.")
      .def(
          "decode",
          [](const PyTokenizer& self, const py::object& ids, bool skip_special) {
            const std::vector<int32_t> v = token_list(ids, "decode");
            return to_str(self.tok->decode(v, skip_special));
          },
          py::arg("ids"), py::arg("skip_special") = false,
          "Token ids -> str (bytes that are not valid UTF-8, e.g. half a character, become U+FFFD; decode_bytes "
          "gives the exact bytes).")
      .def(
          "decode_bytes",
          [](const PyTokenizer& self, const py::object& ids, bool skip_special) {
            return py::bytes(self.tok->decode(token_list(ids, "decode_bytes"), skip_special));
          },
          py::arg("ids"), py::arg("skip_special") = false)
      .def("token_to_piece", [](const PyTokenizer& self, int32_t id) { return py::bytes(self.tok->token_to_piece(id)); },
           py::arg("id"), "The bytes one token stands for.")
      .def("token_to_id", [](const PyTokenizer& self, const std::string& text) { return self.tok->token_to_id(text); },
           py::arg("token_text"), "The id of a vocabulary string, or None.")
      .def(
          "apply_chat_template",
          [](const PyTokenizer& self, const py::iterable& messages, bool add_generation_prompt) {
            return self.tok->apply_chat_template(chat_messages(messages), add_generation_prompt);
          },
          py::arg("messages"), py::arg("add_generation_prompt") = true,
          "Renders [{'role': ..., 'content': ...}, ...] (or (role, content) pairs) in the model's chat format.")
      .def_property_readonly("vocab_size", [](const PyTokenizer& self) { return self.tok->vocab_size(); })
      .def_property_readonly("bos_id", [](const PyTokenizer& self) { return self.tok->bos_id(); })
      .def_property_readonly("eos_id", [](const PyTokenizer& self) { return self.tok->eos_id(); })
      .def_property_readonly("eog_ids", [](const PyTokenizer& self) { return self.tok->eog_ids(); },
                             "End-of-generation ids.")
      .def_property_readonly("chat_format",
                             [](const PyTokenizer& self) { return std::string(chat_format_name(self.tok->chat_format())); })
      .def("__len__", [](const PyTokenizer& self) { return self.tok->vocab_size(); })
      .def("__repr__", [](const PyTokenizer& self) {
        return "<retroinfer.Tokenizer vocab " + std::to_string(self.tok->vocab_size()) + ", chat format " +
               std::string(chat_format_name(self.tok->chat_format())) + ">";
      });
}

void bind_generate_result(py::module_& m) {
  py::class_<GenerateSummary>(m, "GenerateResult", "What Model.generate produced, with its timing and KV-read figures.")
      .def_readonly("text", &GenerateSummary::text, "The generated text (stop string excluded).")
      .def_readonly("tokens", &GenerateSummary::tokens, "Generated token ids (the end token included).")
      .def_readonly("attention", &GenerateSummary::attention)
      .def_readonly("prompt_tokens", &GenerateSummary::prompt_tokens)
      .def_readonly("reused_tokens", &GenerateSummary::reused_tokens,
                    "Prompt tokens taken from a snapshot (or a prefix cache) instead of prefilled.")
      .def_readonly("generated_tokens", &GenerateSummary::generated_tokens)
      .def_readonly("decode_steps", &GenerateSummary::decode_steps)
      .def_readonly("prefill_seconds", &GenerateSummary::prefill_seconds, "Prefill + index construction.")
      .def_readonly("decode_seconds", &GenerateSummary::decode_seconds)
      .def_readonly("time_to_first_token", &GenerateSummary::time_to_first_token_s, "Seconds.")
      .def_readonly("prefill_tokens_per_s", &GenerateSummary::prefill_tokens_per_s)
      .def_readonly("decode_tokens_per_s", &GenerateSummary::decode_tokens_per_s)
      .def_readonly("exact_tokens", &GenerateSummary::exact_tokens)
      .def_readonly("context_tokens", &GenerateSummary::context_tokens)
      .def_readonly("kv_read_share", &GenerateSummary::kv_read_share,
                    "Exact-token share: tokens whose K/V were read exactly over all cached tokens, all decode steps "
                    "and layers (1 for full attention).")
      .def_readonly("mean_exact_tokens_per_head", &GenerateSummary::mean_exact_tokens_per_head)
      .def_property_readonly("stop_reason",
                             [](const GenerateSummary& s) { return std::string(stop_reason_name(s.stop_reason)); },
                             "max_tokens | eos | stop_string | callback | context_full")
      .def_property_readonly("kv_placement",
                             [](const GenerateSummary& s) { return kv_placement_dict(s.kv_placement); },
                             "Where the KV lived (Session.kv_placement's dict; None on the CPU).")
      .def_property_readonly("stats", &summary_stats, "The figures as a dict (the keys of `retroinfer generate --json`).")
      .def("__repr__", [](const GenerateSummary& s) {
        return "<retroinfer.GenerateResult " + std::to_string(s.generated_tokens) + " tokens, " +
               std::string(stop_reason_name(s.stop_reason)) + ", " + s.attention + " attention>";
      });
}

void bind_model(py::module_& m) {
  py::class_<PyModel>(m, "Model", "A model loaded on a device (retroinfer.load).")
      .def_property_readonly("config", [](const PyModel& self) { return config_dict(self.m->model->config()); },
                             "The model's hyper-parameters (a dict; max_context is the longest context it supports).")
      .def_property_readonly(
          "tokenizer",
          [](const PyModel& self) -> std::optional<PyTokenizer> {
            if (!self.m->tokenizer) return std::nullopt;
            return PyTokenizer{need_tokenizer(self.m, "tokenizer")};
          },
          "The model's Tokenizer, or None when loaded with tokenizer=\"\".")
      .def_property_readonly("device", [](const PyModel& self) { return std::string(device_name(self.m->engine->device())); })
      .def_property_readonly("description", [](const PyModel& self) { return self.m->engine->description(); })
      .def_property_readonly("path", [](const PyModel& self) { return self.m->model->path(); })
      .def_property_readonly("load_seconds", [](const PyModel& self) { return self.m->load_seconds; })
      .def("generate", &run_generate, py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 128,
           py::arg("attention") = "retro", py::arg("temperature") = 0.0f, py::arg("top_p") = 1.0f, py::arg("top_k") = 0,
           py::arg("seed") = 0, py::arg("stop") = py::none(), py::arg("chat") = false, py::arg("system") = "",
           py::arg("ignore_eos") = false, py::arg("on_token") = py::none(), py::arg("kv_dtype") = py::none(),
           py::arg("prefill_chunk") = py::none(), py::arg("snapshot") = py::none(),
           with_placement_keywords("Generates from a prompt (str: encoded as `retroinfer generate` does, or a list of token "
                         "ids) on a fresh session of max_context = prompt + max_tokens. temperature 0 is greedy. "
                         "snapshot: a file of Model.save_snapshot; the prompt (plain text or ids, may be empty) "
                         "continues its context and only the prompt is prefilled (CPU). "
                         "stop: a string or a list of strings (not emitted). on_token(token_id, text) is called per "
                         "token with the text that may be shown now; returning False stops. Further keywords are the KV placement and "
                         "the attention keywords below. Returns a GenerateResult."))
      .def(
          "session",
          [](const PyModel& self, const std::string& attention, int64_t max_context, const py::object& kv_dtype,
             const py::object& prefill_chunk, const py::kwargs& kwargs) {
            const SessionOptions so = session_options(*self.m, attention, kv_dtype, prefill_chunk, max_context, kwargs);
            PySession out{self.m, nullptr};
            py::gil_scoped_release nogil;
            out.s = make_session(*self.m->engine, so);
            return out;
          },
          py::kw_only(), py::arg("attention") = "retro", py::arg("max_context") = 0, py::arg("kv_dtype") = py::none(),
          py::arg("prefill_chunk") = py::none(),
          with_placement_keywords("A Session for research use: prefill(tokens) and decode(token) return logits. max_context 0 "
                        "= the model's maximum (the memory check then counts it in full); further keywords are the KV placement and "
                        "attention keywords below."))
      .def(
          "save_snapshot",
          [](const PyModel& self, const py::object& prompt, const std::string& path, const std::string& attention,
             bool chat, const std::string& system, const py::object& kv_dtype, const py::object& prefill_chunk,
             const py::kwargs& kwargs) {
            const LoadedModel& lm = *self.m;
            SessionOptions so = session_options(lm, attention, kv_dtype, prefill_chunk, 0, kwargs);
            std::vector<int32_t> ids;
            if (PyUnicode_Check(prompt.ptr()) || PyBytes_Check(prompt.ptr()) || PyByteArray_Check(prompt.ptr())) {
              ids = encode_prompt(*need_tokenizer(self.m, "save_snapshot with a text prompt"),
                                  utf8_text(prompt, "save_snapshot prompt"), chat, system);
            } else {
              RETROINFER_CHECK(!chat, "save_snapshot: chat=True needs a text prompt, not token ids");
              ids = token_list(prompt, "save_snapshot prompt");
            }
            RETROINFER_CHECK(!ids.empty(), "save_snapshot: the prompt encodes to no tokens");
            so.max_context = static_cast<int64_t>(ids.size());
            py::gil_scoped_release nogil;
            const std::unique_ptr<SequenceSession> session = make_session(*lm.engine, so);
            RETROINFER_CHECK(session->supports_prefix(), "save_snapshot: the ", device_name(session->device()),
                             " runner does not export its K/V yet; load the model with device=\"cpu\"");
            session->prefill(ids);
            save_snapshot(path, make_snapshot(*session, ids, model_identity(*lm.model, lm.tokenizer.get())));
            return static_cast<int64_t>(ids.size());
          },
          py::arg("prompt"), py::arg("path"), py::kw_only(), py::arg("attention") = "retro", py::arg("chat") = false,
          py::arg("system") = "", py::arg("kv_dtype") = py::none(), py::arg("prefill_chunk") = py::none(),
          "Prefills the prompt (a document: str or token ids) once and saves its context (tokens, K/V, the model's "
          "identity, the attention configuration) to `path` atomically; generate(..., snapshot=path) with the same "
          "attention keywords then prefills only its own prompt. Returns the context's token count. CPU runner.")
      .def("__repr__", [](const PyModel& self) {
        const ModelConfig& c = self.m->model->config();
        return "<retroinfer.Model " + self.m->model->path() + ": " + c.architecture + ", " +
               std::to_string(c.num_layers) + " layers, vocab " + std::to_string(c.vocab_size) + ", on " +
               self.m->engine->description() + ">";
      });
}

}  // namespace

PYBIND11_MODULE(_retroinfer, m) {
  m.doc() = "retroinfer: long-context LLM inference with the KV cache as a vector store (RetroInfer).";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  m.attr("__version__") = RETROINFER_VERSION;  // project(VERSION) of CMakeLists.txt

  bind_tokenizer(m);
  bind_generate_result(m);
  bind_model(m);
  bind_session(m);

  m.def(
      "load",
      [](const std::string& path, const std::string& device, const std::string& weights,
         const std::optional<std::string>& tokenizer, std::optional<int> threads) {
        if (threads) set_num_threads(*threads);
        LoadOptions lo;
        lo.engine.device = resolve_device(device);
        lo.engine.weights = parse_device_weights(weights);
        lo.tokenizer = tokenizer;
        auto lm = std::make_shared<LoadedModel>();
        {
          py::gil_scoped_release nogil;
          *lm = load_model(locate_model(path), lo);
        }
        return PyModel{std::move(lm)};
      },
      py::arg("path"), py::kw_only(), py::arg("device") = "auto", py::arg("weights") = "bf16",
      py::arg("tokenizer") = py::none(), py::arg("threads") = py::none(),
      "Loads a model: a GGUF file, a Hugging Face folder (config.json + safetensors + tokenizer.json) or a "
      ".safetensors file, 'smollm2' (the pip package) or 'qwen2.5-coder-0.5b' (scripts/setup.sh --with-qwen). device: cpu | cuda | auto (cuda when this build has "
      "the backend and a GPU is present). weights: the CUDA runner's weight type (bf16 | f32). tokenizer: None = "
      "the model's own, a path = that tokenizer.json, \"\" = none (token ids only). threads: CPU threads for "
      "every model in this process.");
  m.def("cuda_built", &cuda_backend_built, "True when this build has the CUDA backend.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"), "CPU threads of the forward pass (OpenMP + OpenBLAS).");
  m.def("num_threads", &num_threads);
}

}  // namespace retroinfer::python
