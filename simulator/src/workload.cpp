// Workload construction from topk_experts (validated, each expert's rows counted), and routing generators.
#include "mok/sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "mok/reference/parallel.hpp"
#include "mok/sim/error.hpp"
#include "mok/sim/rng.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace mok::sim {

namespace {
// Adds each expert's slots among slots[0, n) to count[] (-1: empty).
void count_slots(const int32_t* slots, int64_t n, int32_t* count) {
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0) ++count[slots[i]];
}

// w.expert_offsets from counts per piece of work (piece-major, E each): each expert's routed
// slots as an exclusive prefix sum, which is what spec::build_routing_plan's offsets are. Sums of
// integers, so their order changes nothing. The plan's row lists are not built: the engine cuts
// tiles from per-(chunk, expert) run counts kept with its pieces (layer_sim.cpp), which saves the
// lists' counting sort over every slot (37.7 M at 576 GPUs, 14 % of an NVL72 Monte-Carlo trial);
// the runs take nearly as much memory there (~244 MB by our arithmetic, against the lists' 302
// MB; peak RSS of mok-sim-bench racks8 fell 900 -> 846 MB).
void offsets_from_counts(Workload& w, const std::vector<int32_t>& counts) {
  const int64_t E = w.cfg.num_experts;
  const int64_t items = static_cast<int64_t>(counts.size()) / std::max<int64_t>(E, 1);
  w.expert_offsets.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = 0;
    for (int64_t i = 0; i < items; ++i) n += counts[i * E + e];
    w.expert_offsets[e + 1] = w.expert_offsets[e] + n;
  }
}

// w.expert_offsets from w.topk_experts (valid; cfg validated too).
void count_expert_rows(Workload& w) {
  std::vector<int32_t> counts(static_cast<size_t>(w.cfg.num_experts), 0);
  count_slots(w.topk_experts.data(), w.cfg.num_slots(), counts.data());
  offsets_from_counts(w, counts);
}
}  // namespace

Workload Workload::from_topk(const spec::LayerConfig& cfg, std::vector<int32_t> topk_experts,
                             std::string description) {
  const spec::Status cfg_status = cfg.validate();
  if (!cfg_status.ok) throw Error(std::string("layer: ") + cfg_status.message);
  if (static_cast<int64_t>(topk_experts.size()) != cfg.num_slots()) {
    std::ostringstream os;
    os << "topk_experts has " << topk_experts.size() << " entries but R*T*K = " << cfg.num_slots();
    throw Error(os.str());
  }
  int64_t bad_token = -1, bad_slot = -1;
  const spec::Status st = spec::validate_routing(cfg, topk_experts.data(), &bad_token, &bad_slot);
  if (!st.ok) {
    std::ostringstream os;
    os << st.message << " (global token " << bad_token << ", slot " << bad_slot << ", expert id "
       << topk_experts[bad_token * cfg.top_k + bad_slot] << ")";
    throw Error(os.str());
  }
  Workload w;
  w.cfg = cfg;
  w.topk_experts = std::move(topk_experts);
  w.description = std::move(description);
  count_expert_rows(w);
  return w;
}

namespace {

// Walker's alias table for O(1) weighted draws; built with a fixed visiting order.
struct AliasTable {
  std::vector<double> prob;
  std::vector<int32_t> alias;
  explicit AliasTable(const std::vector<double>& weights) {
    const size_t n = weights.size();
    prob.assign(n, 0);
    alias.assign(n, 0);
    double total = 0;
    for (double w : weights) total += w;
    std::vector<double> scaled(n);
    std::vector<int32_t> small, large;
    for (size_t i = 0; i < n; ++i) {
      scaled[i] = weights[i] * static_cast<double>(n) / total;
      (scaled[i] < 1.0 ? small : large).push_back(static_cast<int32_t>(i));
    }
    while (!small.empty() && !large.empty()) {
      const int32_t s = small.back(), l = large.back();
      small.pop_back();
      prob[s] = scaled[s];
      alias[s] = l;
      scaled[l] = (scaled[l] + scaled[s]) - 1.0;
      if (scaled[l] < 1.0) {
        large.pop_back();
        small.push_back(l);
      }
    }
    for (int32_t i : large) prob[i] = 1.0;
    for (int32_t i : small) prob[i] = 1.0;
    finish();
  }
  // The same draws as `rng.uniform() < prob[i] ? i : alias[i]`, compared in integers:
  // uniform() is m * 2^-53 with m = next_u64() >> 11, and m * 2^-53 < p exactly when m <
  // ceil(p * 2^53) (p * 2^53 is exact: a power-of-two scaling of p in [0, 1]).
  void finish() {
    cut.resize(prob.size());
    for (size_t i = 0; i < prob.size(); ++i) cut[i] = static_cast<uint64_t>(std::ceil(prob[i] * 0x1.0p53));
  }
  // Branch-free: whether the cut is passed is a coin flip for many entries of a skewed table,
  // so a branch here would be mispredicted often; both candidates are read and one is selected
  // by a mask (the same result as the conditional; the RNG is called in the same order).
  int32_t draw(Rng& rng) const {
    const uint64_t i = rng.below(cut.size());
    const uint64_t m = rng.next_u64() >> 11;
    const int32_t keep = -static_cast<int32_t>(m < cut[i]);  // all ones when i itself is drawn
    return (static_cast<int32_t>(i) & keep) | (alias[i] & ~keep);
  }
  std::vector<uint64_t> cut;
};

std::vector<double> global_popularity(const spec::LayerConfig& cfg, const RoutingSpec& s, Rng& rng) {
  const int64_t E = cfg.num_experts;
  std::vector<double> p(E, 1.0);
  switch (s.kind) {
    case RoutingKind::kUniform:
      break;
    case RoutingKind::kPowerLaw:
      for (int64_t e = 0; e < E; ++e) p[e] = 1.0 / std::pow(static_cast<double>(e + 1), s.exponent);
      break;
    case RoutingKind::kHot:
      for (int64_t e = 0; e < std::min(E, s.num_hot); ++e) p[e] = s.hot_factor;
      break;
    case RoutingKind::kDirichlet:
      for (int64_t e = 0; e < E; ++e) p[e] = std::max(rng.gamma(s.alpha), 1e-300);
      break;
    case RoutingKind::kTopkFile:
    case RoutingKind::kGolden:
      break;
  }
  if (s.shuffle_experts && s.kind != RoutingKind::kUniform && s.kind != RoutingKind::kDirichlet) {
    for (int64_t i = E - 1; i > 0; --i) std::swap(p[i], p[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  return p;
}

std::vector<int32_t> read_topk_file(const spec::LayerConfig& cfg, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("/workload/topk_file '" + path + "' is a directory; give the raw int32 topk_experts file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw Error("/workload/topk_file '" + path + "' cannot be opened; check the path (a relative path is read from " +
                "the current folder)");
  const auto size = static_cast<int64_t>(in.tellg());
  if (size != cfg.num_slots() * 4) {
    std::ostringstream os;
    os << "/workload/topk_file '" << path << "' has " << size << " bytes; R*T*K*4 = " << cfg.num_slots() * 4
       << " bytes expected (raw little-endian int32 topk_experts in global token order)";
    throw Error(os.str());
  }
  std::vector<int32_t> topk(cfg.num_slots());
  in.seekg(0);
  in.read(reinterpret_cast<char*>(topk.data()), size);
  return topk;
}

// One rank's rejection sampling (generate_workload's ORDER), as a state that can be advanced
// in pieces.
struct RankFill {
  int32_t* slots;     // the rank's T x K slots
  int64_t count;      // T x K
  int64_t next_slot;  // slots [0, next_slot) are accepted
  int64_t filled;     // accepted slots of the current token
  int rejected;       // consecutive rejections for slot next_slot
  char* taken;        // per expert: in the current token (all zero between tokens)
};

// The exact draw after the 64th rejection in a row: one uniform from rng over the free mass.
void exact_draw(RankFill& st, Rng& rng, const std::vector<double>& p) {
  const int64_t E = static_cast<int64_t>(p.size());
  int32_t e = -1;
  double free_mass = 0;
  for (int64_t x = 0; x < E; ++x) free_mass += st.taken[x] ? 0.0 : p[x];
  double u = rng.uniform() * free_mass;
  for (int64_t x = 0; x < E; ++x) {
    if (st.taken[x] || p[x] <= 0) continue;
    e = static_cast<int32_t>(x);
    u -= p[x];
    if (u < 0) break;
  }
  st.taken[e] = 1;
  st.slots[st.next_slot++] = e;
  ++st.filled;
  st.rejected = 0;
}

// A token is complete: its experts are no longer taken, then its empty-slot draws.
void end_token(RankFill& st, Rng& rng, int64_t K, double empty_fraction) {
  int32_t* row = st.slots + st.next_slot - K;
  for (int64_t k = 0; k < K; ++k) st.taken[row[k]] = 0;
  st.filled = 0;
  if (empty_fraction > 0)
    for (int64_t k = 0; k < K; ++k)
      if (rng.uniform() < empty_fraction) row[k] = -1;
}

// Continues st until the rank is complete, drawing from rng. One flat loop over the rank's
// slots that does not branch on whether a draw repeats an expert (unpredictable under skewed
// popularity): a rejected candidate is written into the open slot and overwritten by the next
// draw, and marking an already taken expert taken changes nothing. (Measured: the nested
// per-token, per-slot loops cost about as much as generating the draws, in mispredicted loop
// exits.) The state is in locals: a store to the char table would make the compiler reload
// members of st.
void fill_rank(RankFill& st, Rng& rng, const AliasTable& table, const std::vector<double>& p, int64_t K,
               double empty_fraction) {
  int32_t* const rank_slots = st.slots;
  char* const taken = st.taken;
  const int64_t rank_slot_count = st.count;
  int64_t next_slot = st.next_slot, filled = st.filled;
  int rejected = st.rejected;
  while (next_slot < rank_slot_count) {
    const int32_t c = table.draw(rng);
    const int repeat = taken[c];  // 0 or 1
    rank_slots[next_slot] = c;
    taken[c] = 1;
    next_slot += 1 - repeat;
    filled += 1 - repeat;
    // Arithmetic rather than `repeat ? rejected + 1 : 0`, which the compiler turns back into
    // a branch on the repeat.
    rejected = (rejected + 1) * repeat;
    if (rejected == 64) [[unlikely]] {
      st.next_slot = next_slot;
      st.filled = filled;
      st.rejected = rejected;
      exact_draw(st, rng, p);
      next_slot = st.next_slot;
      filled = st.filled;
      rejected = st.rejected;
    }
    if (filled == K) {  // the token is complete
      st.next_slot = next_slot;
      end_token(st, rng, K, empty_fraction);
      filled = 0;
    }
  }
  st.next_slot = next_slot;
  st.filled = filled;
  st.rejected = rejected;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MOK_SIM_X4 1
bool x4_supported() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

// Rng::next_u64 on four lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i next_x4(__m256i& s0, __m256i& s1, __m256i& s2,
                                                                      __m256i& s3) {
  const __m256i x5 = _mm256_add_epi64(_mm256_slli_epi64(s1, 2), s1);
  const __m256i r7 = _mm256_or_si256(_mm256_slli_epi64(x5, 7), _mm256_srli_epi64(x5, 57));
  const __m256i result = _mm256_add_epi64(_mm256_slli_epi64(r7, 3), r7);
  const __m256i t = _mm256_slli_epi64(s1, 17);
  s2 = _mm256_xor_si256(s2, s0);
  s3 = _mm256_xor_si256(s3, s1);
  s1 = _mm256_xor_si256(s1, s2);
  s0 = _mm256_xor_si256(s0, s3);
  s2 = _mm256_xor_si256(s2, t);
  s3 = _mm256_or_si256(_mm256_slli_epi64(s3, 45), _mm256_srli_epi64(s3, 19));
  return result;
}

// Four streams' candidates side by side: xoshiro256** on four 64-bit lanes (the same
// arithmetic as Rng::next_u64, lane by lane), and per candidate what AliasTable::draw takes
// from its two numbers: the index below(n) = high 64 bits of u * n (n < 2^32: (hi(u) * n +
// (lo(u) * n >> 32)) >> 32, exact), and m = u' >> 11. Output lane-minor: idx[j * 4 + lane].
__attribute__((target("avx2"))) void draw_x4(uint64_t state[4][4], uint64_t n, int count, uint64_t* idx,
                                             uint64_t* m) {
  __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state[0]));
  __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state[1]));
  __m256i s2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state[2]));
  __m256i s3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state[3]));
  const __m256i nv = _mm256_set1_epi64x(static_cast<int64_t>(n));
  for (int j = 0; j < count; ++j) {
    const __m256i u = next_x4(s0, s1, s2, s3);
    const __m256i lo = _mm256_mul_epu32(u, nv);
    const __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(u, 32), nv);
    const __m256i i = _mm256_srli_epi64(_mm256_add_epi64(hi, _mm256_srli_epi64(lo, 32)), 32);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + 4 * j), i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(m + 4 * j), _mm256_srli_epi64(next_x4(s0, s1, s2, s3), 11));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(state[0]), s0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(state[1]), s1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(state[2]), s2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(state[3]), s3);
}

// fill_rank()'s loop over one lane's block of candidates, for K = 2^k_shift; stops when the rank
// is complete, the block is used up, or at the 64th rejection in a row (st.rejected == 64 on
// return, before the exact draw). Returns the candidates used. Here an expert is taken when its
// stamp is the current token's, next_slot / K + 1 (`stamp` all zero at the rank's start), so
// nothing is cleared when a token is complete and no branch depends on where tokens end:
// the loop carries only next_slot and the rejection count. st.taken stays all zero.
__attribute__((noinline)) int fill_block(RankFill& st, uint32_t* stamp, const AliasTable& table, const uint64_t* idx,
                                         const uint64_t* m, int lane, int count, int k_shift) {
  int32_t* const rank_slots = st.slots;
  const uint64_t* const cut = table.cut.data();
  const int32_t* const alias = table.alias.data();
  const int64_t rank_slot_count = st.count;
  int64_t next_slot = st.next_slot;
  int rejected = st.rejected;
  const int64_t k_mask = (int64_t{1} << k_shift) - 1;
  // The current token's stamp, kept in a register and advanced by a branch when a token is
  // complete (about once per K + rejections candidates, so predicted "not yet"): the loop's
  // carried chain is then next_slot's add alone, where deriving the stamp from next_slot put a
  // shift, an add and the compare on it. A token's first candidate is never a repeat (no stamp
  // equals a new token's), so "the accepted candidate filled slot K-1" is the test.
  uint32_t token = static_cast<uint32_t>(next_slot >> k_shift) + 1;
  int j = 0;
  while (j < count && next_slot < rank_slot_count) {
    const uint64_t i = idx[4 * j + lane];
    const int32_t keep = -static_cast<int32_t>(m[4 * j + lane] < cut[i]);  // as AliasTable::draw
    const int32_t c = (static_cast<int32_t>(i) & keep) | (alias[i] & ~keep);
    ++j;
    const int repeat = stamp[c] == token;
    rank_slots[next_slot] = c;
    stamp[c] = token;
    next_slot += 1 - repeat;
    rejected = (rejected + 1) & -repeat;
    if (rejected == 64) [[unlikely]]
      break;
    if ((next_slot & k_mask) == 0 && !repeat) ++token;
  }
  st.next_slot = next_slot;
  st.filled = next_slot & ((int64_t{1} << k_shift) - 1);
  st.rejected = rejected;
  return j;
}

// Ranks first_rank .. first_rank + 3 (no skew, no empty slots): the candidates of their four
// streams are drawn in blocks by draw_x4, and each rank takes from its lane what fill_rank
// would have drawn. A rank that needs the exact draw gets its stream back as an Rng at that
// point (the block's starting state, advanced by the numbers its lane used) and finishes in
// fill_rank.
void fill_ranks_x4(RankFill st[4], uint64_t seed, uint64_t first_rank, const AliasTable& table,
                   const std::vector<double>& p, int64_t K) {
  constexpr int kBlock = 256;
  alignas(32) uint64_t idx[4 * kBlock], m[4 * kBlock];
  uint64_t state[4][4], block_start[4][4];  // [word][lane]
  const int64_t E = static_cast<int64_t>(p.size());
  std::vector<uint32_t> stamps(4 * E, 0);
  const int k_shift = __builtin_ctzll(static_cast<uint64_t>(K));
  bool live[4];
  int num_live = 0;
  for (int lane = 0; lane < 4; ++lane) {
    uint64_t words[4];
    Rng::derive(seed, 1 + first_rank + static_cast<uint64_t>(lane)).state(words);
    for (int k = 0; k < 4; ++k) state[k][lane] = words[k];
    live[lane] = st[lane].count > 0;
    num_live += live[lane];
  }
  const uint64_t n = table.cut.size();
  while (num_live > 0) {
    std::copy(&state[0][0], &state[0][0] + 16, &block_start[0][0]);
    draw_x4(state, n, kBlock, idx, m);
    for (int lane = 0; lane < 4; ++lane) {
      if (!live[lane]) continue;
      RankFill& f = st[lane];
      const int used = fill_block(f, &stamps[lane * E], table, idx, m, lane, kBlock, k_shift);
      if (f.rejected == 64) {
        // The byte table as fill_rank keeps it: the current token's accepted experts.
        for (int64_t k = f.next_slot - f.filled; k < f.next_slot; ++k) f.taken[f.slots[k]] = 1;
        const uint64_t words[4] = {block_start[0][lane], block_start[1][lane], block_start[2][lane],
                                   block_start[3][lane]};
        Rng rng = Rng::from_state(words);
        for (int k = 0; k < 2 * used; ++k) rng.next_u64();
        exact_draw(f, rng, p);
        if (f.filled == K) end_token(f, rng, K, 0.0);
        fill_rank(f, rng, table, p, K, 0.0);
      }
      if (f.next_slot == f.count) {
        live[lane] = false;
        --num_live;
      }
    }
  }
}
#endif

}  // namespace

Workload generate_workload(const spec::LayerConfig& cfg, const RoutingSpec& s, int threads) {
  WorkloadBuffers buffers;
  generate_workload(cfg, s, buffers, threads);
  return std::move(buffers.workload);
}

const Workload& generate_workload(const spec::LayerConfig& cfg, const RoutingSpec& s, WorkloadBuffers& buffers,
                                  int threads) {
  const spec::Status cfg_status = cfg.validate();
  if (!cfg_status.ok) throw Error(std::string("layer: ") + cfg_status.message);
  if (s.kind == RoutingKind::kTopkFile) {
    std::vector<int32_t> topk = read_topk_file(cfg, s.topk_file);  // its errors name the file
    try {
      buffers.workload = Workload::from_topk(cfg, std::move(topk), "topk_file " + s.topk_file);
    } catch (const Error& e) {
      // The routing's own errors (an expert id out of range, a repeated expert) name the token
      // and slot; the file and the field say where to fix them.
      throw Error("/workload/topk_file '" + s.topk_file + "': " + e.what() +
                      "; fix the file (raw little-endian int32 topk_experts[R*T*K] in global token order) or the layer",
                  e.kind());
    }
    return buffers.workload;
  }
  if (s.kind == RoutingKind::kGolden)
    throw Error("workload.kind golden: this library does not read HDF5; the mok-sim CLI reads golden files "
                "(in code: mok::ref::read_golden, then Workload::from_topk, then run_points(..., &workload))",
                ErrorKind::kUnsupported);
  Rng rng = Rng::derive(s.seed, 0);
  const std::vector<double> p_global = global_popularity(cfg, s, rng);
  const int64_t E = cfg.num_experts, K = cfg.top_k, R = cfg.num_ranks, T = cfg.tokens_per_rank;
  Workload& w = buffers.workload;
  w.cfg = cfg;
  // Every slot is written below, so reused storage needs no clearing.
  std::vector<int32_t>& topk = w.topk_experts;
  topk.resize(cfg.num_slots());
  // Each token's K distinct experts: draw with replacement and reject repeats (the same law as
  // successive sampling without replacement); after 64 rejections in a row for one slot, an
  // exact scan of the free mass. ORDER: per rank, from its own stream Rng::derive(seed, 1 +
  // rank): the rank's skew draws (per_rank_skew > 0), then its tokens in order, each token's
  // slots in order 0..K-1, one alias draw per iteration; per finished token, its empty-slot
  // draws. fill_rank() is that loop; without skew and empty slots, ranks go four at a time
  // (fill_ranks_x4), which draws the same numbers from the same streams. Every rank writes only
  // its own slots from its own stream, so with threads > 1 the ranks (or groups of four) are
  // dealt to threads (ref::parallel_for), each piece of work with its own taken table: the same
  // routing.
  const int workers = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(R, 1)));
  // Each piece of work also counts its ranks' slots per expert while they are still in cache
  // (int32: at most R*T*K < 2^31 slots); the sum gives expert_offsets.
  std::vector<int32_t> item_counts;
  if (s.per_rank_skew == 0 && s.empty_slot_fraction == 0) {
    int64_t positive = 0;
    for (double x : p_global) positive += x > 0;
    if (positive < K) throw Error("workload: fewer than K experts have positive popularity");
    const AliasTable table(p_global);
    int64_t groups = 0;  // ranks 0 .. 4 * groups - 1 go four at a time
#if MOK_SIM_X4
    // fill_block needs K a power of two and per-rank slot indices below 2^32 (its stamps).
    if (x4_supported() && (K & (K - 1)) == 0 && T * K < (int64_t{1} << 32)) groups = R / 4;
#endif
    const int64_t first_scalar = 4 * groups;
    const int64_t items = groups + (R - first_scalar);
    item_counts.assign(static_cast<size_t>(items * E), 0);
    ref::parallel_for(items, workers, [&](int64_t begin, int64_t end) {
      std::vector<char> taken(4 * E, 0);  // [lane][expert]; all zero between ranks
      for (int64_t i = begin; i < end; ++i) {
#if MOK_SIM_X4
        if (i < groups) {
          RankFill st[4];
          for (int lane = 0; lane < 4; ++lane)
            st[lane] = RankFill{&topk[(4 * i + lane) * T * K], T * K, 0, 0, 0, &taken[lane * E]};
          fill_ranks_x4(st, s.seed, static_cast<uint64_t>(4 * i), table, p_global, K);
          count_slots(&topk[4 * i * T * K], 4 * T * K, &item_counts[i * E]);
          continue;
        }
#endif
        const int64_t r = first_scalar + (i - groups);
        Rng rank_rng = Rng::derive(s.seed, 1 + static_cast<uint64_t>(r));
        RankFill st{&topk[r * T * K], T * K, 0, 0, 0, taken.data()};
        fill_rank(st, rank_rng, table, p_global, K, 0.0);
        count_slots(&topk[r * T * K], T * K, &item_counts[i * E]);
      }
    });
  } else {
    item_counts.assign(static_cast<size_t>(R * E), 0);
    ref::parallel_for(R, workers, [&](int64_t begin, int64_t end) {
      std::vector<char> taken(E, 0);  // all zero between ranks
      for (int64_t r = begin; r < end; ++r) {
        Rng rank_rng = Rng::derive(s.seed, 1 + static_cast<uint64_t>(r));
        std::vector<double> p = p_global;
        if (s.per_rank_skew > 0) {
          std::vector<double> local(E);
          double total = 0;
          for (int64_t e = 0; e < E; ++e) total += (local[e] = rank_rng.gamma(0.2));
          for (int64_t e = 0; e < E; ++e)
            p[e] = (1.0 - s.per_rank_skew) * p_global[e] + s.per_rank_skew * (local[e] / total);
        }
        // Experts with zero weight can never be drawn; successive sampling needs K positive ones.
        int64_t positive = 0;
        for (double x : p) positive += x > 0;
        if (positive < K) throw Error("workload: fewer than K experts have positive popularity");
        const AliasTable table(p);
        RankFill st{&topk[r * T * K], T * K, 0, 0, 0, taken.data()};
        fill_rank(st, rank_rng, table, p, K, s.empty_slot_fraction);
        count_slots(&topk[r * T * K], T * K, &item_counts[r * E]);
      }
    });
  }
  // Valid by construction (K distinct experts in range per row, or -1), so the per-row check of
  // from_topk() is skipped; the workload tests run it on generated routing.
  w.description = routing_spec_to_json(s).dump();
  offsets_from_counts(w, item_counts);
  return w;
}

namespace {
const char* kind_name(RoutingKind k) {
  switch (k) {
    case RoutingKind::kUniform: return "uniform";
    case RoutingKind::kPowerLaw: return "power_law";
    case RoutingKind::kHot: return "hot";
    case RoutingKind::kDirichlet: return "dirichlet";
    case RoutingKind::kTopkFile: return "topk_file";
    case RoutingKind::kGolden: return "golden";
  }
  return "?";
}
}  // namespace

nlohmann::json routing_spec_to_json(const RoutingSpec& s) {
  nlohmann::json j{{"kind", kind_name(s.kind)}};
  // A routing read from a file draws nothing: its echo carries no seed.
  if (s.kind != RoutingKind::kTopkFile && s.kind != RoutingKind::kGolden) j["seed"] = s.seed;
  switch (s.kind) {
    case RoutingKind::kPowerLaw: j["exponent"] = s.exponent; break;
    case RoutingKind::kHot: j["num_hot"] = s.num_hot; j["hot_factor"] = s.hot_factor; break;
    case RoutingKind::kDirichlet: j["alpha"] = s.alpha; break;
    case RoutingKind::kTopkFile: j["topk_file"] = s.topk_file; break;
    case RoutingKind::kGolden: j["file"] = s.golden_file; break;
    default: break;
  }
  if (s.per_rank_skew > 0) j["per_rank_skew"] = s.per_rank_skew;
  if (s.empty_slot_fraction > 0) j["empty_slot_fraction"] = s.empty_slot_fraction;
  if (!s.shuffle_experts) j["shuffle_experts"] = false;
  return j;
}

RoutingSpec routing_spec_from_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object()) throw Error(origin + ": \"workload\" must be an object like {\"kind\": \"uniform\"}");
  RoutingSpec s;
  const std::string where = origin + ": workload.";
  auto number = [&](const char* key, double lo, double hi) {
    const auto& v = doc.at(key);
    if (!v.is_number()) throw Error(where + key + " must be a number");
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      std::ostringstream os;
      os << where << key << " = " << x << " is out of range [" << lo << ", " << hi << "]";
      throw Error(os.str());
    }
    return x;
  };
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    if (key == "kind") {
      const std::string k = it->is_string() ? it->get<std::string>() : "";
      if (k == "uniform") s.kind = RoutingKind::kUniform;
      else if (k == "power_law" || k == "zipf") s.kind = RoutingKind::kPowerLaw;
      else if (k == "hot") s.kind = RoutingKind::kHot;
      else if (k == "dirichlet") s.kind = RoutingKind::kDirichlet;
      else if (k == "topk_file") s.kind = RoutingKind::kTopkFile;
      else if (k == "golden") s.kind = RoutingKind::kGolden;
      else throw Error(where + "kind must be one of uniform, power_law (alias zipf), hot, dirichlet, topk_file, golden");
    } else if (key == "exponent") {
      s.exponent = number("exponent", 0, 10);
    } else if (key == "num_hot") {
      const double n = number("num_hot", 1, 1 << 20);
      if (n != static_cast<double>(static_cast<int64_t>(n))) throw Error(where + "num_hot must be a whole number of experts");
      s.num_hot = static_cast<int64_t>(n);
    } else if (key == "hot_factor") {
      s.hot_factor = number("hot_factor", 1e-6, 1e9);
    } else if (key == "alpha") {
      s.alpha = number("alpha", 1e-3, 1e6);
    } else if (key == "per_rank_skew") {
      s.per_rank_skew = number("per_rank_skew", 0, 1);
    } else if (key == "empty_slot_fraction") {
      s.empty_slot_fraction = number("empty_slot_fraction", 0, 1);
    } else if (key == "shuffle_experts") {
      if (!it->is_boolean()) throw Error(where + "shuffle_experts must be true or false");
      s.shuffle_experts = it->get<bool>();
    } else if (key == "seed") {
      if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0))
        throw Error(where + "seed must be a non-negative integer");
      s.seed = it->get<uint64_t>();
    } else if (key == "topk_file") {
      if (!it->is_string()) throw Error(where + "topk_file must be a path string");
      s.topk_file = it->get<std::string>();
    } else if (key == "file") {
      if (!it->is_string()) throw Error(where + "file must be the path of a golden file (mok-golden v1, HDF5)");
      s.golden_file = it->get<std::string>();
    } else {
      throw Error(where + key + " is unknown; known: kind, exponent, num_hot, hot_factor, alpha, per_rank_skew, " +
                  "empty_slot_fraction, shuffle_experts, seed, topk_file, file (golden)");
    }
  }
  if (s.kind == RoutingKind::kTopkFile && s.topk_file.empty())
    throw Error(where + "topk_file is required when kind is topk_file");
  if (s.kind == RoutingKind::kGolden && s.golden_file.empty())
    throw Error(where + "file is required when kind is golden (a mok-golden v1 HDF5 file)");
  return s;
}

LoadStats load_stats(const std::vector<int64_t>& counts) {
  LoadStats st;
  if (counts.empty()) return st;
  std::vector<int64_t> v(counts);
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  double sum = 0, weighted = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    sum += static_cast<double>(v[i]);
    weighted += static_cast<double>(i + 1) * static_cast<double>(v[i]);
  }
  st.mean = sum / n;
  st.max = static_cast<double>(v.back());
  // Nearest-rank p99.
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * n));
  st.p99 = static_cast<double>(v[std::max<size_t>(rank, 1) - 1]);
  st.gini = sum > 0 ? (2.0 * weighted) / (n * sum) - (n + 1.0) / n : 0.0;
  st.max_over_mean = st.mean > 0 ? st.max / st.mean : 0.0;
  return st;
}

}  // namespace mok::sim
