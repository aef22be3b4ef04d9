// The table of the attention parameters: every AttentionConfig field a user may set (all but `kind`), with
// its name, Python keyword, CLI flag, allowed range and help. The CLI's flags (tools/model_cli.cpp), the
// Python keywords (python/bindings_session.cpp), the server's options (`retroinfer serve` takes the CLI's
// flags) and validate(AttentionConfig) all iterate it; the defaults are AttentionConfig's in-class ones
// (attention_config.h), read from AttentionConfig{}.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "retroinfer/attention_config.h"

namespace retroinfer {

// The field of AttentionConfig a parameter sets.
using AttentionField = std::variant<int AttentionConfig::*, int64_t AttentionConfig::*, uint64_t AttentionConfig::*,
                                    float AttentionConfig::*, double AttentionConfig::*, bool AttentionConfig::*>;

struct AttentionParam {
  std::string_view name;     // the AttentionConfig field, as validate's messages name it
  std::string_view keyword;  // the Python keyword (the name, but attention_seed for seed: generate's seed is the
                             // sampler's)
  // The CLI flag. A bool parameter's flag sets the opposite of its default ("--no-estimation").
  std::string_view flag;
  AttentionField field;
  // Allowed values, inclusive (validate): numbers also finite; bool parameters have no range.
  double min = 0.0, max = 0.0;
  std::string_view help;     // one line, without the default (attention_param_help adds it)
  // The default depends on the model's head dimension (default_tokens_per_cluster), applied by the CLI,
  // the server and the Python bindings once the model is known; AttentionConfig's is the one from 128 on.
  bool head_dim_default = false;
};

// Every parameter, in AttentionConfig's order.
std::span<const AttentionParam> attention_params();
// The parameter of a Python keyword (or, equally, its field name); nullptr when there is none.
const AttentionParam* find_attention_param(std::string_view keyword);
// The value of p in c as text ("0.018", "16", "true"): a CLI default, a dict value's spelling.
std::string attention_param_text(const AttentionConfig& c, const AttentionParam& p);
// p's help with its default: "retro: share of clusters attended exactly (default 0.018)".
std::string attention_param_help(const AttentionParam& p);
// Sets p in c from text (a CLI value: "0.05", "32", "true" / "false"); throws Error naming p's flag when the
// text is not a number of p's type (integers: no fraction, within the field's type) or the value is outside
// p's range (the check validate makes of every parameter). The rules between parameters are validate's.
void set_attention_param(AttentionConfig& c, const AttentionParam& p, std::string_view text);

}  // namespace retroinfer
