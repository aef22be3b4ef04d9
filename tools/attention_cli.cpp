#include "attention_cli.h"

#include <CLI/CLI.hpp>
#include <type_traits>
#include <variant>

#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"

namespace retroinfer::cli {

void add_attention_options(CLI::App* cmd, AttentionCliValues& values) {
  const AttentionConfig defaults;
  for (const AttentionParam& p : attention_params()) {
    const std::string name(p.name), flag(p.flag), help = attention_param_help(p);
    if (std::holds_alternative<bool AttentionConfig::*>(p.field)) {
      // The flag sets the opposite of the default.
      const std::string set = defaults.*std::get<bool AttentionConfig::*>(p.field) ? "false" : "true";
      cmd->add_flag_callback(flag, [&values, name, set] { values[name] = set; }, help);
      continue;
    }
    const bool real = std::holds_alternative<float AttentionConfig::*>(p.field) ||
                      std::holds_alternative<double AttentionConfig::*>(p.field);
    cmd->add_option_function<std::string>(
           flag, [&values, name](const std::string& v) { values[name] = v; }, help)
        ->type_name(real ? "FLOAT" : "INT");
  }
}

void apply_attention_options(const AttentionCliValues& values, AttentionConfig& c) {
  for (const auto& [name, text] : values) {
    const AttentionParam* p = find_attention_param(name);
    RETROINFER_CHECK(p != nullptr, "unknown attention parameter '", name, "'");
    set_attention_param(c, *p, text);
  }
}

}  // namespace retroinfer::cli
