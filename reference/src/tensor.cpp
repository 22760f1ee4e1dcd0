// Tensor storage, dtype names and sizes, element decoding, and checked TensorMap lookups.
#include "mok/reference/tensor.hpp"

#include "mok/reference/error.hpp"
#include "mok/spec/bf16.hpp"

#include <cxxabi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <utility>

namespace mok::ref {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return 2;
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
  }
  return 0;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

// The number on the line of /proc/meminfo that starts with `key` (in kB), or nullopt.
std::optional<uint64_t> meminfo_kib(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kib = 0;
    if (line.rfind(key, 0) == 0 && std::sscanf(line.c_str() + key.size(), " %llu", &kib) == 1) return kib;
  }
  return std::nullopt;
}

std::string read_text(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::optional<uint64_t> available_memory_bytes() {
  // Hard limits only: what a process could never get, however much cache the kernel reclaims.
  // (MemAvailable or a cgroup's limit less its use count reclaimable page cache as used, and
  // would refuse runs that fit.)
  std::optional<uint64_t> best;
  auto consider = [&](uint64_t v) { best = best ? std::min(*best, v) : v; };
  // Address-space and data-segment limits, less what this process has mapped (all of it for the
  // address space; the data and stack pages for the data limit).
  unsigned long long size_pages = 0, data_pages = 0;
  const bool have_statm = std::sscanf(read_text("/proc/self/statm").c_str(), "%llu %*u %*u %*u %*u %llu",
                                      &size_pages, &data_pages) == 2;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& [resource, used_pages] : {std::pair{RLIMIT_AS, size_pages}, std::pair{RLIMIT_DATA, data_pages}}) {
    struct rlimit lim {};
    if (::getrlimit(resource, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) continue;
    const uint64_t used = have_statm ? used_pages * page : 0;
    consider(lim.rlim_cur > used ? lim.rlim_cur - used : 0);
  }
  // A cgroup (v2) memory limit, as containers and batch schedulers set ("max": none).
  unsigned long long limit = 0;
  if (std::sscanf(read_text("/sys/fs/cgroup/memory.max").c_str(), "%llu", &limit) == 1) consider(limit);
  // The machine's memory and swap.
  const std::string meminfo = read_text("/proc/meminfo");
  if (const auto total = meminfo_kib(meminfo, "MemTotal:"))
    consider((*total + meminfo_kib(meminfo, "SwapTotal:").value_or(0)) * 1024);
  return best;
}

std::string format_bytes(uint64_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) std::snprintf(text, sizeof text, "%.1f GiB", b / (1u << 30));
  else if (bytes >= (uint64_t{1} << 20)) std::snprintf(text, sizeof text, "%.0f MiB", b / (1u << 20));
  else if (bytes >= (uint64_t{1} << 10)) std::snprintf(text, sizeof text, "%.0f KiB", b / (1u << 10));
  else std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  return text;
}

std::string format_bytes_estimate(double bytes) {
  if (!(bytes < 0x1p63)) {  // also NaN and inf
    char text[64];
    std::snprintf(text, sizeof text, "%.3g GiB", bytes / (1u << 30));
    return text;
  }
  return format_bytes(bytes <= 0 ? 0 : static_cast<uint64_t>(bytes));
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  // A product of non-negative dims that stays below this bound also fits in size_t bytes.
  const int64_t max_numel =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(uint64_t));
  int64_t numel = 1;
  bool has_zero = false;
  for (int64_t d : shape_) {
    if (d < 0) {
      throw Error("Tensor: negative dimension in shape " + format_shape(shape_) +
                  "; every dimension must be >= 0");
    }
    if (d == 0) has_zero = true;
  }
  if (has_zero) {
    numel = 0;
  } else {
    for (int64_t d : shape_) {
      if (numel > max_numel / d) {
        throw Error("Tensor: shape " + format_shape(shape_) + " has too many elements to address");
      }
      numel *= d;
    }
  }
  numel_ = numel;
  const size_t num_words = (size_bytes() + sizeof(uint64_t) - 1) / sizeof(uint64_t);
  try {
    storage_.assign(num_words, 0);
  } catch (const std::bad_alloc&) {
    throw AllocationError("Tensor: cannot allocate " + format_bytes(size_bytes()) + " for shape " +
                              format_shape(shape_) + " " + dtype_name(dtype_) + " (out of memory)",
                          size_bytes());
  }
}

std::string Tensor::shape_string() const { return format_shape(shape_); }

double Tensor::value_at(int64_t i) const {
  if (i < 0 || i >= numel_) {
    throw Error("Tensor::value_at: index " + std::to_string(i) + " outside " + shape_string(),
                ErrorKind::kInternal);
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(storage_.data());
  switch (dtype_) {
    case DType::kBf16: {
      uint16_t b;
      std::memcpy(&b, bytes + i * 2, sizeof b);
      return static_cast<double>(spec::f32_from_bf16(b));
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, bytes + i * 4, sizeof f);
      return static_cast<double>(f);
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, bytes + i * 8, sizeof d);
      return d;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, bytes + i * 4, sizeof v);
      return static_cast<double>(v);
    }
  }
  return 0.0;
}

uint64_t Tensor::bits_at(int64_t i) const {
  if (i < 0 || i >= numel_) {
    throw Error("Tensor::bits_at: index " + std::to_string(i) + " outside " + shape_string(),
                ErrorKind::kInternal);
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(storage_.data());
  switch (dtype_size(dtype_)) {
    case 2: {
      uint16_t b;
      std::memcpy(&b, bytes + i * 2, sizeof b);
      return b;
    }
    case 4: {
      uint32_t b;
      std::memcpy(&b, bytes + i * 4, sizeof b);
      return b;
    }
    default: {
      uint64_t b;
      std::memcpy(&b, bytes + i * 8, sizeof b);
      return b;
    }
  }
}

void Tensor::throw_dtype_mismatch(const char* requested) const {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(requested, nullptr, nullptr, &status), std::free);
  const std::string type_name = (status == 0 && demangled) ? demangled.get() : requested;
  throw Error("Tensor: typed access as " + type_name + " but the tensor is " + dtype_name(dtype_) +
                  " " + shape_string() + "; use the element type that matches the dtype",
              ErrorKind::kInternal);
}

namespace {

[[noreturn]] void throw_missing(const std::string& key) {
  throw Error("tensor '" + key + "' is missing; the golden or candidate must contain it");
}

}  // namespace

const Tensor& at(const TensorMap& map, const std::string& key) {
  const auto it = map.find(key);
  if (it == map.end()) throw_missing(key);
  return it->second;
}

Tensor& at(TensorMap& map, const std::string& key) {
  const auto it = map.find(key);
  if (it == map.end()) throw_missing(key);
  return it->second;
}

}  // namespace mok::ref
