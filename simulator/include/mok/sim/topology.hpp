// Topology parameters (GPU, scale-up NVLink domain, scale-out NICs, signaling costs), their
// sources, the JSON file format that holds them, and the built-in presets.
#pragma once

#include <istream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mok::sim {

// All bandwidths are per GPU per direction in GB/s (1 GB/s = 1 byte/ns); times in ns.
struct Topology {
  std::string name;
  std::string description;

  // --- the GPU -------------------------------------------------------------------------
  std::string gpu_name;
  int num_sms = 0;                        // SMs per GPU (communication + compute)
  double hbm_gbps = 0;                    // HBM bandwidth, reads and writes together
  double bf16_dense_tflops = 0;           // dense BF16 tensor-core peak
  double gemm_efficiency = 0;             // fraction of that peak the expert GEMMs reach
  double sm_store_gbps = 0;               // remote-store issue rate of one SM, LD/ST path
  double sm_tma_store_gbps = 0;           // remote-store issue rate of one SM, TMA path
  double sm_load_gbps = 0;                // remote-load issue rate of one SM, LD/ST path
  double sm_tma_load_gbps = 0;            // remote-load issue rate of one SM, TMA path
  double sm_store_inflight_bytes = 0;     // posted remote writes one SM may have unacknowledged
  double sm_load_inflight_bytes = 0;      // remote loads one SM keeps in flight, LD/ST path
  double sm_tma_load_inflight_bytes = 0;  // remote loads one SM keeps in flight, TMA path

  // --- the scale-up domain (NVLink + NVSwitch) -------------------------------------------
  int gpus_per_domain = 0;                // 8 (HGX) or 72 (NVL72)
  int num_switch_chips = 0;               // NVSwitch chips; every GPU has links to each
  double nvlink_gbps = 0;                 // datasheet NVLink bandwidth per direction
  double nvlink_efficiency = 0;           // achievable payload fraction of nvlink_gbps
  double nvlink_latency_ns = 0;           // one-way latency of a small remote write

  // --- scale-out (NICs between domains) ----------------------------------------------------
  int num_domains = 1;                    // racks or nodes
  double nic_gbps = 0;                    // NIC bandwidth per GPU per direction
  double nic_efficiency = 0;              // achievable payload fraction of nic_gbps
  double nic_latency_ns = 0;              // one-way latency GPU -> NIC -> fabric -> NIC -> GPU
  double uplink_oversubscription = 1;     // domain uplink: sum(nic_gbps) / this

  // --- signaling ----------------------------------------------------------------------------
  double fence_overhead_ns = 0;           // fixed cost of a system-scope fence on top of acks
  double local_fence_ns = 0;              // release fence when only local stores are pending
  double atomic_service_ns = 0;           // service time of one remote atomic at its target
  double local_poll_ns = 0;               // one read of a flag in local memory

  std::map<std::string, std::string> sources;  // "section.field" -> where the value comes from

  int num_gpus() const { return gpus_per_domain * num_domains; }
  int domain_of(int gpu_idx) const { return gpu_idx / gpus_per_domain; }
  // Effective (achievable) bandwidths the flow model uses, GB/s.
  double nvlink_effective_gbps() const { return nvlink_gbps * nvlink_efficiency; }
  double nic_effective_gbps() const { return nic_gbps * nic_efficiency; }
};

// Parses a topology file (the format of simulator/topologies/*.json). `origin` names the file
// in error messages. Every field may be a number or {"value": number, "source": "text"}.
Topology topology_from_json(const nlohmann::json& doc, const std::string& origin);
nlohmann::json topology_to_json(const Topology& topo);

// Names of the built-in presets (embedded copies of simulator/topologies/*.json).
std::vector<std::string> preset_names();
// Resolves a topology spec: a preset name ("hgx-h200", "gb200-nvl72", ...), "multi-rack:N" or
// "multi-rack:N:GBPS" (N NVL72 racks of gb200-nvl72, NICs of 400 or 800 Gb/s per GPU), or a
// path to a JSON file. Throws Error naming the spec and the accepted forms.
Topology resolve_topology(const std::string& spec);

// Reads a JSON file (comments allowed); `what` names it in errors ("scenario", "topology file").
// A directory, an unreadable file, bad JSON and numbers past a double's range are Errors.
nlohmann::json read_json_file(const std::string& path, const std::string& what = "scenario");
// The parser read_json_file uses, on any stream: JSON with comments; a key repeated in an object,
// a number past a double's range, nesting deeper than kMaxJsonDepth or bad syntax throw Error
// naming `origin` (e.g. "scenario 'x.json'" or "--set '/protocol=...'"); places in the text are
// named as JSON pointers below `base` (a --set value's own pointer; "" for a whole file).
inline constexpr size_t kMaxJsonDepth = 64;
nlohmann::json parse_json_checked(std::istream& in, const std::string& origin, const std::string& base = "");
// The raw JSON of a preset (for `mok-sim topology show`).
nlohmann::json preset_json(const std::string& name);
// Applies {"section.field": value} overrides, e.g. {"scale_up.nvlink_gbps": 1000}.
Topology apply_overrides(Topology topo, const nlohmann::json& overrides, const std::string& origin);
// Checks ranges; throws Error naming origin, field and fix.
void validate_topology(const Topology& topo, const std::string& origin);

}  // namespace mok::sim
