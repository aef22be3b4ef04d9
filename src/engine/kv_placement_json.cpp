#include "engine/kv_placement_json.h"

namespace retroinfer {

void add_kv_placement_json(nlohmann::json& j, const std::optional<KvPlacementReport>& r) {
  if (!r) return;
  j["kv_placement"] = std::string(buffer::kv_placement_name(r->placement));
  j["gpu_layers"] = r->gpu_layers;
  j["host_layers"] = r->host_layers;
  if (r->host_layers == 0) return;
  j["cache_hits"] = r->cache_hits;
  j["cache_misses"] = r->cache_misses;
  j["host_store"] = std::string(store_dtype_name(r->host_store));
  j["cache_hit_ratio"] = hit_ratio_json(r->cache_hits, r->cache_misses);
  j["step_pcie_bytes"] = r->step_pcie_bytes;
  j["pcie_bytes"] = r->pcie_bytes;
  j["pcie_decode_steps"] = r->decode_steps;
}

nlohmann::json hit_ratio_json(uint64_t hits, uint64_t misses) {
  const double ratio = block_cache_hit_ratio(hits, misses);
  return ratio >= 0.0 ? nlohmann::json(ratio) : nlohmann::json(nullptr);
}

}  // namespace retroinfer
