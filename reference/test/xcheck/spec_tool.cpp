// mok-spec-tool: runs the spec layer's bf16 conversion and MMA model over binary batches, for
// cross-checks against independent implementations (ml_dtypes, MMA-Sim) driven from Python.
//
// Usage:
//   mok-spec-tool bf16 IN OUT   IN: float32 values; OUT: one uint16 per value,
//                               mok::spec::bf16_from_f32_rne (round-to-nearest-even).
//   mok-spec-tool e4m3|e5m2|e8m0 IN OUT   IN: float32 values; OUT: one uint8 code per value
//                               (mok::spec::e4m3_from_f32_rne, e5m2_from_f32_rne, e8m0_from_f32).
//   mok-spec-tool e4m3d|e5m2d|e8m0d IN OUT  IN: uint8 codes; OUT: float32 (the decoders).
//   mok-spec-tool mma IN OUT    IN: MMA element problems, 68 bytes each:
//                                 float32 acc, uint16 a[16], uint16 b[16] (bf16 bit patterns);
//                               OUT: one float32 per problem,
//                                 mok::spec::mma_bf16_step(kHopperBf16Mma, acc, a, 1, b, 1, 16),
//                               i.e. d = acc + sum_i a[i]*b[i] over one k16 step.
// All values are raw little-endian, packed, without header. Exit codes: 0 done, 2 bad usage or
// bad input (unreadable file, size not a whole number of records, write failure).
#include "mok/spec/bf16.hpp"
#include "mok/spec/fp8.hpp"
#include "mok/spec/mma_model.hpp"

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static_assert(std::endian::native == std::endian::little,
              "the batch formats are little-endian and are read by memcpy");
static_assert(sizeof(float) == 4, "records hold IEEE binary32");

namespace {

constexpr int kMmaK = 16;
constexpr size_t kMmaRecordBytes = 4 + 2 * kMmaK + 2 * kMmaK;  // acc, a[16], b[16]
constexpr size_t kRecordsPerChunk = 1 << 16;

struct Failure {
  std::string message;
};

struct File {
  std::FILE* f = nullptr;
  File(const char* path, const char* mode) : f(std::fopen(path, mode)) {
    if (f == nullptr) {
      throw Failure{std::string("cannot open '") + path + "' (" + mode + "): " + std::strerror(errno)};
    }
  }
  ~File() {
    if (f != nullptr) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
};

// Streams IN through `convert` record by record, chunk by chunk, so inputs of any size work.
template <typename Convert>
void run_batch(const char* in_path, const char* out_path, size_t in_bytes, size_t out_bytes,
               Convert convert) {
  File in(in_path, "rb");
  File out(out_path, "wb");
  std::vector<unsigned char> ibuf(in_bytes * kRecordsPerChunk), obuf(out_bytes * kRecordsPerChunk);
  size_t num_records = 0;
  for (;;) {
    const size_t got = std::fread(ibuf.data(), 1, ibuf.size(), in.f);
    if (std::ferror(in.f)) throw Failure{std::string("read error on '") + in_path + "'"};
    if (got % in_bytes != 0) {
      throw Failure{std::string("'") + in_path + "' ends with a partial record: " +
                    std::to_string(num_records * in_bytes + got) + " bytes is not a multiple of " +
                    std::to_string(in_bytes)};
    }
    const size_t n = got / in_bytes;
    for (size_t i = 0; i < n; ++i) convert(&ibuf[i * in_bytes], &obuf[i * out_bytes]);
    if (std::fwrite(obuf.data(), out_bytes, n, out.f) != n) {
      throw Failure{std::string("write error on '") + out_path + "'"};
    }
    num_records += n;
    if (got < ibuf.size()) break;
  }
  if (std::fflush(out.f) != 0) throw Failure{std::string("write error on '") + out_path + "'"};
}

void convert_bf16(const unsigned char* in, unsigned char* out) {
  float f;
  std::memcpy(&f, in, 4);
  const uint16_t b = mok::spec::bf16_from_f32_rne(f);
  std::memcpy(out, &b, 2);
}

template <uint8_t (*Encode)(float)>
void convert_encode(const unsigned char* in, unsigned char* out) {
  float f;
  std::memcpy(&f, in, 4);
  out[0] = Encode(f);
}

template <float (*Decode)(uint8_t)>
void convert_decode(const unsigned char* in, unsigned char* out) {
  const float f = Decode(in[0]);
  std::memcpy(out, &f, 4);
}

void convert_mma(const unsigned char* in, unsigned char* out) {
  float acc;
  uint16_t a[kMmaK], b[kMmaK];
  std::memcpy(&acc, in, 4);
  std::memcpy(a, in + 4, sizeof a);
  std::memcpy(b, in + 4 + sizeof a, sizeof b);
  const float d = mok::spec::mma_bf16_step(mok::spec::kHopperBf16Mma, acc, a, 1, b, 1, kMmaK);
  std::memcpy(out, &d, 4);
}

int usage(const char* msg) {
  std::fprintf(stderr,
               "mok-spec-tool: %s\n"
               "usage: mok-spec-tool bf16 IN OUT   (float32 -> uint16 bf16 bits, RNE)\n"
               "       mok-spec-tool e4m3|e5m2|e8m0 IN OUT     (float32 -> uint8 codes)\n"
               "       mok-spec-tool e4m3d|e5m2d|e8m0d IN OUT  (uint8 codes -> float32)\n"
               "       mok-spec-tool mma IN OUT    (68-byte records {f32 acc, u16 a[16], u16 b[16]}\n"
               "                                    -> float32, model %s)\n",
               msg, mok::spec::kHopperBf16Mma.name);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return usage("expected a subcommand and two file paths");
  const std::string cmd = argv[1];
  try {
    if (cmd == "bf16") {
      run_batch(argv[2], argv[3], 4, 2, convert_bf16);
    } else if (cmd == "e4m3") {
      run_batch(argv[2], argv[3], 4, 1, convert_encode<mok::spec::e4m3_from_f32_rne>);
    } else if (cmd == "e5m2") {
      run_batch(argv[2], argv[3], 4, 1, convert_encode<mok::spec::e5m2_from_f32_rne>);
    } else if (cmd == "e8m0") {
      run_batch(argv[2], argv[3], 4, 1, convert_encode<mok::spec::e8m0_from_f32>);
    } else if (cmd == "e4m3d") {
      run_batch(argv[2], argv[3], 1, 4, convert_decode<mok::spec::f32_from_e4m3>);
    } else if (cmd == "e5m2d") {
      run_batch(argv[2], argv[3], 1, 4, convert_decode<mok::spec::f32_from_e5m2>);
    } else if (cmd == "e8m0d") {
      run_batch(argv[2], argv[3], 1, 4, convert_decode<mok::spec::f32_from_e8m0>);
    } else if (cmd == "mma") {
      run_batch(argv[2], argv[3], kMmaRecordBytes, 4, convert_mma);
    } else {
      return usage(("unknown subcommand '" + cmd + "'").c_str());
    }
  } catch (const Failure& e) {
    std::fprintf(stderr, "mok-spec-tool %s: %s\n", cmd.c_str(), e.message.c_str());
    return 2;
  }
  return 0;
}
