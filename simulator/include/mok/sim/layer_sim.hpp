// Simulation of one MoE layer (dispatch, expert GEMMs, combine) on a topology: the event
// engine that drives comm-SM programs, flows, signals and the compute queues, and its results.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mok/sim/protocol.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim {

struct SimOptions {
  bool record_trace = false;  // keep spans for a Chrome trace (memory grows with the run)
  int trace_max_gpus = 8;     // only GPUs [0, trace_max_gpus) are traced
  // 0 (default): exact max-min rates after every change of the flow set (fixed-point
  // progressive filling, updated incrementally; FlowNetwork::update_rates()).
  // > 0: an approximation, selectable per scenario ("engine": {"rate_quantum_ns": N}): a full
  // recompute at most once per quantum; in between, new flows take the capacity left unused
  // on their path and capacity freed by finished flows idles. A flow therefore runs at most N
  // ns at a stale rate per change; VALIDATION.md measures the error (< 1 % at N = 5000 on the
  // NVL72 and 576-GPU reference layers). Needed for hundreds of GPUs (README.md, Speed).
  int64_t rate_quantum_ns = 0;
  // Threads for one layer. With 2 or more, rate_quantum_ns > 0 and at least helper_min_comm_sms
  // comm SMs in all, a second thread applies each full recompute's rate changes (segment ends,
  // chunk milestones, completion times) while the filling is still running, in the filling's
  // order. Every output is identical; only the time taken changes (576 GPUs at a 5 us quantum:
  // ~25% less on two cores; README.md, Speed). Between fillings the helper spins, then yields,
  // so it keeps a second core busy for the run. Below ~2,000 comm SMs (64 GPUs of 32) a
  // recompute is too short for the hand-over to pay; tests lower the bound.
  int threads = 1;
  int helper_min_comm_sms = 2048;
  // Signal writes wait behind queued bytes at congested NVLink ports: a flag or counter atomic
  // (issued after its fence) from s to d waits Q/C at s's out-port and at d's in-port, where Q
  // is the data that window-limited flows bottlenecked at that port keep queued there,
  // sum(window - rate x round trip). Re-evaluated after every rate update.
  bool signal_queueing = false;
  // Progress of a long single run (the CLI prints these lines to stderr): called about every
  // progress_interval_s of wall time with the simulated time reached and the transfers done;
  // never called when empty, and never changes a result.
  std::function<void(const std::string&)> progress;
  double progress_interval_s = 2.0;
  // Tests and benchmarks: a full progressive filling at every change instead of the incremental
  // update (rate_quantum_ns = 0 only). The rates, and so every output, are identical.
  bool full_rate_recompute = false;
  // Tests: keep every GPU's HBM on the paths of remote flows even where it provably never
  // saturates (the engine leaves it off then, so that rate updates walk shorter paths; that
  // changes no rate). Every output is identical.
  bool hbm_on_every_path = false;
  // Tests: cut every GPU's GEMM tiles a second time, the plain way (spec::build_routing_plan's
  // row lists, each row's piece looked up by its token), and stop with an internal error where
  // the engine's tiles (from the pieces' runs) differ in rows or ready time. Slow; no output
  // changes.
  bool check_tiles = false;
};

// Distribution summary of integer nanoseconds (nearest-rank quantiles, exact).
struct Quantiles {
  int64_t count = 0;
  double mean_ns = 0;
  int64_t p50_ns = 0, p90_ns = 0, p99_ns = 0, max_ns = 0;
};

struct PhaseResult {
  bool simulated = false;
  int64_t start_ns = 0;           // the phase's clock: 0, or in a layer the combine's first byte
  int64_t end_ns = 0;             // the last receiver knows it has all its data
  int64_t data_end_ns = 0;        // the last byte arrived
  int64_t wire_bytes = 0;         // bytes on all paths (incl. local copies and flag overhead)
  int64_t scaleup_bytes = 0;      // bytes over NVLink
  int64_t scaleout_bytes = 0;     // bytes over NICs
  int64_t payload_bytes_max_gpu = 0;  // most payload bytes one GPU receives
  double recv_gbps_per_gpu = 0;   // mean over GPUs of received payload bytes / (end_ns - start_ns) (DeepEP's figure)
  double nvlink_utilization = 0;  // NVLink egress bytes / (effective capacity * GPUs * (end_ns - start_ns))
  Quantiles chunk_signal;         // per chunk: last byte arrived -> consumer knows
  Quantiles completion_signal;    // per receiver: its last byte arrived -> it knows it has all
  int64_t num_chunks = 0;
  int64_t num_signal_writes = 0;  // flags, atomics or barrier messages
};

struct GpuTimeline {
  int64_t dispatch_known_ns = 0;  // all dispatch data known present
  int64_t compute_done_ns = 0;
  int64_t combine_known_ns = 0;
  int64_t done_ns = 0;            // output ready
  int64_t rows = 0;               // routed rows its experts compute
  int64_t recv_payload_bytes_dispatch = 0;
  int64_t recv_payload_bytes_combine = 0;
};

struct PathSegment {
  std::string what;
  int64_t start_ns = 0, end_ns = 0;
};

struct ResourceSummary {
  std::string kind;               // nvlink_out, nvlink_in, nic_out, nic_in, hbm, uplink_out, uplink_in
  int count = 0;
  double capacity_gbps = 0;       // each
  int64_t bytes = 0;              // carried by all of this kind together (exact)
  double mean_utilization = 0;    // over [0, layer_ns]
  double max_utilization = 0;
  std::string busiest;            // name of the most used one
};

struct TraceSpan {
  int gpu = 0;
  int lane = 0;                   // comm SM index, or -1 for the compute queue
  int64_t start_ns = 0, end_ns = 0;
  std::string name;
  int64_t bytes = 0;
};

struct LayerResult {
  int64_t layer_ns = 0;
  PhaseResult dispatch, combine;
  int64_t compute_ns_max = 0;     // busiest GPU's compute time (tiles + shared expert)
  std::vector<GpuTimeline> gpus;
  LoadStats expert_load, gpu_load;
  std::vector<PathSegment> critical_path;
  std::vector<ResourceSummary> resources;
  int64_t num_events = 0;            // heap events: flow completions, SM steps, signals, compute
  int64_t num_chunk_milestones = 0;  // chunk arrivals, evaluated in batches per flow segment
  int64_t num_rate_recomputes = 0, num_flows = 0;
  std::vector<TraceSpan> trace;
};

// Simulates one layer. Deterministic: the result is a pure function of the arguments.
// Throws Error when the workload does not fit the topology or protocol (names the field).
LayerResult simulate_layer(const Topology& topo, const Workload& work, const ProtocolConfig& proto,
                           const SimOptions& options = {});

// The layer's compute times against int64 nanoseconds: throws the Error simulate_layer would
// throw for a layer whose GEMMs (or final weighted sum) could take over 1e17 ns, without a
// workload, so that a front end can refuse it before building one.
void check_layer_times(const Topology& topo, const spec::LayerConfig& cfg, const ProtocolConfig& proto);

Quantiles quantiles_of(std::vector<int64_t> values);

}  // namespace mok::sim
