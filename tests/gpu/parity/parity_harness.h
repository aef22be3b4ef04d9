// GPU parity harness: every kernel family registers a list of cases; a case runs the GPU path through the
// host API the layers use and the production CPU code (src/index, src/attention, softmax_state.h) on the same
// bf16 inputs, and fills a CaseReport with named checks (measured value and bound; exact checks count
// mismatches). One gtest per family (RETROINFER_PARITY_FAMILY) runs every case, prints one summary line per
// case and fails naming the case and its seed for each failed check.
//
// Comparison rules (each bound's derivation sits beside the bound):
//   floats: normalised MSE sum (got - ref)^2 / sum ref^2 and max |got - ref|, every output element written
//     (outputs are filled with a NaN sentinel first: an element left unwritten stays non-finite);
//   id sets: Jaccard distance 1 - |A n B| / |A u B| (gputest::jaccard_distance), and only near-ties may differ;
//   exact equality wherever the GPU promises the CPU's rule on the same inputs (ids from the GPU's own scores,
//   budgets, cluster counts, token lists).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace retroinfer::parity {

struct Check {
  std::string what;
  double value = 0.0, bound = 0.0;  // pass: value <= bound (a count of mismatches has bound 0)
  bool pass = true;
  std::string detail;  // the first mismatch, where there is one
};

class CaseReport {
 public:
  // value <= bound (NaN fails).
  void le(const std::string& what, double value, double bound, const std::string& detail = {}) {
    checks_.push_back({what, value, bound, value <= bound, detail});
  }
  // A count of mismatches that must be 0; detail names the first.
  void none(const std::string& what, int64_t mismatches, const std::string& first = {}) {
    checks_.push_back({what, double(mismatches), 0.0, mismatches == 0, first});
  }
  // got == want; context (optional) says where, in the failure message.
  template <typename T>
  void eq(const std::string& what, const T& got, const T& want, const std::string& context = {}) {
    std::ostringstream d;
    if (!(got == want)) d << "got " << got << ", want " << want << (context.empty() ? "" : ", ") << context;
    checks_.push_back({what, got == want ? 0.0 : 1.0, 0.0, got == want, d.str()});
  }
  void fail(const std::string& what, const std::string& why) { checks_.push_back({what, 1.0, 0.0, false, why}); }
  // Reported on the summary line, not checked.
  void note(const std::string& what, double value) { notes_.emplace_back(what, value); }

  bool ok() const {
    return std::all_of(checks_.begin(), checks_.end(), [](const Check& c) { return c.pass; });
  }
  size_t num_checks() const { return checks_.size(); }
  // Worst value per check name (the checks of one name repeat over heads and steps), then the notes.
  std::string summary() const {
    std::vector<Check> worst;
    for (const Check& c : checks_) {
      auto it = std::find_if(worst.begin(), worst.end(), [&](const Check& w) { return w.what == c.what; });
      if (it == worst.end())
        worst.push_back(c);
      else if (!c.pass || (it->pass && c.value - c.bound > it->value - it->bound))
        *it = c;
    }
    std::ostringstream s;
    for (const Check& c : worst) {
      s << ' ' << c.what << ' ';
      if (c.bound == 0.0)
        s << (c.pass ? "ok" : "MISMATCH");
      else
        s << fmt(c.value) << (c.pass ? "<=" : ">") << fmt(c.bound);
      s << ';';
    }
    for (const auto& [what, v] : notes_) s << ' ' << what << ' ' << fmt(v) << ';';
    return s.str();
  }
  std::string failures() const {
    std::ostringstream s;
    for (const Check& c : checks_) {
      if (c.pass) continue;
      s << "\n  " << c.what << ": ";
      if (c.bound == 0.0)
        s << c.value << " mismatch(es)";
      else
        s << fmt(c.value) << " > bound " << fmt(c.bound);
      if (!c.detail.empty()) s << " (" << c.detail << ")";
    }
    return s.str();
  }

 private:
  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", v);
    return b;
  }
  std::vector<Check> checks_;
  std::vector<std::pair<std::string, double>> notes_;
};

struct ParityCase {
  std::string name;  // the shape and the edge it covers
  uint64_t seed = 0;
  std::function<void(CaseReport&, uint64_t seed)> run;
};

struct Family {
  std::string name;  // the gtest name (GpuParity.<name>)
  std::string what;  // GPU path against which CPU reference
  std::function<std::vector<ParityCase>()> cases;
};

inline std::vector<Family>& registry() {
  static std::vector<Family> families;
  return families;
}
struct Registrar {
  explicit Registrar(Family f) { registry().push_back(std::move(f)); }
};

// Runs every case of family `name`: one summary line per case; a failed check (or an exception) fails the
// gtest with the case, its seed and the failed checks. Each case ends with the device synchronised (a
// launch error surfaces in its own case).
inline void run_family(const std::string& name) {
  const auto it = std::find_if(registry().begin(), registry().end(), [&](const Family& f) { return f.name == name; });
  ASSERT_NE(it, registry().end()) << "no parity family " << name;
  const std::vector<ParityCase> cases = it->cases();
  ASSERT_FALSE(cases.empty()) << name << " registers no case";
  std::printf("[parity] %s: %s, %zu cases\n", name.c_str(), it->what.c_str(), cases.size());
  int failed = 0;
  for (const ParityCase& c : cases) {
    CaseReport r;
    try {
      c.run(r, c.seed);
      cuda::synchronize();
    } catch (const std::exception& e) {
      r.fail("exception", e.what());
    }
    if (r.num_checks() == 0) r.fail("checks", "the case checked nothing");
    std::printf("[parity] %s | %s | seed %llu | %s |%s\n", name.c_str(), c.name.c_str(),
                static_cast<unsigned long long>(c.seed), r.ok() ? "pass" : "FAIL", r.summary().c_str());
    if (!r.ok()) {
      ++failed;
      ADD_FAILURE() << name << " case '" << c.name << "' seed " << c.seed << ":" << r.failures();
    }
  }
  std::printf("[parity] %s: %d of %zu cases failed\n", name.c_str(), failed, cases.size());
}

// Registers family `test_name` (cases_fn: () -> std::vector<ParityCase>) and its gtest GpuParity.test_name.
#define RETROINFER_PARITY_FAMILY(test_name, what, cases_fn)                                                \
  static const ::retroinfer::parity::Registrar parity_registrar_##test_name({#test_name, what, cases_fn}); \
  TEST(GpuParity, test_name) {                                                                             \
    RETROINFER_REQUIRE_GPU();                                                                              \
    ::retroinfer::parity::run_family(#test_name);                                                          \
  }

// ---- comparisons ----

// The float checks of one output: sizes equal, every element written, nmse <= nmse_bound, max-abs <=
// max_abs_bound (checks "<what> written", "<what> nmse", "<what> max-abs").
inline gputest::Compare expect_close(CaseReport& r, const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& ref, double nmse_bound, double max_abs_bound) {
  r.eq(what + " size", got.size(), ref.size());
  if (got.size() != ref.size()) return {};
  const gputest::Compare d = gputest::compare(got, ref);
  r.none(what + " written", d.unwritten, d.unwritten ? "element " + std::to_string(d.first_unwritten) : "");
  r.le(what + " nmse", d.nmse, nmse_bound);
  std::string worst;
  if (d.worst >= 0)
    worst = "element " + std::to_string(d.worst) + ": got " + std::to_string(got[d.worst]) + ", want " +
            std::to_string(ref[d.worst]);
  r.le(what + " max-abs", d.max_abs, max_abs_bound, worst);
  return d;
}

// Exact equality of two sequences; the first difference as detail.
template <typename A, typename B>
void expect_same(CaseReport& r, const std::string& what, const std::vector<A>& got, const std::vector<B>& want) {
  std::string first;
  int64_t diff = got.size() == want.size() ? 0 : 1;
  if (diff) first = "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (int64_t(got[i]) == int64_t(want[i])) continue;
    if (diff++ == 0)
      first = "at " + std::to_string(i) + ": got " + std::to_string(int64_t(got[i])) + ", want " +
              std::to_string(int64_t(want[i]));
  }
  r.none(what, diff, first);
}

// The tail and edge sizes every family draws its short cases from.
inline const std::vector<int64_t>& tail_sizes() {
  static const std::vector<int64_t> t{1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 127, 128, 129};
  return t;
}

}  // namespace retroinfer::parity
