// The attention parameters on the command line: one flag per entry of the table in
// retroinfer/attention_params.h (--retrieval-fraction, --sink, --tokens-per-cluster, --no-estimation, ...),
// its help and default from the table. Shared by the commands that run a model (model_cli.h: generate,
// eval, bench generate, serve) and `fidelity`.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "retroinfer/attention_config.h"

namespace CLI {
class App;
}

namespace retroinfer::cli {

// The parameters given, by field name, as typed (a bool flag stores the value it sets).
using AttentionCliValues = std::map<std::string, std::string, std::less<>>;

// Adds every parameter's flag to cmd; a given flag's text lands in values.
void add_attention_options(CLI::App* cmd, AttentionCliValues& values);

// Sets the given parameters in c, over whatever defaults c holds; throws Error naming the flag when a value
// is not a number of its type or out of its range (set_attention_param). The rules between parameters are
// validate(AttentionConfig)'s, once c is complete.
void apply_attention_options(const AttentionCliValues& values, AttentionConfig& c);

}  // namespace retroinfer::cli
