#include "eval/eval_report.h"

#include "engine/kv_placement_json.h"
#include "eval/tasks.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace retroinfer::eval {
namespace {

template <typename T>
void add_unique(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The host-tier figures of a cell or an average, when any of its lines had host-tier layers.
void add_host_tier(nlohmann::json& j, const CellStats& s) {
  if (s.host_tier_samples == 0) return;
  j["host_tier_samples"] = s.host_tier_samples;
  j["cache_hits"] = s.cache_hits;
  j["cache_misses"] = s.cache_misses;
  j["cache_hit_ratio"] = hit_ratio_json(s.cache_hits, s.cache_misses);
  j["pcie_bytes_per_sample"] = s.pcie_bytes / static_cast<double>(s.host_tier_samples);
}

}  // namespace

nlohmann::json summarize(const std::vector<nlohmann::json>& lines) {
  std::vector<std::string> methods, tasks;
  std::vector<int64_t> contexts;
  std::map<std::tuple<std::string, std::string, int64_t>, CellStats> cells;
  std::map<std::string, std::vector<std::string>> placements;  // method -> the KV placements of its lines
  std::map<std::string, std::vector<std::string>> stores;      // method -> its host-tier lines' store types
  for (const auto& j : lines) {
    const std::string m = j.at("method").get<std::string>(), t = j.at("task").get<std::string>();
    const int64_t c = j.at("context").get<int64_t>();
    add_unique(methods, m);
    add_unique(tasks, t);
    add_unique(contexts, c);
    CellStats& s = cells[{m, t, c}];
    ++s.samples;
    s.score += 100.0 * j.at("score_all").get<double>();
    s.exact_tokens_per_head += j.value("exact_tokens_per_head", 0.0);
    s.context_tokens_per_head += j.value("context_tokens_per_head", 0.0);
    if (j.contains("kv_placement")) add_unique(placements[m], j.at("kv_placement").get<std::string>());
    if (j.contains("cache_hits")) {
      if (j.contains("host_store")) add_unique(stores[m], j.at("host_store").get<std::string>());
      ++s.host_tier_samples;
      s.cache_hits += j.at("cache_hits").get<uint64_t>();
      s.cache_misses += j.at("cache_misses").get<uint64_t>();
      s.pcie_bytes += j.value("pcie_bytes", 0.0);
    }
  }
  std::sort(contexts.begin(), contexts.end());
  // Tasks in the generator's table order (unknown names after, in order of appearance).
  const auto rank = [](const std::string& t) {
    const auto& n = task_names();
    return std::find(n.begin(), n.end(), t) - n.begin();
  };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  nlohmann::json out;
  out["methods"] = methods;
  out["tasks"] = tasks;
  out["contexts"] = contexts;
  out["cells"] = nlohmann::json::array();
  out["averages"] = nlohmann::json::array();
  for (int64_t c : contexts) {
    for (const auto& m : methods) {
      double sum = 0, exact = 0, ctx_tokens = 0;
      int64_t n_tasks = 0, n_samples = 0;
      CellStats host;  // the host-tier figures summed over the method's tasks
      for (const auto& t : tasks) {
        auto it = cells.find({m, t, c});
        if (it == cells.end()) continue;
        CellStats s = it->second;
        const double n = static_cast<double>(s.samples);
        s.score /= n;
        s.exact_tokens_per_head /= n;
        s.context_tokens_per_head /= n;
        nlohmann::json cell = {{"method", m}, {"task", t}, {"context", c}, {"samples", s.samples},
                               {"score", s.score}, {"exact_tokens_per_head", s.exact_tokens_per_head},
                               {"context_tokens_per_head", s.context_tokens_per_head}};
        add_host_tier(cell, s);
        out["cells"].push_back(cell);
        host.host_tier_samples += s.host_tier_samples;
        host.cache_hits += s.cache_hits;
        host.cache_misses += s.cache_misses;
        host.pcie_bytes += s.pcie_bytes;
        sum += s.score;
        exact += s.exact_tokens_per_head * n;
        ctx_tokens += s.context_tokens_per_head * n;
        ++n_tasks;
        n_samples += s.samples;
      }
      if (n_tasks == 0) continue;
      nlohmann::json avg = {{"method", m}, {"context", c}, {"score", sum / n_tasks}, {"tasks", n_tasks},
                            {"samples", n_samples},
                            {"exact_tokens_per_head", exact / static_cast<double>(n_samples)},
                            {"context_tokens_per_head", ctx_tokens / static_cast<double>(n_samples)}};
      if (placements.count(m)) avg["kv_placement"] = join(placements.at(m));
      if (stores.count(m) && host.host_tier_samples > 0) avg["host_store"] = join(stores.at(m));
      add_host_tier(avg, host);
      out["averages"].push_back(avg);
    }
  }
  return out;
}

std::string markdown_table(const nlohmann::json& summary) {
  const auto methods = summary.at("methods").get<std::vector<std::string>>();
  const auto tasks = summary.at("tasks").get<std::vector<std::string>>();
  std::map<std::tuple<std::string, std::string, int64_t>, nlohmann::json> cell;
  for (const auto& c : summary.at("cells"))
    cell[{c.at("method").get<std::string>(), c.at("task").get<std::string>(), c.at("context").get<int64_t>()}] = c;
  std::map<std::pair<std::string, int64_t>, nlohmann::json> avg;
  for (const auto& a : summary.at("averages"))
    avg[{a.at("method").get<std::string>(), a.at("context").get<int64_t>()}] = a;
  std::string md;
  char buf[256];
  for (int64_t c : summary.at("contexts").get<std::vector<int64_t>>()) {
    md += "Context " + std::to_string(c) + " tokens (score: string_match_all, %):\n\n| method |";
    for (const auto& t : tasks) md += " " + t + " |";
    md += " **average** | exact tokens read / context (per layer, KV head, step) | samples per cell |\n|---|";
    for (size_t i = 0; i < tasks.size() + 3; ++i) md += "---:|";
    md += "\n";
    for (const auto& m : methods) {
      auto a = avg.find({m, c});
      if (a == avg.end()) continue;
      md += "| " + m + " |";
      std::set<int64_t> counts;
      for (const auto& t : tasks) {
        auto it = cell.find({m, t, c});
        if (it == cell.end()) {
          md += " - |";
          continue;
        }
        std::snprintf(buf, sizeof buf, " %.1f |", it->second.at("score").get<double>());
        md += buf;
        counts.insert(it->second.at("samples").get<int64_t>());
      }
      std::snprintf(buf, sizeof buf, " **%.1f** | %.0f / %.0f |", a->second.at("score").get<double>(),
                    a->second.at("exact_tokens_per_head").get<double>(),
                    a->second.at("context_tokens_per_head").get<double>());
      md += buf;
      std::string cnt;
      for (int64_t n : counts) cnt += (cnt.empty() ? "" : ", ") + std::to_string(n);
      md += " " + cnt + " |\n";
    }
    md += "\n";
    for (const auto& m : methods) {
      auto a = avg.find({m, c});
      if (a == avg.end() || !a->second.contains("cache_hits")) continue;
      const nlohmann::json& r = a->second.at("cache_hit_ratio");
      const std::string store =
          a->second.contains("host_store") ? " (" + a->second.at("host_store").get<std::string>() + " host store)" : "";
      std::snprintf(buf, sizeof buf, "%s: KV placement %s%s, GPU block-cache hit ratio %.3f, %.1f MiB over PCIe per sample\n\n",
                    m.c_str(), a->second.value("kv_placement", std::string("?")).c_str(), store.c_str(),
                    r.is_null() ? -1.0 : r.get<double>(), a->second.at("pcie_bytes_per_sample").get<double>() / double(1 << 20));
      md += buf;
    }
  }
  return md;
}

}  // namespace retroinfer::eval
