// Tests of golden file I/O: bitwise round trips, reproducible bytes, atomicity, malformed files.
#include "malformed.hpp"
#include "test_support.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/golden.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <rapidcheck/gtest.h>
#include <csignal>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <thread>

namespace mok::ref {
namespace {

namespace fs = std::filesystem;

// A fresh empty folder per call, removed by the caller's ScratchDir.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = fs::path(::testing::TempDir()) /
            ("mok_golden_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Writes `golden` as dir/name and opens that file for editing (the caller closes it): for tests
// that damage a valid file in one place.
hid_t write_and_open(const ScratchDir& dir, const std::string& name, const Golden& golden) {
  write_golden(dir.file(name), golden);
  return H5Fopen(dir.file(name).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

spec::LayerConfig make_config(int64_t H, int64_t I, int64_t Is, int64_t E, int64_t K, int64_t R,
                              int64_t T) {
  spec::LayerConfig cfg;
  cfg.hidden = H;
  cfg.intermediate = I;
  cfg.shared_intermediate = Is;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.num_ranks = R;
  cfg.tokens_per_rank = T;
  return cfg;
}

// Large enough that the routed weights (and their grads) are chunked and compressed.
spec::LayerConfig chunked_config() { return make_config(256, 128, 64, 8, 2, 2, 16); }

// Empty string when equal, else the first difference.
std::string compare_goldens(const Golden& a, const Golden& b) {
  if (a.meta.generator != b.meta.generator ||
      a.meta.generator_version != b.meta.generator_version || a.meta.seed != b.meta.seed ||
      a.meta.profile != b.meta.profile || a.meta.mma_model != b.meta.mma_model ||
      a.meta.routing != b.meta.routing) {
    return "meta differs";
  }
  const spec::LayerConfig& x = a.cfg;
  const spec::LayerConfig& y = b.cfg;
  if (x.hidden != y.hidden || x.intermediate != y.intermediate ||
      x.shared_intermediate != y.shared_intermediate || x.num_experts != y.num_experts ||
      x.top_k != y.top_k || x.num_ranks != y.num_ranks || x.tokens_per_rank != y.tokens_per_rank) {
    return "config differs";
  }
  if (a.tensors.size() != b.tensors.size()) {
    return "tensor count " + std::to_string(a.tensors.size()) + " vs " +
           std::to_string(b.tensors.size());
  }
  for (const auto& [path, t] : a.tensors) {
    const auto it = b.tensors.find(path);
    if (it == b.tensors.end()) return path + " missing";
    const Tensor& u = it->second;
    if (t.dtype() != u.dtype() || t.shape() != u.shape()) return path + " dtype/shape differ";
    if (std::memcmp(t.raw(), u.raw(), t.size_bytes()) != 0) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (t.bits_at(i) != u.bits_at(i)) {
          return path + " element " + std::to_string(i) + ": " + std::to_string(t.bits_at(i)) +
                 " vs " + std::to_string(u.bits_at(i));
        }
      }
    }
  }
  return "";
}

// A float's bits, often a special one: +-0, a subnormal, +-infinity or a NaN with a random
// payload, else any pattern at all (mostly normal numbers).
uint32_t special_float_bits(std::mt19937_64& rng) {
  const uint32_t sign = static_cast<uint32_t>(rng()) & 0x80000000u;
  const uint32_t mantissa = (static_cast<uint32_t>(rng()) & 0x7fffffu) | 1u;  // nonzero
  switch (rng() % 5) {
    case 0: return sign;                             // +-0
    case 1: return sign | mantissa;                  // subnormal
    case 2: return sign | 0x7f800000u;               // +-infinity
    case 3: return sign | 0x7f800000u | mantissa;    // NaN
    default: return static_cast<uint32_t>(rng());
  }
}

// Bits drawn by special_float_bits until `accepted` takes the value they hold.
template <class Accepted>
uint32_t float_bits_where(std::mt19937_64& rng, Accepted&& accepted) {
  for (;;) {
    const uint32_t bits = special_float_bits(rng);
    if (accepted(std::bit_cast<float>(bits))) return bits;
  }
}

// Overwrites every tensor but the inputs (which the reader refuses unless finite and routed in
// range) with bit patterns that must survive the round trip bit for bit. Outputs, gradients
// and intermediates get arbitrary bytes (NaN payloads, infinities, subnormals, -0). Stored bounds
// get what the reader's check_bound_values accepts, specials included: a radius or sum of |terms|
// is NaN (not sampled; any sign and payload) or finite and >= 0 (-0 and subnormals too); an
// oracle value is finite where its radius is a number, anything where its radius is NaN.
void scramble_all_but_inputs(Golden& golden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto radius_accepted = [](float x) { return std::isnan(x) || (x >= 0 && std::isfinite(x)); };
  const auto finite = [](float x) { return std::isfinite(x); };
  // Oracle values in a second pass: what one may hold depends on its radius.
  for (const bool oracle_values : {false, true}) {
    for (auto& [path, t] : golden.tensors) {
      if (path.rfind("inputs/", 0) == 0) continue;
      const Role role = find_spec(path)->role;
      const bool oracle_value = role == Role::kBoundExact || role == Role::kEndToEndExact;
      if (oracle_value != oracle_values) continue;
      if (!is_bound_role(role)) {
        auto* bytes = static_cast<unsigned char*>(t.raw());
        for (size_t i = 0; i < t.size_bytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
        continue;
      }
      const float* radius = nullptr;
      if (oracle_value) {
        const std::string checked = checked_path_of_bound(path);
        const bool e2e = role == Role::kEndToEndExact;
        radius = golden.tensors.at(e2e ? end_to_end_radius_path(checked) : bound_radius_path(checked)).data<float>();
      }
      float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint32_t bits;
        if (!oracle_value)
          bits = float_bits_where(rng, radius_accepted);  // a radius or a sum of |terms|
        else if (std::isnan(radius[i]))
          bits = special_float_bits(rng);  // not sampled: any value
        else
          bits = float_bits_where(rng, finite);
        v[i] = std::bit_cast<float>(bits);
      }
    }
  }
}

// Random small valid configs with fresh random contents, and a random subset of the optional
// groups; write, read back, compare everything bitwise.
RC_GTEST_PROP(GoldenIo, RoundTripIsBitwise, ()) {
  const spec::LayerConfig cfg = test::gen_config();
  RC_ASSERT(cfg.validate().ok);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Golden golden = test::make_random_golden(cfg, seed);
  scramble_all_but_inputs(golden, seed ^ 0x5eed);
  golden.meta.generator = *rc::gen::element<std::string>("mok-golden", "", "h5py script ü");
  golden.meta.generator_version = *rc::gen::element<std::string>("0.1.0 gen-v1", "x");
  golden.meta.routing = *rc::gen::element<std::string>("zipf:1.2,rank-skew:0.5", "");
  for (const char* group : {"outputs/", "grads/", "intermediates/", "bounds/"}) {
    if (*rc::gen::arbitrary<bool>()) {
      // With the tensors go their bounds (bounds of a missing tensor are refused).
      std::erase_if(golden.tensors, [group](const auto& kv) {
        const std::string& p = kv.first;
        return p.rfind(group, 0) == 0 ||
               (p.rfind("bounds/", 0) == 0 && checked_path_of_bound(p).rfind(group, 0) == 0);
      });
    }
  }

  ScratchDir dir;
  const std::string path = dir.file("case.h5");
  write_golden(path, golden);
  const Golden back = read_golden(path);
  const std::string diff = compare_goldens(golden, back);
  RC_LOG() << ref::format_config(cfg) << " seed " << seed << "\n";
  RC_ASSERT(diff == std::string());
  // Nothing but the file itself is left in the folder (no temporary files).
  RC_ASSERT(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST(GoldenIo, ChunkedRoundTripIsBitwise) {
  Golden golden = test::make_random_golden(chunked_config(), 7);
  scramble_all_but_inputs(golden, 8);
  ScratchDir dir;
  write_golden(dir.file("a.h5"), golden);
  const std::string diff = compare_goldens(golden, read_golden(dir.file("a.h5")));
  EXPECT_EQ(diff, "") << "seed 7, config " << chunked_config().hidden;
  // Compression keeps the file below the raw size of the data.
  size_t raw_bytes = 0;
  for (const auto& [path, t] : golden.tensors) raw_bytes += t.size_bytes();
  EXPECT_LT(fs::file_size(dir.file("a.h5")), raw_bytes + (size_t{64} << 10));
}

// Equal content gives equal bytes: across a clock-second boundary (no timestamps), after the
// heap has been dirtied (no uninitialised bytes), and after a read-write cycle.
TEST(GoldenIo, RewriteIsByteIdentical) {
  for (const spec::LayerConfig& cfg : {make_config(32, 16, 16, 4, 2, 2, 3), chunked_config()}) {
    const Golden golden = test::make_random_golden(cfg, 42);
    ScratchDir dir;
    write_golden(dir.file("a.h5"), golden);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    H5garbage_collect();
    {
      std::vector<std::vector<unsigned char>> junk;
      for (int i = 0; i < 20000; ++i)
        junk.emplace_back(static_cast<size_t>(16 + (i * 37) % 4096), 0xA5);
    }
    write_golden(dir.file("b.h5"), golden);
    write_golden(dir.file("c.h5"), read_golden(dir.file("a.h5")));
    const std::string a = read_bytes(dir.file("a.h5"));
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == read_bytes(dir.file("b.h5"))) << "H=" << cfg.hidden << ": rewrite differs";
    EXPECT_TRUE(a == read_bytes(dir.file("c.h5"))) << "H=" << cfg.hidden << ": read-write differs";
  }
}

TEST(GoldenIo, WritesTheDocumentedLayout) {
  const spec::LayerConfig cfg = make_config(32, 16, 0, 4, 2, 2, 3);
  Golden golden = test::make_random_golden(cfg, 3);
  golden.meta.seed = 0xFEEDFACECAFEBEEFull;
  std::erase_if(golden.tensors, [](const auto& kv) {
    const std::string& p = kv.first;
    return p.rfind("grads/", 0) == 0 || (p.rfind("bounds/", 0) == 0 && checked_path_of_bound(p) != "outputs/output");
  });
  ScratchDir dir;
  write_golden(dir.file("a.h5"), golden);

  const hid_t file = H5Fopen(dir.file("a.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  uint64_t seed = 0;
  const hid_t seed_attr = H5Aopen(file, "seed", H5P_DEFAULT);
  ASSERT_GE(H5Aread(seed_attr, H5T_NATIVE_UINT64, &seed), 0);
  EXPECT_EQ(seed, golden.meta.seed);
  H5Aclose(seed_attr);
  int64_t E = 0;
  const hid_t e_attr = H5Aopen_by_name(file, "/config", "E", H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Aread(e_attr, H5T_NATIVE_INT64, &E), 0);
  EXPECT_EQ(E, 4);
  H5Aclose(e_attr);
  // bf16 is stored as native uint16 with dtype="bfloat16".
  const hid_t x = H5Dopen2(file, "/inputs/x", H5P_DEFAULT);
  ASSERT_GE(x, 0);
  const hid_t type = H5Dget_type(x);
  EXPECT_TRUE(H5Tequal(type, H5T_STD_U16LE) > 0);
  H5Tclose(type);
  char dtype[16] = {};
  const hid_t dtype_attr = H5Aopen(x, "dtype", H5P_DEFAULT);
  const hid_t str_type = H5Aget_type(dtype_attr);
  ASSERT_LT(H5Tget_size(str_type), sizeof dtype);
  ASSERT_GE(H5Aread(dtype_attr, str_type, dtype), 0);
  EXPECT_STREQ(dtype, "bfloat16");
  H5Tclose(str_type);
  H5Aclose(dtype_attr);
  H5Dclose(x);
  // No shared datasets when Is = 0, and no empty groups.
  EXPECT_EQ(H5Lexists(file, "/inputs/w_shared_gate", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Lexists(file, "/grads", H5P_DEFAULT), 0);
  EXPECT_GT(H5Lexists(file, "/bounds", H5P_DEFAULT), 0);
  H5Fclose(file);
}

TEST(GoldenIo, LoadOptionsSkipGroups) {
  const Golden golden = test::make_random_golden(make_config(32, 16, 16, 4, 2, 1, 4), 11);
  ScratchDir dir;
  write_golden(dir.file("a.h5"), golden);
  ReadOptions options;
  options.load_intermediates = false;
  options.load_bounds = false;
  const Golden back = read_golden(dir.file("a.h5"), options);
  for (const auto& [path, t] : back.tensors) {
    EXPECT_NE(path.rfind("intermediates/", 0), 0u) << path;
    EXPECT_NE(path.rfind("bounds/", 0), 0u) << path;
  }
  EXPECT_TRUE(back.tensors.count("outputs/output"));
  EXPECT_TRUE(back.tensors.count("grads/d_x"));
}

// h5py writes str attributes as variable-length strings; the reader accepts them.
TEST(GoldenIo, AcceptsVariableLengthStringAttributes) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 0, 2, 1, 1, 2), 5);
  ScratchDir dir;
  const hid_t file = write_and_open(dir, "a.h5", golden);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Adelete(file, "routing"), 0);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, "routing", type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* value = "hot:4";
  ASSERT_GE(H5Awrite(attr, type, &value), 0);
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  H5Fclose(file);
  EXPECT_EQ(read_golden(dir.file("a.h5")).meta.routing, "hot:4");
}

TEST(GoldenIo, EveryMalformedFileGivesOneClearError) {
  for (const spec::LayerConfig& cfg :
       {make_config(32, 16, 16, 4, 2, 2, 3), make_config(16, 16, 0, 2, 1, 1, 2)}) {
    const Golden good = test::make_random_golden(cfg, 99);
    ScratchDir dir;
    const auto cases = test::write_malformed_goldens(dir.path().string(), good);
    EXPECT_NO_THROW(read_golden(dir.file("good.h5")));
    EXPECT_EQ(cases.size(), cfg.top_k >= 2 ? 36u : 35u);
    for (const auto& [name, path] : cases) {
      const std::string expected = test::malformed_expected_text(name);
      ASSERT_FALSE(expected.empty()) << name;
      try {
        read_golden(path);
        ADD_FAILURE() << name << ": read_golden accepted " << path;
      } catch (const mok::Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << name;
        EXPECT_EQ(what.rfind(path + ": ", 0), 0u)
            << name << ": message does not start with the file: " << what;
        EXPECT_NE(what.find(expected), std::string::npos) << name << ": " << what;
        EXPECT_EQ(what.find('\n'), std::string::npos) << name << ": one line expected: " << what;
      }
    }
  }
}

TEST(GoldenIo, ValueProblemsNameTheElement) {
  const spec::LayerConfig cfg = make_config(32, 16, 16, 4, 2, 2, 3);
  Golden golden = test::make_random_golden(cfg, 1);
  Tensor& w = at(golden.tensors, "inputs/w_routed_gate");
  w.data<uint16_t>()[(3 * 16 + 7) * 32 + 20] = 0x7F81;  // a signalling-NaN pattern
  try {
    validate_golden(golden, "mem");
    FAIL() << "NaN accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "mem: dataset /inputs/w_routed_gate: element expert=3 i=7 h=20 is NaN"),
              std::string::npos)
        << e.what();
  }
  ReadOptions lenient;
  lenient.check_values = false;
  EXPECT_NO_THROW(validate_golden(golden, "mem", lenient));
}

TEST(GoldenIo, ShapeMessageFollowsTheContract) {
  const spec::LayerConfig cfg = make_config(64, 32, 0, 8, 2, 2, 3);
  const Golden good = test::make_random_golden(cfg, 2);
  ScratchDir dir;
  const auto cases = test::write_malformed_goldens(dir.path().string(), good);
  int found = 0;
  for (const auto& [name, path] : cases) {
    if (name != "wrong_shape") continue;
    ++found;
    try {
      read_golden(path);
      FAIL() << "accepted";
    } catch (const mok::Error& e) {
      EXPECT_EQ(
          std::string(e.what()),
          path +
              ": dataset /inputs/w_routed_gate: expected shape [8, 32, 64] (E, I, H) but found "
              "[8, 64, 32]; regenerate the file with mok-golden or fix the writer");
    }
  }
  EXPECT_EQ(found, 1) << "the malformed set has no (or several) wrong_shape cases";
}

TEST(GoldenIo, WriterRejectsStructuralErrorsAndLeavesNoFile) {
  const spec::LayerConfig cfg = make_config(32, 16, 0, 4, 2, 2, 3);
  ScratchDir dir;
  {
    Golden bad = test::make_random_golden(cfg, 4);
    at(bad.tensors, "inputs/x") = Tensor(DType::kBf16, {6, 16});
    EXPECT_THROW(write_golden(dir.file("a.h5"), bad), mok::Error);
  }
  {
    Golden bad = test::make_random_golden(cfg, 4);
    bad.tensors.emplace("inputs/bias", Tensor(DType::kF32, {32}));
    EXPECT_THROW(write_golden(dir.file("a.h5"), bad), mok::Error);
  }
  {
    Golden bad = test::make_random_golden(cfg, 4);
    bad.tensors.emplace("inputs/w_shared_up", Tensor(DType::kBf16, {0, 32}));  // Is = 0
    EXPECT_THROW(write_golden(dir.file("a.h5"), bad), mok::Error);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);
}

// A stored bound the reader would refuse is refused by the writer too (inputs, by contrast, may
// be recorded as they are: the reader flags them).
TEST(GoldenIo, WriterRejectsBoundsTheReaderRefusesAndLeavesNoFile) {
  const spec::LayerConfig cfg = make_config(32, 16, 0, 4, 2, 2, 3);
  ScratchDir dir;
  const Golden good = test::make_random_golden(cfg, 5);
  ASSERT_TRUE(good.tensors.count("bounds/output_bound")) << "the random golden has no bounds to spoil";
  const struct {
    const char* dataset;
    float value;
    const char* says;
  } spoiled[] = {{"bounds/output_bound", -1.0f, "a radius must be a finite number >= 0"},
                 {"bounds/output_bound", std::numeric_limits<float>::infinity(), "a radius must be"},
                 {"bounds/output_exact", std::numeric_limits<float>::quiet_NaN(), "a value with a radius must be finite"}};
  for (const auto& s : spoiled) {
    Golden bad = good;
    at(bad.tensors, s.dataset).data<float>()[3] = s.value;
    try {
      write_golden(dir.file("a.h5"), bad);
      ADD_FAILURE() << s.dataset << " = " << s.value << " was written";
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(s.says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(s.dataset), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);
  Golden nan_radius = good;  // NaN: not sampled, which the reader accepts
  at(nan_radius.tensors, "bounds/output_bound").data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NO_THROW(write_golden(dir.file("ok.h5"), nan_radius));
}

TEST(GoldenIo, FailedWriteRemovesTheTemporaryFile) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 0, 2, 1, 1, 2), 6);
  ScratchDir dir;
  // The target is a folder: refused before anything is written, and named.
  fs::create_directory(dir.file("taken.h5"));
  fs::create_directory(dir.file("taken.h5/child"));
  try {
    write_golden(dir.file("taken.h5"), golden);
    FAIL() << "write over a folder succeeded";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("taken.h5: is a directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  // No such folder: named, with the fix.
  try {
    write_golden(dir.file("missing/a.h5"), golden);
    FAIL() << "write into a missing folder succeeded";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing/a.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not exist; create the directory first"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_golden("", golden), mok::Error);
  EXPECT_THROW(check_output_path("/dev/null"), mok::Error);  // a device is never replaced by a file
  // A link is followed: its target is written and the link stays.
  fs::create_symlink("linked.h5", dir.file("link.h5"));
  write_golden(dir.file("link.h5"), golden);
  EXPECT_TRUE(fs::is_symlink(dir.file("link.h5")));
  EXPECT_TRUE(fs::is_regular_file(dir.file("linked.h5")));
  // A failed overwrite leaves the previous file intact.
  write_golden(dir.file("ok.h5"), golden);
  const std::string before = read_bytes(dir.file("ok.h5"));
  Golden bad = golden;
  at(bad.tensors, "inputs/x") = Tensor(DType::kF32, {2, 16});
  EXPECT_THROW(write_golden(dir.file("ok.h5"), bad), mok::Error);
  EXPECT_TRUE(before == read_bytes(dir.file("ok.h5")));
}

// A write that the system refuses (here past a file-size limit, ulimit -f) is one line naming the
// file, the system's reason and the fix, and leaves nothing behind (found by audit, 2026-12: HDF5's
// own text, over two lines, naming only the temporary file).
TEST(GoldenIo, FailedWriteSaysWhyAndWhatToDo) {
  const Golden golden = test::make_random_golden(chunked_config(), 10);
  ScratchDir dir, notes;
  const std::string target = dir.file("limited.h5"), message = notes.file("message.txt");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of the signal ending it
    const struct rlimit limit = {64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
    try {
      write_golden(target, golden);
      ::_exit(0);
    } catch (const mok::Error& e) {
      std::ofstream(message) << e.what();
      ::_exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 2) << "the write past the limit did not fail";
  const std::string what = read_bytes(message);
  EXPECT_EQ(what.rfind(target + ": cannot write the file: File too large (writing ", 0), 0u) << what;
  EXPECT_NE(what.find("raise the limit, or write to another file system; nothing was written"), std::string::npos)
      << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  EXPECT_EQ(what.find(".tmp."), std::string::npos) << what;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);
}

// What the reader cannot open at all still says what to give it (found by audit, 2026-12: a
// folder, a truncated copy and a damaged header named the problem but no fix).
TEST(GoldenIo, FilesThatCannotBeOpenedSayWhatToGive) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 0, 2, 1, 1, 2), 14);
  ScratchDir dir;
  auto message = [](const std::string& path) -> std::string {
    try {
      read_golden(path);
    } catch (const mok::Error& e) {
      return e.what();
    }
    return "accepted";
  };
  fs::create_directory(dir.file("folder"));
  EXPECT_EQ(message(dir.file("folder")), dir.file("folder") + ": cannot open: is a directory; give the path of a "
                                                             "golden file in it (e.g. " + dir.file("folder/case.h5") + ")");
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_NE(message(dir.file("fifo")).find("not a regular file (a device, a pipe or a socket); give the path of a golden file"),
            std::string::npos);
  write_golden(dir.file("a.h5"), golden);
  const std::string bytes = read_bytes(dir.file("a.h5"));
  std::ofstream(dir.file("cut.h5"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  EXPECT_NE(message(dir.file("cut.h5")).find("not an HDF5 file or truncated ("), std::string::npos);
  EXPECT_NE(message(dir.file("cut.h5")).find("give a golden made by mok-golden (a copy cut short: copy it again in full)"),
            std::string::npos);
}

// A write stopped by SIGTERM leaves no temporary file: a child process writes the file over
// and over (nearly all of its time is spent inside write_golden) until the signal ends it.
TEST(GoldenIo, SignalDuringWriteLeavesNoTemporaryFile) {
  const Golden golden = test::make_random_golden(make_config(256, 128, 128, 8, 4, 1, 256), 7);
  ScratchDir dir;
  const std::string target = dir.file("signalled.h5");
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (;;) write_golden(target, golden);
    }
    ::usleep(static_cast<useconds_t>(30000 + 20000 * attempt));
    ::kill(child, SIGTERM);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the child should die of the signal";
    for (const auto& e : fs::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
  // An ignored signal stays ignored while the writer runs (nohup): SIGHUPs do not end the
  // child, the SIGTERM after them does.
  // Ignored before the fork (the child inherits it), so no SIGHUP can come before it is ignored.
  const auto old_hup = std::signal(SIGHUP, SIG_IGN);
  const pid_t child = ::fork();
  if (child == 0)
    for (;;) write_golden(target, golden);
  std::signal(SIGHUP, old_hup);
  ASSERT_GE(child, 0);
  for (int i = 0; i < 10; ++i) {
    ::usleep(5000);
    ::kill(child, SIGHUP);
  }
  ::usleep(5000);
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "an ignored SIGHUP ended the writer";
}

// DESIGN.md's golden format: the profile and MMA model are this build's (another one's bits
// would be judged by the wrong rules: unsupported, exit 3), and the root's generator, version
// and seed are required.
TEST(GoldenIo, ProfileModelAndRootAttributesAreChecked) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 0, 2, 1, 1, 2), 8);
  ScratchDir dir;
  // Replaces a string attribute of `obj` (fixed-length, as the writer stores them).
  auto set_string_attr = [](hid_t obj, const char* name, const std::string& value) {
    ASSERT_GE(H5Adelete(obj, name), 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, value.size());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attr, type, value.c_str()), 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
  };
  for (const char* field : {"profile", "mma_model"}) {
    Golden other = golden;
    (std::string(field) == "profile" ? other.meta.profile : other.meta.mma_model) = "some-other-v9";
    // The writer refuses to make such a file ...
    try {
      write_golden(dir.file("other.h5"), other);
      ADD_FAILURE() << "write_golden wrote " << field << " some-other-v9";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.kind(), mok::ErrorKind::kUnsupported) << e.what();
    }
    // ... and the reader refuses one made elsewhere (both copies of the attribute changed).
    const hid_t file = write_and_open(dir, "other.h5", golden);
    ASSERT_GE(file, 0);
    set_string_attr(file, field, "some-other-v9");
    const hid_t config = H5Gopen2(file, "/config", H5P_DEFAULT);
    set_string_attr(config, field, "some-other-v9");
    H5Gclose(config);
    H5Fclose(file);
    try {
      read_golden(dir.file("other.h5"));
      ADD_FAILURE() << field << " some-other-v9 was accepted";
    } catch (const mok::Error& e) {
      EXPECT_EQ(e.kind(), mok::ErrorKind::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("some-other-v9"), std::string::npos) << e.what();
    }
  }
  for (const char* attr : {"generator", "generator_version", "seed"}) {
    const hid_t file = write_and_open(dir, "bare.h5", golden);
    ASSERT_GE(file, 0);
    ASSERT_GE(H5Adelete(file, attr), 0);
    H5Fclose(file);
    try {
      read_golden(dir.file("bare.h5"));
      ADD_FAILURE() << "a file without the root attribute " << attr << " was accepted";
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("attribute ") + attr + " is missing"), std::string::npos)
          << e.what();
    }
  }
}

// A candidate file (ReadOptions::require_inputs false) may hold outputs and gradients alone; a
// golden may not.
TEST(GoldenIo, CandidatesNeedNoInputs) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 0, 2, 1, 1, 2), 9);
  ScratchDir dir;
  const hid_t file = write_and_open(dir, "c.h5", golden);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Ldelete(file, "/inputs", H5P_DEFAULT), 0);
  H5Fclose(file);
  ReadOptions candidate;
  candidate.require_inputs = false;
  const Golden back = read_golden(dir.file("c.h5"), candidate);
  EXPECT_EQ(back.tensors.count("inputs/x"), 0u);
  ASSERT_EQ(back.tensors.count("outputs/output"), 1u);
  EXPECT_EQ(std::memcmp(back.tensors.at("outputs/output").raw(), golden.tensors.at("outputs/output").raw(),
                        golden.tensors.at("outputs/output").size_bytes()),
            0);
  EXPECT_THROW(read_golden(dir.file("c.h5")), mok::Error);
}

TEST(GoldenIo, MissingFileIsBadInput) {
  try {
    read_golden("/nonexistent/golden.h5");
    FAIL() << "accepted";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(std::string(e.what()), "/nonexistent/golden.h5: cannot open: no such file");
  }
}

// Every prefix of a valid file is rejected with a mok::Error (never a crash or a wrong read).
TEST(GoldenIo, EveryTruncationIsRejected) {
  const Golden golden = test::make_random_golden(make_config(16, 16, 16, 2, 1, 1, 2), 12);
  ScratchDir dir;
  write_golden(dir.file("a.h5"), golden);
  const std::string bytes = read_bytes(dir.file("a.h5"));
  const size_t step = std::max<size_t>(1, bytes.size() / 97);
  for (size_t len = 0; len < bytes.size(); len += step) {
    std::ofstream(dir.file("cut.h5"), std::ios::binary | std::ios::trunc).write(bytes.data(), len);
    EXPECT_THROW(read_golden(dir.file("cut.h5")), mok::Error) << "prefix of " << len << " bytes";
  }
}

// Corrupted metadata (random byte flips in the first 8 KiB) gives either a clean read or a
// mok::Error, never a crash; each read runs in a child process so a crash is observed, not fatal.
TEST(GoldenIo, CorruptMetadataNeverCrashes) {
  const Golden golden = test::make_random_golden(make_config(32, 16, 16, 4, 2, 2, 3), 13);
  ScratchDir dir;
  write_golden(dir.file("a.h5"), golden);
  const std::string bytes = read_bytes(dir.file("a.h5"));
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = bytes;
    const size_t pos = rng() % std::min<size_t>(bad.size(), 8192);
    bad[pos] = static_cast<char>(bad[pos] ^ static_cast<char>(1 + rng() % 255));
    std::ofstream(dir.file("bad.h5"), std::ios::binary | std::ios::trunc) << bad;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        read_golden(dir.file("bad.h5"));
        ::_exit(0);
      } catch (const mok::Error& e) {
        // Every message says what to do (found by audit, 2026-12: HDF5's own failures did not).
        const std::string what = e.what();
        if (what.find("mok-golden") == std::string::npos && what.find("more memory") == std::string::npos) {
          std::fprintf(stderr, "no fix in: %s\n", e.what());
          ::_exit(4);
        }
        ::_exit(2);
      } catch (...) {
        ::_exit(3);
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "crash (signal " << WTERMSIG(status) << ") with byte " << pos
                                   << " flipped, trial " << trial;
    EXPECT_NE(WEXITSTATUS(status), 3) << "non-mok exception with byte " << pos << " flipped";
    EXPECT_NE(WEXITSTATUS(status), 4) << "a message without a fix with byte " << pos << " flipped (printed above)";
  }
}

}  // namespace
}  // namespace mok::ref
