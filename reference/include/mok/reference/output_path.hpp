// Paths the tools write results to, one definition for the golden writer and mok-sim: which file
// a rename would replace, and whether a path is a stream or device rather than a file.
#pragma once

#include <filesystem>
#include <string>

namespace mok::ref {

// `p` with its symbolic links followed: the file a temporary-and-rename write replaces (the link
// itself stays). Throws mok::Error naming `what` (e.g. "--trace 'x.json'") on a loop or a link
// it cannot read.
std::filesystem::path follow_links(const std::filesystem::path& p, const std::string& what);

// A stream or device rather than a file: `p` exists and is neither a regular file nor a
// directory (links followed, /proc's included: a pipe, a character device), or it names one
// under /dev or /proc, before or after its links are followed (/dev/stdout redirected to a file
// is that open file, which a rename must not replace).
bool is_stream_or_device(const std::filesystem::path& p);

}  // namespace mok::ref
