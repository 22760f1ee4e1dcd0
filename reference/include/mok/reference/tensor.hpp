// Tensor: a dense row-major host array with a dtype and shape; TensorMap: tensors by schema path.
#pragma once

#include "mok/reference/error.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

namespace mok::ref {

// bf16 is held as its uint16 bit pattern; f64 is used only by the oracle and bounds.
enum class DType : uint8_t { kBf16, kF32, kF64, kI32 };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

template <class T> constexpr bool dtype_matches(DType d);
template <> constexpr bool dtype_matches<uint16_t>(DType d) { return d == DType::kBf16; }
template <> constexpr bool dtype_matches<float>(DType d) { return d == DType::kF32; }
template <> constexpr bool dtype_matches<double>(DType d) { return d == DType::kF64; }
template <> constexpr bool dtype_matches<int32_t>(DType d) { return d == DType::kI32; }

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t size_bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  std::string shape_string() const;

  // Typed access; throws mok::Error when T does not match the dtype.
  template <class T> T* data() { check<T>(); return reinterpret_cast<T*>(storage_.data()); }
  template <class T> const T* data() const { check<T>(); return reinterpret_cast<const T*>(storage_.data()); }
  void* raw() { return storage_.data(); }
  const void* raw() const { return storage_.data(); }

  // Element i as a double (bf16 decoded); used by comparisons and reports.
  double value_at(int64_t i) const;
  // The element's bits widened to uint64 (for bitwise equality and ULP distances).
  uint64_t bits_at(int64_t i) const;

 private:
  template <class T> void check() const {
    if (!dtype_matches<T>(dtype_)) throw_dtype_mismatch(typeid(T).name());
  }
  [[noreturn]] void throw_dtype_mismatch(const char* requested) const;

  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<uint64_t> storage_;  // 8-byte aligned backing store
};

// Thrown by the Tensor constructor when its storage cannot be allocated (bad input: the layer is
// too large for this machine). Callers that know which file or dataset was being made catch it
// to say so.
class AllocationError : public Error {
 public:
  AllocationError(std::string what, size_t bytes) : Error(std::move(what)), bytes_(bytes) {}
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
};

// An upper bound on the bytes this process can allocate, from hard limits only: the smallest of
// the address-space and data limits (ulimit -v, -d) less what is mapped, the cgroup's memory
// limit, and the machine's memory plus swap. A need above it can never be met; one below it may
// still fail (other processes, page cache). nullopt when none can be read.
std::optional<uint64_t> available_memory_bytes();

// A byte count for messages: "1.5 GiB", "320 MiB", "12 KiB", "100 bytes".
std::string format_bytes(uint64_t bytes);
// The same for a byte count computed in double (an estimate that may pass 2^64, where a cast to
// uint64_t is undefined): at least GiB precision.
std::string format_bytes_estimate(double bytes);
// A shape for messages: "[2, 3]" (Tensor::shape_string() of a tensor of that shape).
std::string format_shape(const std::vector<int64_t>& shape);

// Keys are schema paths such as "inputs/x", "grads/d_w_routed_gate", "bounds/output_exact".
using TensorMap = std::map<std::string, Tensor>;

// Throws mok::Error naming the key when absent.
const Tensor& at(const TensorMap& map, const std::string& key);
Tensor& at(TensorMap& map, const std::string& key);

}  // namespace mok::ref
