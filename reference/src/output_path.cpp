// Paths the tools write results to (output_path.hpp).
#include "mok/reference/output_path.hpp"

#include "mok/reference/error.hpp"

#include <system_error>

namespace mok::ref {

namespace fs = std::filesystem;

fs::path follow_links(const fs::path& p, const std::string& what) {
  std::error_code ec;
  fs::path target = p;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    const fs::path to = fs::read_symlink(target, ec);
    if (ec || hops == 40)
      throw Error(what + ": cannot follow the symbolic link" + (ec ? ": " + ec.message() : std::string(" (a loop?)")));
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  return target;
}

bool is_stream_or_device(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st)) return true;
  auto under_dev_or_proc = [&](const fs::path& q) {
    const std::string s = fs::absolute(q, ec).lexically_normal().string();
    return s.rfind("/dev/", 0) == 0 || s.rfind("/proc/", 0) == 0;
  };
  if (under_dev_or_proc(p)) return true;
  try {
    return under_dev_or_proc(follow_links(p, p.string()));
  } catch (const Error&) {
    return false;  // a link loop: not a stream; the caller's own resolution reports it
  }
}

}  // namespace mok::ref
