// Topology file parsing, validation, overrides and the preset registry.
#include "mok/sim/topology.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <variant>

#include "mok/sim/error.hpp"

namespace mok::sim {

// Embedded copies of simulator/topologies/*.json, generated at build time.
namespace detail {
struct EmbeddedPreset {
  const char* name;
  const char* json_text;
};
extern const EmbeddedPreset kEmbeddedPresets[];
extern const int kNumEmbeddedPresets;
}  // namespace detail

namespace {

using FieldPtr = std::variant<double Topology::*, int Topology::*>;
struct FieldDef {
  const char* key;  // "section.field"
  FieldPtr ptr;
  double min_value;
  double max_value;
  const char* meaning;
};

const std::vector<FieldDef>& field_table() {
  static const std::vector<FieldDef> table = {
      {"gpu.num_sms", &Topology::num_sms, 1, 1e4, "SMs per GPU"},
      {"gpu.hbm_gbps", &Topology::hbm_gbps, 1, 1e6, "HBM bandwidth, GB/s"},
      {"gpu.bf16_dense_tflops", &Topology::bf16_dense_tflops, 1, 1e6, "dense BF16 peak, TFLOP/s"},
      {"gpu.gemm_efficiency", &Topology::gemm_efficiency, 0.01, 1, "fraction of peak the expert GEMMs reach"},
      {"gpu.sm_store_gbps", &Topology::sm_store_gbps, 0.1, 1e4, "remote-store issue rate per SM (LD/ST), GB/s"},
      {"gpu.sm_tma_store_gbps", &Topology::sm_tma_store_gbps, 0.1, 1e4, "remote-store issue rate per SM (TMA), GB/s"},
      {"gpu.sm_load_gbps", &Topology::sm_load_gbps, 0.1, 1e4, "remote-load issue rate per SM (LD/ST), GB/s"},
      {"gpu.sm_tma_load_gbps", &Topology::sm_tma_load_gbps, 0.1, 1e4, "remote-load issue rate per SM (TMA), GB/s"},
      {"gpu.sm_store_inflight_bytes", &Topology::sm_store_inflight_bytes, 1, 1e9, "unacknowledged remote writes per SM, bytes"},
      {"gpu.sm_load_inflight_bytes", &Topology::sm_load_inflight_bytes, 1, 1e9, "remote loads in flight per SM (LD/ST), bytes"},
      {"gpu.sm_tma_load_inflight_bytes", &Topology::sm_tma_load_inflight_bytes, 1, 1e9, "remote loads in flight per SM (TMA), bytes"},
      {"scale_up.gpus_per_domain", &Topology::gpus_per_domain, 1, 4096, "GPUs per NVLink domain"},
      {"scale_up.num_switch_chips", &Topology::num_switch_chips, 0, 1e4, "NVSwitch chips per domain"},
      {"scale_up.nvlink_gbps", &Topology::nvlink_gbps, 0.1, 1e6, "NVLink bandwidth per GPU per direction, GB/s"},
      {"scale_up.nvlink_efficiency", &Topology::nvlink_efficiency, 0.01, 1, "achievable payload fraction of nvlink_gbps"},
      {"scale_up.nvlink_latency_ns", &Topology::nvlink_latency_ns, 0, 1e7, "one-way small-write latency, ns"},
      {"scale_out.num_domains", &Topology::num_domains, 1, 4096, "number of NVLink domains (nodes or racks)"},
      {"scale_out.nic_gbps", &Topology::nic_gbps, 0.1, 1e6, "NIC bandwidth per GPU per direction, GB/s"},
      {"scale_out.nic_efficiency", &Topology::nic_efficiency, 0.01, 1, "achievable payload fraction of nic_gbps"},
      {"scale_out.nic_latency_ns", &Topology::nic_latency_ns, 0, 1e8, "one-way latency across the scale-out fabric, ns"},
      {"scale_out.uplink_oversubscription", &Topology::uplink_oversubscription, 1, 1e3, "domain uplink oversubscription (1 = non-blocking)"},
      {"signaling.fence_overhead_ns", &Topology::fence_overhead_ns, 0, 1e7, "fixed system-fence cost beyond the ack wait, ns"},
      {"signaling.local_fence_ns", &Topology::local_fence_ns, 0, 1e7, "release fence over local stores only, ns"},
      {"signaling.atomic_service_ns", &Topology::atomic_service_ns, 0, 1e7, "service time of one remote atomic at its target, ns"},
      {"signaling.local_poll_ns", &Topology::local_poll_ns, 0, 1e7, "one read of a local flag, ns"},
  };
  return table;
}

const FieldDef* find_field(const std::string& key) {
  for (const auto& f : field_table())
    if (key == f.key) return &f;
  return nullptr;
}

std::string known_fields() {
  std::string s;
  for (const auto& f : field_table()) s += std::string(s.empty() ? "" : ", ") + f.key;
  return s;
}

void set_field(Topology& topo, const FieldDef& def, const nlohmann::json& v, const std::string& origin) {
  double x = 0;
  std::string source;
  if (v.is_number()) {
    x = v.get<double>();
  } else if (v.is_object() && v.contains("value") && v["value"].is_number()) {
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it.key() != "value" && it.key() != "source" && it.key() != "notes" && it.key() != "$comment")
        throw Error(origin + ": field '" + def.key + "': key '" + it.key() +
                    "' is unknown; write {\"value\": number, \"source\": \"...\"}");
    x = v["value"].get<double>();
    if (v.contains("source")) {
      if (!v["source"].is_string())
        throw Error(origin + ": field '" + def.key + "': \"source\" must be a string");
      source = v["source"].get<std::string>();
    }
  } else {
    throw Error(origin + ": field '" + def.key + "' must be a number or {\"value\": number, \"source\": \"...\"} (" +
                def.meaning + ")");
  }
  if (!(x >= def.min_value && x <= def.max_value)) {
    std::ostringstream os;
    os << origin << ": field '" << def.key << "' = " << x << " is out of range [" << def.min_value << ", "
       << def.max_value << "] (" << def.meaning << ")";
    throw Error(os.str());
  }
  // The engine's clock counts whole nanoseconds: a fraction would be dropped in some uses of a
  // time and kept in others (the fence's share of a rate), so it is refused.
  const std::string key = def.key;
  if (key.size() > 3 && key.compare(key.size() - 3, 3, "_ns") == 0 && x != std::floor(x)) {
    std::ostringstream os;
    os << origin << ": field '" << def.key << "' = " << x << " must be a whole number of ns (" << def.meaning
       << "); round it";
    throw Error(os.str());
  }
  if (std::holds_alternative<int Topology::*>(def.ptr)) {
    if (x != static_cast<double>(static_cast<int>(x)))
      throw Error(origin + ": field '" + def.key + "' must be an integer (" + def.meaning + ")");
    topo.*std::get<int Topology::*>(def.ptr) = static_cast<int>(x);
  } else {
    topo.*std::get<double Topology::*>(def.ptr) = x;
  }
  if (!source.empty()) topo.sources[def.key] = source;
}

}  // namespace

void validate_topology(const Topology& topo, const std::string& origin) {
  for (const auto& def : field_table()) {
    double x = std::holds_alternative<int Topology::*>(def.ptr)
                   ? static_cast<double>(topo.*std::get<int Topology::*>(def.ptr))
                   : topo.*std::get<double Topology::*>(def.ptr);
    if (!(x >= def.min_value && x <= def.max_value)) {
      std::ostringstream os;
      os << origin << ": field '" << def.key << "' = " << x << " is missing or out of range [" << def.min_value
         << ", " << def.max_value << "] (" << def.meaning << "); set it in the topology file";
      const std::string key = def.key;
      if (key == "gpu.sm_load_gbps" || key == "gpu.sm_tma_load_gbps")
        os << " (added 2026-12-05: pulls used to be issued at the store rate; every preset sets it equal to "
           << (key == "gpu.sm_load_gbps" ? "gpu.sm_store_gbps" : "gpu.sm_tma_store_gbps") << ")";
      throw Error(os.str());
    }
  }
  if (static_cast<long long>(topo.gpus_per_domain) * topo.num_domains > 65536)
    throw Error(origin + ": scale_up.gpus_per_domain * scale_out.num_domains must be at most 65536");
}

Topology topology_from_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object()) throw Error(origin + ": a topology must be a JSON object");
  Topology topo;
  std::set<std::string> seen;  // "section.field" keys the file gives
  static const char* kSections[] = {"gpu", "scale_up", "scale_out", "signaling"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    if (key == "name") {
      if (!it->is_string()) throw Error(origin + ": \"name\" must be a string");
      topo.name = it->get<std::string>();
    } else if (key == "description") {
      if (!it->is_string()) throw Error(origin + ": \"description\" must be a string");
      topo.description = it->get<std::string>();
    } else if (key == "gpu_name") {
      if (!it->is_string()) throw Error(origin + ": \"gpu_name\" must be a string, e.g. \"H200\"");
      topo.gpu_name = it->get<std::string>();
    } else if (key == "notes" || key == "$comment") {
      continue;
    } else {
      bool is_section = false;
      for (const char* s : kSections) is_section |= key == s;
      if (!is_section)
        throw Error(origin + ": unknown top-level key '" + key +
                    "' (expected name, description, gpu_name, notes, gpu, scale_up, scale_out, signaling)");
      if (!it->is_object()) throw Error(origin + ": section '" + key + "' must be an object");
      for (auto f = it->begin(); f != it->end(); ++f) {
        if (f.key() == "notes" || f.key() == "$comment") continue;
        const std::string full = key + "." + f.key();
        const FieldDef* def = find_field(full);
        if (!def) throw Error(origin + ": unknown field '" + full + "'; known fields: " + known_fields());
        set_field(topo, *def, *f, origin);
        seen.insert(full);
      }
    }
  }
  if (topo.name.empty()) throw Error(origin + ": missing \"name\"");
  // Every field is required: a default that happens to be in range (a latency of 0, one domain)
  // would otherwise run silently with a value nobody chose.
  for (const auto& def : field_table()) {
    const std::string key = def.key;
    if (seen.count(key) != 0) continue;
    std::string msg = origin + ": missing field '" + key + "' (" + def.meaning + "); every field is required: add \"" +
                      key.substr(key.find('.') + 1) + "\" to section \"" + key.substr(0, key.find('.')) +
                      "\" (`mok-sim topology show hgx-h200` shows every field with its source)";
    if (key == "gpu.sm_load_gbps" || key == "gpu.sm_tma_load_gbps")
      msg += std::string(" (added 2026-12-05: pulls used to be issued at the store rate; every preset sets it equal to ") +
             (key == "gpu.sm_load_gbps" ? "gpu.sm_store_gbps" : "gpu.sm_tma_store_gbps") + ")";
    throw Error(msg);
  }
  validate_topology(topo, origin);
  return topo;
}

nlohmann::json topology_to_json(const Topology& topo) {
  nlohmann::json doc;
  doc["name"] = topo.name;
  doc["description"] = topo.description;
  doc["gpu_name"] = topo.gpu_name;
  for (const auto& def : field_table()) {
    const std::string key = def.key;
    const auto dot = key.find('.');
    const std::string section = key.substr(0, dot), field = key.substr(dot + 1);
    nlohmann::json value;
    if (std::holds_alternative<int Topology::*>(def.ptr))
      value = topo.*std::get<int Topology::*>(def.ptr);
    else
      value = topo.*std::get<double Topology::*>(def.ptr);
    auto src = topo.sources.find(key);
    if (src != topo.sources.end())
      doc[section][field] = {{"value", value}, {"source", src->second}};
    else
      doc[section][field] = value;
  }
  return doc;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (int i = 0; i < detail::kNumEmbeddedPresets; ++i) names.emplace_back(detail::kEmbeddedPresets[i].name);
  return names;
}

nlohmann::json preset_json(const std::string& name) {
  for (int i = 0; i < detail::kNumEmbeddedPresets; ++i)
    if (name == detail::kEmbeddedPresets[i].name)
      return nlohmann::json::parse(detail::kEmbeddedPresets[i].json_text);
  std::string names;
  for (const auto& n : preset_names()) names += " " + n;
  throw Error("unknown topology preset '" + name + "'; presets:" + names +
              ", multi-rack:N[:400|800], or a path to a .json file");
}

Topology apply_overrides(Topology topo, const nlohmann::json& overrides, const std::string& origin) {
  if (overrides.is_null()) return topo;
  if (!overrides.is_object())
    throw Error(origin + ": topology overrides must be an object like {\"scale_up.nvlink_gbps\": 900}");
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    const FieldDef* def = find_field(it.key());
    if (!def) throw Error(origin + ": unknown topology override '" + it.key() + "'; known fields: " + known_fields());
    set_field(topo, *def, *it, origin + " (override)");
    if (it->is_number()) topo.sources[it.key()] = "override in " + origin;
  }
  validate_topology(topo, origin);
  return topo;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(what + " '" + path + "' is a directory; give a JSON file");
  std::ifstream in(path);
  if (!in) throw Error(what + " '" + path + "' cannot be opened; check the path");
  return parse_json_checked(in, what + " '" + path + "'");
}

nlohmann::json parse_json_checked(std::istream& in, const std::string& origin, const std::string& base) {
  // A key given twice in one object would silently keep the last value (a whole "protocol"
  // block lost, say): the parser's callback follows the open objects and arrays to name it.
  struct Frame {
    bool object;
    std::string pointer;            // JSON pointer of this object or array
    std::set<std::string> keys;     // objects: keys seen so far
    std::string key;                // objects: the key whose value comes next
    size_t next = 0;                // arrays: index of the next element
  };
  std::vector<Frame> open;
  std::string duplicate;
  auto child_pointer = [&open, &base]() -> std::string {
    if (open.empty()) return base;
    Frame& top = open.back();
    return top.pointer + "/" + (top.object ? top.key : std::to_string(top.next++));
  };
  const nlohmann::json::parser_callback_t track = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start: {
        // Each open level keeps its pointer, so memory grows with the square of the depth: a
        // scenario or topology needs a few levels; far more is a broken or hostile file.
        if (open.size() >= kMaxJsonDepth)
          throw Error(origin + " nests objects and arrays more than " + std::to_string(kMaxJsonDepth) +
                      " deep; a scenario or topology needs a few levels");
        std::string ptr = child_pointer();
        open.push_back(Frame{event == E::object_start, std::move(ptr), {}, {}, 0});
        break;
      }
      case E::object_end:
      case E::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case E::key:
        if (!open.empty()) {
          Frame& top = open.back();
          top.key = parsed.get<std::string>();
          if (!top.keys.insert(top.key).second && duplicate.empty())
            duplicate = (top.pointer.empty() ? std::string("the top level") : top.pointer) + " has \"" + top.key +
                        "\" twice";
        }
        break;
      case E::value:
        if (!open.empty() && !open.back().object) ++open.back().next;
        break;
    }
    return true;
  };
  try {
    nlohmann::json doc = nlohmann::json::parse(in, track, true, /*ignore_comments=*/true);
    if (!duplicate.empty())
      throw Error(origin + ": " + duplicate + " (a JSON key may appear once per object; the later " +
                  "one would silently replace the earlier: merge them)");
    return doc;
  } catch (const nlohmann::json::out_of_range& e) {
    // a number past double's range (1e999): the parser names the text, not the key
    throw Error(origin + " holds a number out of range (" + e.what() + "); numbers must fit a double");
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + " is not valid JSON: " + e.what());
  }
}

Topology resolve_topology(const std::string& spec) {
  const std::string kMulti = "multi-rack:";
  if (spec.rfind(kMulti, 0) == 0) {
    const std::string rest = spec.substr(kMulti.size());
    const auto colon = rest.find(':');
    const std::string racks_text = rest.substr(0, colon);
    const std::string gbps_text = colon == std::string::npos ? "400" : rest.substr(colon + 1);
    int racks = 0, gbits = 0;
    try {
      size_t used = 0;
      racks = std::stoi(racks_text, &used);
      if (used != racks_text.size()) racks = 0;
      gbits = std::stoi(gbps_text, &used);
      if (used != gbps_text.size()) gbits = 0;
    } catch (const std::exception&) {
      racks = 0;
    }
    if (racks < 1 || racks > 56 || (gbits != 400 && gbits != 800))
      throw Error("topology '" + spec + "': expected multi-rack:N or multi-rack:N:400|800 with 1 <= N <= 56 " +
                  "(N gb200-nvl72 racks; NIC Gb/s per GPU, default 400)");
    Topology topo = topology_from_json(preset_json("gb200-nvl72"), "preset gb200-nvl72");
    topo.name = spec;
    topo.description = std::to_string(racks) + " GB200 NVL72 racks joined by " + std::to_string(gbits) +
                       " Gb/s scale-out NICs (one per GPU), non-blocking spine";
    topo.num_domains = racks;
    topo.nic_gbps = gbits / 8.0;
    topo.sources["scale_out.num_domains"] = "from the topology name";
    topo.sources["scale_out.nic_gbps"] = std::to_string(gbits) +
                                         " Gb/s per GPU: ConnectX-7 (400) or ConnectX-8 (800) datasheet line rate";
    validate_topology(topo, spec);
    return topo;
  }
  if (spec.find('/') != std::string::npos || spec.find(".json") != std::string::npos) {
    return topology_from_json(read_json_file(spec, "topology file"), spec);
  }
  return topology_from_json(preset_json(spec), "preset " + spec);
}

}  // namespace mok::sim
