// The KV placement report (KvPlacementReport, sequence_session.h) as JSON fields, one shape for every
// face that reports it: `generate --json`, `bench generate`, `eval` result lines and the server's
// `retroinfer` object.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "retroinfer/sequence_session.h"

namespace retroinfer {

// Adds to the object j: kv_placement ("gpu" | "split" | "host"), gpu_layers, host_layers, and with host-tier
// layers cache_hits, cache_misses, cache_hit_ratio (null before any retrieval), step_pcie_bytes, pcie_bytes and
// pcie_decode_steps. Adds nothing for nullopt (the CPU runner).
void add_kv_placement_json(nlohmann::json& j, const std::optional<KvPlacementReport>& r);
// block_cache_hit_ratio as JSON: null before any retrieval (summed counts of several sessions too).
nlohmann::json hit_ratio_json(uint64_t hits, uint64_t misses);

}  // namespace retroinfer
