// Parsing and printing of protocol knobs.
#include "mok/sim/protocol.hpp"

#include <sstream>

#include "mok/sim/error.hpp"

namespace mok::sim {

const char* to_string(Direction d) { return d == Direction::kPush ? "push" : "pull"; }
const char* to_string(Signaling s) {
  switch (s) {
    case Signaling::kFenceFlag: return "fence_flag";
    case Signaling::kCounter: return "counter";
    case Signaling::kFlagInData: return "flag_in_data";
    case Signaling::kBarrier: return "barrier";
    case Signaling::kPeerFenceFlag: return "peer_fence_flag";
  }
  return "?";
}
const char* to_string(Phases p) {
  switch (p) {
    case Phases::kLayer: return "layer";
    case Phases::kDispatch: return "dispatch";
    case Phases::kCombine: return "combine";
  }
  return "?";
}

ProtocolConfig protocol_from_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object()) throw Error(origin + ": \"protocol\" must be an object");
  ProtocolConfig p;
  const std::string where = origin + ": protocol.";
  auto text = [&](const std::string& key, const nlohmann::json& v) {
    if (!v.is_string()) throw Error(where + key + " must be a string");
    return v.get<std::string>();
  };
  auto integer = [&](const std::string& key, const nlohmann::json& v, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) throw Error(where + key + " must be an integer");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      std::ostringstream os;
      os << where << key << " = " << x << " is out of range [" << lo << ", " << hi << "]";
      throw Error(os.str());
    }
    return x;
  };
  auto direction = [&](const std::string& key, const nlohmann::json& v) {
    const std::string s = text(key, v);
    if (s == "push") return Direction::kPush;
    if (s == "pull") return Direction::kPull;
    throw Error(where + key + " = \"" + s + "\": use \"push\" or \"pull\"");
  };
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = *it;
    if (key == "dispatch") p.dispatch = direction(key, v);
    else if (key == "combine") p.combine = direction(key, v);
    else if (key == "signaling") {
      const std::string s = text(key, v);
      if (s == "fence_flag") p.signaling = Signaling::kFenceFlag;
      else if (s == "counter") p.signaling = Signaling::kCounter;
      else if (s == "flag_in_data") p.signaling = Signaling::kFlagInData;
      else if (s == "barrier") p.signaling = Signaling::kBarrier;
      else if (s == "peer_fence_flag") p.signaling = Signaling::kPeerFenceFlag;
      else throw Error(where + "signaling = \"" + s +
                       "\": use fence_flag, counter, flag_in_data, barrier or peer_fence_flag");
    } else if (key == "copy_engine") {
      const std::string s = text(key, v);
      if (s == "tma") p.copy_engine = CopyEngine::kTma;
      else if (s == "ldst") p.copy_engine = CopyEngine::kLdSt;
      else throw Error(where + "copy_engine = \"" + s + "\": use tma or ldst");
    } else if (key == "phases") {
      const std::string s = text(key, v);
      if (s == "layer") p.phases = Phases::kLayer;
      else if (s == "dispatch") p.phases = Phases::kDispatch;
      else if (s == "combine") p.phases = Phases::kCombine;
      else throw Error(where + "phases = \"" + s + "\": use layer, dispatch or combine");
    } else if (key == "chunk_tokens") p.chunk_tokens = integer(key, v, 1, int64_t{1} << 24);
    else if (key == "comm_sms") p.comm_sms = static_cast<int>(integer(key, v, 1, 4096));
    else if (key == "signal_threads") p.signal_threads = static_cast<int>(integer(key, v, 1, 4096));
    else if (key == "poll_interval_ns") p.poll_interval_ns = integer(key, v, 1, 100000000);
    else if (key == "gemm_tile_rows") p.gemm_tile_rows = integer(key, v, 1, 65536);
    else if (key == "dispatch_dtype") {
      const std::string s = text(key, v);
      if (s == "bf16") p.dispatch_bytes_per_element = 2;
      else if (s == "fp8") p.dispatch_bytes_per_element = 1;
      else throw Error(where + "dispatch_dtype = \"" + s + "\": use bf16 or fp8");
    } else if (key == "dispatch_dedup") {
      if (!v.is_boolean()) throw Error(where + key + " must be true or false");
      p.dispatch_dedup = v.get<bool>();
    } else if (key == "combine_reduce_per_rank") {
      if (!v.is_boolean()) throw Error(where + key + " must be true or false");
      p.combine_reduce_per_rank = v.get<bool>();
    } else if (key == "push_order") {
      const std::string s = text(key, v);
      if (s == "per_peer") p.push_row_order = false;
      else if (s == "row_order") p.push_row_order = true;
      else throw Error(where + "push_order = \"" + s + "\": use per_peer or row_order");
    } else {
      throw Error(where + key + " is unknown; known: dispatch, combine, signaling, copy_engine, phases, " +
                  "chunk_tokens, comm_sms, signal_threads, poll_interval_ns, gemm_tile_rows, dispatch_dtype, dispatch_dedup, " +
                  "combine_reduce_per_rank, push_order");
    }
  }
  return p;
}

nlohmann::json protocol_to_json(const ProtocolConfig& p) {
  nlohmann::json j{{"dispatch", to_string(p.dispatch)},
                        {"combine", to_string(p.combine)},
                        {"signaling", to_string(p.signaling)},
                        {"copy_engine", p.copy_engine == CopyEngine::kTma ? "tma" : "ldst"},
                        {"phases", to_string(p.phases)},
                        {"chunk_tokens", p.chunk_tokens},
                        {"comm_sms", p.comm_sms},
                        {"signal_threads", p.signal_threads},
                        {"poll_interval_ns", p.poll_interval_ns},
                        {"gemm_tile_rows", p.gemm_tile_rows},
                        {"dispatch_dtype", p.dispatch_bytes_per_element == 1 ? "fp8" : "bf16"},
                        {"dispatch_dedup", p.dispatch_dedup},
                        {"combine_reduce_per_rank", p.combine_reduce_per_rank}};
  // Written only when not the default, so that outputs of per_peer runs keep their bytes.
  if (p.push_row_order) j["push_order"] = "row_order";
  return j;
}

}  // namespace mok::sim
