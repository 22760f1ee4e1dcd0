// SVG line plots of sweep results.
#include "mok/sim/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "mok/sim/error.hpp"
#include "mok/sim/report.hpp"

namespace mok::sim {

namespace {
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}
// "Nice" tick step for a range: 1, 2 or 5 times a power of ten.
double tick_step(double span) {
  if (span <= 0) return 1;
  const double raw = span / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}
// Tick positions k x step in [lo, hi], each computed from its index (a sum of steps stops moving
// once the step is below the spacing of doubles near the values, e.g. x values 0.3 and
// 0.30000000000000004, or seeds near 2^60). When the steps cannot be told apart or would be too
// many, the two ends alone.
std::vector<double> ticks(double lo, double hi, double step) {
  std::vector<double> out;
  const double k0 = std::ceil(lo / step), k1 = std::floor(hi / step + 1e-9);
  // The indices must be exact integers in a double (below 2^52) and the count is bounded, so the
  // loop runs over an integer.
  if (std::isfinite(k0) && std::isfinite(k1) && std::fabs(k0) < 0x1p52 && std::fabs(k1) < 0x1p52 && k1 >= k0 &&
      k1 - k0 <= 50 && lo + step != lo && hi + step != hi)
    for (int i = 0; i <= static_cast<int>(k1 - k0); ++i) out.push_back((k0 + i) * step);
  if (out.size() < 2) out = {lo, hi};
  return out;
}
}  // namespace

std::string svg_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                          std::vector<PlotSeries> series) {
  const double W = 720, H = 440, left = 80, right = 190, top = 40, bottom = 60;
  double x0 = 1e300, x1 = -1e300, y0 = 0, y1 = -1e300;
  for (auto& s : series) {
    std::sort(s.points.begin(), s.points.end());
    for (auto [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (x0 > x1) x0 = 0, x1 = 1;
  // A flat range gets some width (relative for large values, where + 1 would not move them).
  if (x1 == x0) x1 = x0 + std::max(1.0, std::abs(x0) * 1e-6);
  if (y1 <= y0) y1 = y0 + std::max(1.0, std::abs(y0) * 1e-6);
  const double ys = tick_step(y1 - y0);
  y1 = std::ceil(y1 / ys) * ys;
  const double pw = W - left - right, ph = H - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n",
                W, H);
  os << buf << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << esc(title) << "</text>\n";
  std::snprintf(buf, sizeof buf, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"black\"/>\n",
                left, top, pw, ph);
  os << buf;
  for (double y : ticks(y0, y1, ys)) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%.2f\" x2=\"%g\" y2=\"%.2f\" stroke=\"#ddd\"/><text x=\"%g\" y=\"%.2f\" "
                  "text-anchor=\"end\">%s</text>\n",
                  left, py(y), left + pw, py(y), left - 6, py(y) + 4, format_number(y).c_str());
    os << buf;
  }
  const double xs = tick_step(x1 - x0);
  for (double x : ticks(x0, x1, xs)) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.2f\" y1=\"%g\" x2=\"%.2f\" y2=\"%g\" stroke=\"#ddd\"/><text x=\"%.2f\" y=\"%g\" "
                  "text-anchor=\"middle\">%s</text>\n",
                  px(x), top, px(x), top + ph, px(x), top + ph + 18, format_number(x).c_str());
    os << buf;
  }
  os << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">" << esc(x_label)
     << "</text>\n";
  std::snprintf(buf, sizeof buf, "<text transform=\"translate(18,%g) rotate(-90)\" text-anchor=\"middle\">",
                top + ph / 2);
  os << buf << esc(y_label) << "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % 8];
    os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (auto [x, y] : series[i].points) {
      std::snprintf(buf, sizeof buf, "%.2f,%.2f ", px(x), py(y));
      os << buf;
    }
    os << "\"/>\n";
    for (auto [x, y] : series[i].points) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", px(x), py(y), color);
      os << buf;
    }
    const double ly = top + 14 + 18.0 * static_cast<double>(i);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"%g\" "
                  "y=\"%g\">",
                  left + pw + 12, ly, left + pw + 32, ly, color, left + pw + 38, ly + 4);
    os << buf << esc(series[i].label) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

void check_plot_request(const nlohmann::json& req, const std::vector<SweepPoint>& points, const std::string& origin) {
  const std::string known = "file, x, y, series, title";
  if (!req.is_object()) throw Error(origin + ": each plot must be an object with " + known);
  for (auto it = req.begin(); it != req.end(); ++it) {
    const std::string& k = it.key();
    if (k != "file" && k != "x" && k != "y" && k != "series" && k != "title" && k != "notes" && k != "$comment")
      throw Error(origin + ": plot key '" + k + "' is unknown; known: " + known);
    if (k != "notes" && k != "$comment" && !it->is_string()) throw Error(origin + ": plot " + k + " must be a string");
  }
  if (!req.contains("file") || !req.contains("x") || !req.contains("y"))
    throw Error(origin + ": each plot needs \"file\", \"x\" (a sweep path) and \"y\" (a metric name)");
  const std::string file = req["file"].get<std::string>();
  const std::string x_path = req["x"].get<std::string>();
  const std::string y_name = req["y"].get<std::string>();
  const std::string s_path = req.value("series", std::string());
  if (file.find('/') != std::string::npos || file.size() < 5 || file.substr(file.size() - 4) != ".svg")
    throw Error(origin + ": plot file '" + file + "' must be a plain name ending in .svg (written to --out)");
  auto setting = [&](const SweepPoint& p, const std::string& path) -> const nlohmann::json* {
    for (const auto& [k, v] : p.settings)
      if (k == path) return &v;
    return nullptr;
  };
  if (points.empty() || !setting(points[0], x_path))
    throw Error(origin + ": plot x '" + x_path + "' is not a sweep path of this scenario");
  if (!s_path.empty() && !setting(points[0], s_path))
    throw Error(origin + ": plot series '" + s_path + "' is not a sweep path of this scenario");
  for (const SweepPoint& p : points)
    if (!setting(p, x_path)->is_number()) throw Error(origin + ": plot x '" + x_path + "' must sweep numbers");
  // A sweep axis that is neither x nor the series would be averaged into the plotted lines
  // without a word (push and pull as one line, say).
  if (!s_path.empty() && s_path == x_path)
    throw Error(origin + ": plot '" + file + "': series and x are both " + x_path + "; give another sweep path as the series");
  for (size_t a = 0; a < points[0].settings.size(); ++a) {
    const std::string& path = points[0].settings[a].first;
    if (path == x_path || path == s_path) continue;
    bool varies = false;  // an axis of one value averages nothing
    for (const SweepPoint& p : points) varies |= p.settings[a].second != points[0].settings[a].second;
    if (varies)
      throw Error(origin + ": plot '" + file + "': the sweep also varies " + path + ", which is neither its x nor " +
                  (s_path.empty() ? "a series" : "its series") + ": its runs would be averaged into one line; " +
                  (s_path.empty() ? "give \"series\": \"" + path + "\" or" : std::string("plot at most two varying fields:")) +
                  " split the sweep into scenarios");
  }
  // The metric names are the same for every run (flat_metrics), so an empty result lists them.
  bool found = false;
  std::string names;
  for (const auto& [n, v] : flat_metrics(LayerResult{})) {
    found |= n == y_name;
    names += " " + n;
  }
  if (!found) throw Error(origin + ": plot y '" + y_name + "' is not a metric; metrics:" + names);
  // A metric of a phase that no point's /protocol/phases simulates (combine_us in a dispatch-only
  // sweep) would draw no line: refused here, before the runs (it used to be found after them).
  // flat_metrics' names: dispatch_*, combine_*, and compute_max_us (both phases).
  const bool needs_dispatch = y_name.rfind("dispatch_", 0) == 0 || y_name == "compute_max_us";
  const bool needs_combine = y_name.rfind("combine_", 0) == 0 || y_name == "compute_max_us";
  bool any = !needs_dispatch && !needs_combine;
  for (size_t i = 0; i < points.size() && !any; ++i) {
    const nlohmann::json& doc = points[i].doc;
    const nlohmann::json* ph = nullptr;
    if (doc.contains("protocol") && doc["protocol"].is_object() && doc["protocol"].contains("phases"))
      ph = &doc["protocol"]["phases"];
    if (!ph || !ph->is_string() || *ph == "layer") {
      any = true;  // the whole layer (an unusable value is the run's own error to report)
    } else {
      const std::string v = ph->get<std::string>();
      any = (v == "dispatch" && !needs_combine) || (v == "combine" && !needs_dispatch) ||
            (v != "dispatch" && v != "combine");
    }
  }
  if (!any)
    throw Error(origin + ": plot '" + file + "': no run simulates " + y_name + " (every point's /protocol/phases " +
                "leaves its phase out), so the plot would be empty; plot another metric, or sweep or set "
                "/protocol/phases");
}

std::pair<std::string, std::string> plot_from_rows(const nlohmann::json& req, const std::vector<SweepPoint>& points,
                                                   const std::vector<RunRow>& rows, const std::string& origin) {
  check_plot_request(req, points, origin);
  if (rows.empty()) throw Error(origin + ": a plot needs at least one run", ErrorKind::kInternal);
  const std::string file = req["file"].get<std::string>();
  const std::string x_path = req["x"].get<std::string>();
  const std::string y_name = req["y"].get<std::string>();
  const std::string s_path = req.value("series", std::string());
  auto setting = [&](const SweepPoint& p, const std::string& path) -> const nlohmann::json* {
    for (const auto& [k, v] : p.settings)
      if (k == path) return &v;
    return nullptr;
  };
  size_t metric = SIZE_MAX;
  for (size_t m = 0; m < rows[0].metrics.size(); ++m)
    if (rows[0].metrics[m].first == y_name) metric = m;
  if (metric == SIZE_MAX) throw Error(origin + ": plot y '" + y_name + "' is not a metric", ErrorKind::kInternal);
  std::map<std::string, std::map<double, std::pair<double, int>>> acc;  // series -> x -> (sum, n)
  for (const auto& r : rows) {
    if (std::isnan(r.metrics[metric].second)) continue;  // the run did not simulate it
    const SweepPoint& p = points[r.point_idx];
    const nlohmann::json* xv = setting(p, x_path);
    const std::string label = s_path.empty() ? y_name : s_path + " = " + setting(p, s_path)->dump();
    auto& cell = acc[label][xv->get<double>()];
    cell.first += r.metrics[metric].second;
    cell.second += 1;
  }
  // check_plot_request refused a metric of a phase no point simulates; every run of a point that
  // does simulates it.
  if (acc.empty())
    throw Error(origin + ": plot '" + file + "': no run simulated " + y_name, ErrorKind::kInternal);
  std::vector<PlotSeries> series;
  for (const auto& [label, xs] : acc) {
    PlotSeries s{label, {}};
    for (const auto& [x, sn] : xs) s.points.emplace_back(x, sn.first / sn.second);
    series.push_back(std::move(s));
  }
  const std::string title = req.value("title", y_name + " vs " + x_path);
  return {file, svg_line_plot(title, x_path, y_name + (rows.size() > points.size() ? " (mean over trials)" : ""), series)};
}

}  // namespace mok::sim
