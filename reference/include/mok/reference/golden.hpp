// Golden files (HDF5 schema v1): the in-memory case, its writer and its validating reader.
#pragma once

#include "mok/reference/schema.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <cstdint>
#include <string>

namespace mok::ref {

struct GoldenMeta {
  std::string generator = "mok-golden";
  std::string generator_version;      // e.g. "mok-golden 0.1.0 gen-v1"
  uint64_t seed = 0;
  std::string profile = kProfileBf16V1;
  std::string mma_model = "hopper-bf16-v1";
  std::string routing;                // the routing generator, e.g. "zipf:1.2,rank-skew:0.5"
};

struct Golden {
  GoldenMeta meta;
  spec::LayerConfig cfg;
  TensorMap tensors;  // keyed by schema path
};

struct ReadOptions {
  bool load_intermediates = true;
  bool load_bounds = true;
  bool check_values = true;   // finite inputs, valid routing, stored bounds in range
  bool require_inputs = true; // false for candidate files that hold only outputs/grads
};

// Writes atomically (temporary file in the same folder, then rename): a failure, or SIGINT /
// SIGTERM / SIGHUP while writing, leaves no partial file. A symbolic link is followed (its target
// is replaced, the link stays). Datasets carry no timestamps, so equal content gives equal bytes.
// Throws mok::Error.
void write_golden(const std::string& path, const Golden& golden);

// Checks, before any work, that write_golden() can write `path`: not empty, not a directory,
// device or pipe, in an existing directory this process may write to. Returns the file that will
// be written (links followed). Throws mok::Error naming the path and the fix.
std::string check_output_path(const std::string& path);

// Reads and validates a golden or candidate file: format attributes, config, every present
// dataset's rank/shape/dtype against the schema, required datasets present, input values
// finite, routing valid. Throws mok::Error (kind kBadInput) with one message naming the file,
// the dataset and the problem.
Golden read_golden(const std::string& path, const ReadOptions& options = {});

// The same checks on an in-memory golden (read_golden calls it). `origin` names the file.
void validate_golden(const Golden& golden, const std::string& origin, const ReadOptions& options = {});

}  // namespace mok::ref
