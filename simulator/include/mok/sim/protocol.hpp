// Protocol knobs: push or pull per phase, completion signaling scheme, chunking, SM counts.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mok::sim {

// Push: the GPU that holds the data writes it into the peer (posted remote stores).
// Pull: the GPU that needs the data reads it from the peer (remote loads).
enum class Direction { kPush, kPull };

// How a receiver of pushed data learns that a chunk has arrived (pull needs none of these:
// a reader knows its loads have returned).
//  kFenceFlag:  after each chunk the sending SM fences (waits for the acks of its writes), then
//               writes one flag per (source, destination, chunk); receivers poll the flags.
//  kCounter:    after each chunk the sender fences, then atomically adds to one arrival counter
//               per destination; the destination polls one word until it reaches its total.
//  kFlagInData: every 128-byte line carries its own flag (LL128-style): no fence, 8 of 128
//               bytes are flag, receivers poll the data lines.
//  kBarrier:    no per-chunk signal; every SM fences once at the end of the phase and all GPUs
//               pass a dissemination barrier.
//  kPeerFenceFlag: no per-chunk signal; after its data every SM fences once, then (once all of
//               the GPU's comm SMs are done) `signal_threads` threads each walk their share of the
//               peers issuing "fence; flag" per peer pair. A system-scope fence waits for the
//               acks of every earlier write of its thread, the previous peer's flag included, so
//               each thread's flags are one round trip (2L) plus the fence overhead apart. The
//               receiver knows all data from a source when that source's flag lands.
enum class Signaling { kFenceFlag, kCounter, kFlagInData, kBarrier, kPeerFenceFlag };

enum class CopyEngine { kTma, kLdSt };
enum class Phases { kLayer, kDispatch, kCombine };

struct ProtocolConfig {
  Direction dispatch = Direction::kPull;   // mok's kernel: dispatch pulls (DESIGN section 5)
  Direction combine = Direction::kPush;    // mok's kernel: combine pushes into [T,K,H] slots
  Signaling signaling = Signaling::kFenceFlag;
  CopyEngine copy_engine = CopyEngine::kTma;
  Phases phases = Phases::kLayer;
  int64_t chunk_tokens = 128;      // signaling granularity: tokens of the token owner per chunk
  int comm_sms = 32;               // SMs per GPU that move data (the rest compute)
  int signal_threads = 1;          // peer_fence_flag: threads per GPU issuing the per-peer chains
  int64_t poll_interval_ns = 100;  // a poller's minimum period between sweeps
  int64_t gemm_tile_rows = 128;    // expert GEMM M-tile; partial tiles cost a full tile
  int dispatch_bytes_per_element = 2;   // 2 = bf16, 1 = fp8 (plus 4 bytes of scale per 128)
  int combine_bytes_per_element = 2;    // bf16 y rows
  bool dispatch_dedup = true;           // a token travels once per destination GPU
  bool combine_reduce_per_rank = false; // false: every slot's y travels (mok: slot order fixes sums)
  // Push dispatch work split ("push_order"). false ("per_peer", the default): each comm SM
  // serves whole peers one after the other (one destination at a time). true ("row_order"): the
  // owner's chunks are dealt round-robin over its comm SMs and an SM walks its chunk's rows,
  // writing each row to its destination GPUs; its in-flight store window is shared by all those
  // destinations (each gets the share of its bytes in the chunk), and the SM moves on to its next
  // chunk only when every destination's writes of this one have completed: a congested
  // destination holds the window and delays the SM's later writes to uncongested destinations
  // (head-of-line blocking). Combine and pull are unaffected.
  bool push_row_order = false;
};

ProtocolConfig protocol_from_json(const nlohmann::json& doc, const std::string& origin);
nlohmann::json protocol_to_json(const ProtocolConfig& p);
const char* to_string(Direction d);
const char* to_string(Signaling s);
const char* to_string(Phases p);

}  // namespace mok::sim
