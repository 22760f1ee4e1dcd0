// Comparison of candidate tensors with a golden, in stage order, and the table/JSON reports.
#include "mok/verify/compare.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace mok::verify {
namespace {

// Sign-magnitude bits to a monotone integer line (so that neighbours differ by 1).
int64_t ordered(uint64_t bits, int width) {
  const uint64_t sign = uint64_t{1} << (width - 1);
  const uint64_t mag = bits & (sign - 1);
  return (bits & sign) ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
}

bool is_nan(ref::DType d, uint64_t bits) {
  switch (d) {
    case ref::DType::kBf16: return (bits & 0x7FFF) > 0x7F80;
    case ref::DType::kF32: return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    case ref::DType::kF64: return (bits & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    case ref::DType::kI32: return false;
  }
  return false;
}

const std::vector<std::string>& stage_order() {
  static const std::vector<std::string> order = {
      "intermediates/gate", "intermediates/up", "intermediates/act", "intermediates/y",
      "intermediates/shared_gate", "intermediates/shared_up", "intermediates/shared_act",
      "intermediates/shared_out", "outputs/output",
      "intermediates/dy", "grads/d_router_weights", "intermediates/d_act", "intermediates/d_gate",
      "intermediates/d_up", "intermediates/dx_slot", "intermediates/shared_d_act",
      "intermediates/shared_d_gate", "intermediates/shared_d_up", "intermediates/dx_shared",
      "grads/d_x", "grads/d_w_routed_down", "grads/d_w_routed_gate", "grads/d_w_routed_up",
      "grads/d_w_shared_down", "grads/d_w_shared_gate", "grads/d_w_shared_up"};
  return order;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

int stage_rank(const std::string& path) {
  const auto& order = stage_order();
  const auto it = std::find(order.begin(), order.end(), path);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

uint64_t ulp_distance(ref::DType dtype, uint64_t a, uint64_t b) {
  if (a == b) return 0;
  if (is_nan(dtype, a) || is_nan(dtype, b)) return is_nan(dtype, a) && is_nan(dtype, b) ? 0 : UINT64_MAX;
  const int width = dtype == ref::DType::kBf16 ? 16 : dtype == ref::DType::kF64 ? 64 : 32;
  if (dtype == ref::DType::kI32) {
    const int64_t d = static_cast<int64_t>(static_cast<int32_t>(a)) - static_cast<int32_t>(b);
    return static_cast<uint64_t>(d < 0 ? -d : d);
  }
  const int64_t d = ordered(a, width) - ordered(b, width);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

Report compare(const ref::Golden& golden, const ref::TensorMap& candidate, const CompareOptions& options) {
  Report report;
  report.criterion = options.criterion == Criterion::kBitwise ? "bitwise" : "within-bounds";
  if (options.sample) report.sample = options.sample->describe(golden.cfg);
  const ref::Tensor* topk = nullptr;
  if (auto it = golden.tensors.find("inputs/topk_experts"); it != golden.tensors.end()) topk = &it->second;

  std::vector<std::string> paths;
  for (const auto& [path, tensor] : candidate) {
    const ref::TensorSpec* s = ref::find_spec(path);
    if (!s || s->role == ref::Role::kInput || ref::is_bound_role(s->role)) continue;
    // Under that criterion an intermediate is judged only where the golden holds its bounds (the
    // oracle backend's, OracleOptions::intermediates); golden files hold bounds for outputs and
    // gradients only.
    if (options.criterion == Criterion::kWithinBounds && s->role == ref::Role::kIntermediate &&
        !golden.tensors.count(ref::bound_radius_path(path)))
      continue;
    if (golden.tensors.count(path)) paths.push_back(path);
  }
  // Every output and gradient the golden holds must be in the candidate (intermediates need not:
  // the CUDA kernel returns no d_act or shared_d_act); a missing one takes its place in stage order.
  for (const auto& [path, tensor] : golden.tensors) {
    const ref::TensorSpec* s = ref::find_spec(path);
    if (s && (s->role == ref::Role::kOutput || s->role == ref::Role::kGrad) && !candidate.count(path))
      paths.push_back(path);
  }
  std::stable_sort(paths.begin(), paths.end(),
                   [](const std::string& a, const std::string& b) { return stage_rank(a) < stage_rank(b); });

  for (const std::string& path : paths) {
    const ref::Tensor& want = golden.tensors.at(path);
    if (!candidate.count(path)) {
      TensorReport tr;
      tr.path = path;
      tr.passed = false;
      tr.worst_location = "missing from the candidate";
      if (report.first_bad_stage.empty()) report.first_bad_stage = path + ": missing from the candidate";
      report.passed = false;
      report.tensors.push_back(tr);
      continue;
    }
    const ref::Tensor& got = candidate.at(path);
    const ref::TensorSpec& s = *ref::find_spec(path);
    TensorReport tr;
    tr.path = path;
    if (want.dtype() != got.dtype() || want.shape() != got.shape()) {
      tr.passed = false;
      tr.worst_location = "dtype/shape differ: golden " + std::string(ref::dtype_name(want.dtype())) +
                          want.shape_string() + ", candidate " + ref::dtype_name(got.dtype()) + got.shape_string();
      if (report.first_bad_stage.empty()) report.first_bad_stage = path + ": " + tr.worst_location;
      report.passed = false;
      report.tensors.push_back(tr);
      continue;
    }
    const bool checked_tensor = s.role == ref::Role::kOutput || s.role == ref::Role::kGrad;
    const ref::Tensor* exact = nullptr;
    const ref::Tensor* bound = nullptr;
    if ((checked_tensor || s.role == ref::Role::kIntermediate) && options.check_bounds) {
      auto e = golden.tensors.find(ref::bound_exact_path(path));
      auto b = golden.tensors.find(ref::bound_radius_path(path));
      if (e != golden.tensors.end() && b != golden.tensors.end()) {
        exact = &e->second;
        bound = &b->second;
        tr.has_bounds = true;
        if (exact->numel() != want.numel() || bound->numel() != want.numel())
          throw Error(options.golden_name + ": " + ref::bound_exact_path(path) + " and " + ref::bound_radius_path(path) +
                      " must have the shape of " + path + "; regenerate the golden's bounds (mok-golden)");
      }
    }
    for (int64_t i = 0; i < want.numel(); ++i) {
      if (options.sample && !options.sample->covers(path, golden.cfg, i)) continue;
      ++tr.compared;
      const uint64_t wb = want.bits_at(i), gb = got.bits_at(i);
      const uint64_t d = ulp_distance(want.dtype(), wb, gb);
      if (d == 0 && wb == gb) ++tr.equal;
      if (wb != gb && tr.first_idx < 0) tr.first_idx = i;
      if (d > tr.max_ulp || (tr.worst_idx < 0 && wb != gb)) {
        tr.max_ulp = std::max(tr.max_ulp, d);
        tr.worst_idx = i;
      }
      if (exact) {
        const double r = bound->value_at(i);
        if (std::isnan(r)) continue;  // the oracle did not sample this element
        const double x = exact->value_at(i);
        if (!(r >= 0) || std::isinf(r) || !std::isfinite(x)) {
          std::ostringstream os;
          os << options.golden_name << ": " << (std::isfinite(x) ? ref::bound_radius_path(path) : ref::bound_exact_path(path))
             << " at " << ref::locate(s, golden.cfg, i, topk) << " is " << (std::isfinite(x) ? r : x)
             << "; a radius must be a finite number >= 0 (NaN: not sampled) and an exact value finite. "
             << "Regenerate the golden's bounds with mok-golden";
          throw Error(os.str());
        }
        ++tr.bound_checked;
        const double err = std::fabs(got.value_at(i) - x);
        const double ratio = err == 0 ? 0.0 : (r > 0 ? err / r : INFINITY);
        if (!(err <= r)) {
          ++tr.outside_bound;
          if (tr.first_outside_idx < 0) tr.first_outside_idx = i;
        }
        if (ratio > tr.worst_bound_ratio || std::isnan(err)) {
          tr.worst_bound_ratio = std::isnan(err) ? INFINITY : ratio;
          tr.worst_bound_location = ref::locate(s, golden.cfg, i, topk);
        }
      }
    }
    if (tr.first_idx >= 0) tr.first_location = ref::locate(s, golden.cfg, tr.first_idx, topk);
    if (tr.first_outside_idx >= 0) tr.first_outside_location = ref::locate(s, golden.cfg, tr.first_outside_idx, topk);
    if (tr.worst_idx >= 0) {
      tr.worst_location = ref::locate(s, golden.cfg, tr.worst_idx, topk);
      tr.worst_expected = want.value_at(tr.worst_idx);
      tr.worst_actual = got.value_at(tr.worst_idx);
    }
    if (options.criterion == Criterion::kBitwise) tr.passed = tr.equal == tr.compared;
    if (tr.has_bounds && tr.outside_bound > 0) tr.passed = false;
    if (options.criterion == Criterion::kWithinBounds && !tr.has_bounds && checked_tensor) tr.passed = false;
    // Bounds that check nothing (every radius NaN, "not sampled") cannot pass a bounds criterion.
    if (options.criterion == Criterion::kWithinBounds && tr.has_bounds && tr.compared > 0 && tr.bound_checked == 0) {
      tr.passed = false;
      tr.worst_bound_location = "no element has a radius (all NaN)";
    }
    // The first failing stage names its first wrong element (DESIGN.md: the stage bisector names
    // the first stage, expert, token and element that went wrong), and where the difference is
    // largest when that is elsewhere.
    if (!tr.passed && report.first_bad_stage.empty()) {
      std::string where;
      const bool bitwise_miss = options.criterion == Criterion::kBitwise && tr.first_idx >= 0;
      if (bitwise_miss) {
        const int64_t differing = tr.compared - tr.equal;
        where = " at " + tr.first_location;
        if (differing > 1)
          where += " (first of " + std::to_string(differing) + " differing elements; the largest difference at " +
                   tr.worst_location + ")";
      } else if (tr.first_outside_idx >= 0) {
        where = " at " + tr.first_outside_location + " (first of " + std::to_string(tr.outside_bound) +
                " outside their radius)";
      } else if (!tr.worst_location.empty()) {
        where = " at " + tr.worst_location;
      } else if (!tr.worst_bound_location.empty()) {
        where = ": " + tr.worst_bound_location;  // e.g. no element has a radius
      }
      report.first_bad_stage = path + where;
    }
    report.passed = report.passed && tr.passed;
    report.tensors.push_back(tr);
  }
  if (paths.empty()) {
    report.passed = false;
    report.first_bad_stage = "nothing to compare: the candidate and the golden share no output, grad or intermediate";
  }
  return report;
}

std::string format_table(const Report& r) {
  std::ostringstream out;
  out << "# golden:    " << r.golden_path << "\n# backend:   " << r.backend << "\n# criterion: " << r.criterion
      << (r.criterion == "bitwise" ? " (every element bit-identical; bounds checked where present)" : " (every element within its oracle radius)")
      << "\n";
  if (!r.sample.empty()) out << "# sample:    " << r.sample << "\n";
  if (!r.end_to_end.empty())
    out << "# end to end: bounds " << (r.end_to_end == "stored" ? "stored in the golden" : "computed now") << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-35s %10s %10s %8s %10s %10s  %-6s  %s\n", "tensor", "compared", "equal",
                "max_ulp", "#outside", "err/bound", "result", "worst element");
  out << line;
  for (const TensorReport& t : r.tensors) {
    const std::string ulp = t.max_ulp == UINT64_MAX ? "nan" : std::to_string(t.max_ulp);
    const std::string outside = t.has_bounds ? std::to_string(t.outside_bound) : "-";
    const std::string ratio = t.has_bounds ? fmt(t.worst_bound_ratio) : "-";
    std::string where = t.worst_location;
    if (t.worst_idx >= 0) where += " (golden " + fmt(t.worst_expected) + ", got " + fmt(t.worst_actual) + ")";
    if (where.empty() && !t.passed && t.bound_checked == 0 && t.has_bounds) where = t.worst_bound_location;
    std::snprintf(line, sizeof line, "%-35s %10lld %10lld %8s %10s %10s  %-6s  %s\n", t.path.c_str(),
                  static_cast<long long>(t.compared), static_cast<long long>(t.equal), ulp.c_str(), outside.c_str(),
                  ratio.c_str(), t.passed ? "OK" : "FAILED", where.c_str());
    out << line;
  }
  // #outside counts only elements with a radius: say so where that is fewer than were compared (a
  // golden whose oracle sampled), so "0 outside" is not read as "every element within".
  for (const TensorReport& t : r.tensors)
    if (t.has_bounds && t.bound_checked < t.compared)
      out << "# bound-checked: " << t.path << ": " << t.bound_checked << " of " << t.compared
          << " compared elements have a radius (NaN: not sampled by the oracle); #outside counts those only\n";
  if (!r.first_bad_stage.empty()) out << "# first failing stage: " << r.first_bad_stage << "\n";
  std::snprintf(line, sizeof line, "# %s: %zu tensors, %.2f s\n", r.passed ? "PASSED" : "FAILED", r.tensors.size(), r.seconds);
  out << line;
  return out.str();
}

namespace {
// JSON has no Inf or NaN (nlohmann writes null): they are written as strings, as the ratio is.
nlohmann::json json_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}
}  // namespace

std::string format_json(const Report& r) {
  nlohmann::json j;
  j["golden"] = r.golden_path;
  j["backend"] = r.backend;
  j["criterion"] = r.criterion;
  j["sample"] = r.sample.empty() ? nlohmann::json() : nlohmann::json(r.sample);
  j["end_to_end_bounds"] = r.end_to_end.empty() ? nlohmann::json() : nlohmann::json(r.end_to_end);
  j["passed"] = r.passed;
  j["seconds"] = r.seconds;
  j["first_failing_stage"] = r.first_bad_stage.empty() ? nlohmann::json() : nlohmann::json(r.first_bad_stage);
  for (const TensorReport& t : r.tensors) {
    nlohmann::json tj;
    tj["tensor"] = t.path;
    tj["compared"] = t.compared;
    tj["equal"] = t.equal;
    tj["max_ulp"] = t.max_ulp == UINT64_MAX ? nlohmann::json("nan") : nlohmann::json(t.max_ulp);
    tj["worst_element"] = t.worst_location;
    // The first wrong element: the first whose bits differ, or under within-bounds the first
    // outside its radius (the table's "first failing stage" uses the same one).
    const bool by_bounds = r.criterion != "bitwise";
    const int64_t first = by_bounds ? t.first_outside_idx : t.first_idx;
    if (first >= 0) {
      tj["first_index"] = first;
      tj["first_element"] = by_bounds ? t.first_outside_location : t.first_location;
    }
    if (t.worst_idx >= 0) {
      tj["worst_index"] = t.worst_idx;
      tj["worst_expected"] = json_number(t.worst_expected);
      tj["worst_actual"] = json_number(t.worst_actual);
    }
    if (t.has_bounds) {
      tj["bound_checked"] = t.bound_checked;
      tj["outside_bound"] = t.outside_bound;
      if (t.first_outside_idx >= 0) {
        tj["first_outside_index"] = t.first_outside_idx;
        tj["first_outside_element"] = t.first_outside_location;
      }
      tj["worst_error_over_bound"] = json_number(t.worst_bound_ratio);
      tj["worst_bound_element"] = t.worst_bound_location;
    }
    tj["passed"] = t.passed;
    j["tensors"].push_back(tj);
  }
  // Replace bytes that are not UTF-8 (a file name may hold any bytes) rather than throw.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace mok::verify
