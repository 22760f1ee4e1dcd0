// Test goldens: a random valid golden and malformed files made from it, for reader and CLI tests.
#pragma once

#include "mok/reference/golden.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mok::test {

// A structurally valid golden for cfg with fresh random contents for every dataset of the
// schema that applies (inputs, outputs, grads, intermediates, bounds). Deterministic per seed;
// never all zeros; inputs are finite and the routing is valid (about 15% empty slots).
ref::Golden make_random_golden(const spec::LayerConfig& cfg, uint64_t seed);

// Writes `good` to dir/good.h5 and one file per malformed case next to it (dir must exist);
// returns the (case name, file path) pairs of the malformed files. Every file makes read_golden throw mok::Error of kind kBadInput (mok-verify exit
// code 2) whose message contains malformed_expected_text(case name). Needs `good` to carry the
// required inputs; the case "duplicate_expert" is left out when K < 2.
std::vector<std::pair<std::string, std::string>> write_malformed_goldens(const std::string& dir,
                                                                         const ref::Golden& good);

// Writes a golden for cfg whose datasets (inputs, output, gradients and, with `bounds`, their
// stage-local bounds) are declared but never written: chunked and compressed, they take almost no
// disk, whatever the layer's size. For tests of layers too large to load (the reader refuses such
// a file by its size before it looks at the data, and refuses unwritten data after). With
// `zeros`, every dataset is written with zeros (valid routing to expert 0, zero radii; still
// little disk, but the whole largest dataset in memory for the write): a file that loads.
void write_placeholder_golden(const std::string& path, const spec::LayerConfig& cfg, bool bounds, bool zeros = false);

// Sets one element of an fp32 dataset of an existing file (e.g. "bounds/d_x_bound"), in place:
// how tests make files with values write_golden refuses to write (a negative radius, say).
void set_f32_element(const std::string& path, const std::string& dataset, int64_t index, float value);

// A piece of text that the reader's message for this case must contain (a dataset path or
// the kind of problem).
std::string malformed_expected_text(const std::string& case_name);

}  // namespace mok::test
