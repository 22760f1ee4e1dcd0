// Golden file I/O over the HDF5 C API: byte-reproducible atomic writer and fully validating reader.
#include "mok/reference/golden.hpp"
#include "mok/reference/output_path.hpp"
#include "mok/reference/validate.hpp"

#include "mok/reference/error.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/routing_plan.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <cerrno>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <type_traits>

namespace mok::ref {
namespace {

// Datasets above this size are chunked and compressed; smaller ones stay contiguous.
constexpr size_t kCompressAboveBytes = size_t{64} << 10;
// Upper bound on one chunk; chunk dims divide the shape so there are no partial edge chunks.
constexpr size_t kChunkTargetBytes = size_t{256} << 10;
constexpr unsigned kDeflateLevel = 4;
// Links and attributes per object kept in compact storage (the schema's largest group has 18).
constexpr unsigned kMaxCompact = 64;
// Reads above this many bytes must be backed by stored data (deflate compresses at most ~1032x):
// a corrupt or hostile file cannot make the reader allocate memory it does not hold.
constexpr uint64_t kLargeReadBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxCompressionRatio = 1100;
// More links than any group of schema v1 can hold means the file is not a golden.
constexpr size_t kMaxLinks = 1024;
// Longest string attribute the reader accepts.
constexpr size_t kMaxStringBytes = size_t{1} << 20;

constexpr const char* kFixHint = "; regenerate the file with mok-golden or fix the writer";
// For files HDF5 itself cannot read (a broken copy, damaged metadata).
constexpr const char* kDamagedHint = "; the file is damaged: copy it again, or regenerate it with mok-golden";
constexpr const char* kNotReadableHint =
    "; give a golden made by mok-golden (a copy cut short: copy it again in full)";
constexpr std::array<const char*, 5> kDataGroups = {"inputs", "outputs", "grads", "intermediates",
                                                    "bounds"};

// ---------------------------------------------------------------------------------------------
// HDF5 plumbing: owned ids, silenced error printing, the library's own reason for a failure.

// No library clean-up at exit: every id this file opens is closed by its owner (Hid) before the
// call returns, and after a failed write (a full disk, a file-size limit) HDF 1.10's exit-time
// clean-up of the half-flushed file crashed the process after the error had been reported and
// the temporary file removed (seen with ulimit -f: exit 139 instead of 2). Runs before main(),
// so before the library's first use.
const bool kNoHdf5Atexit = [] {
  H5dont_atexit();
  return true;
}();

class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Hid& operator=(Hid&& other) noexcept {
    if (this != &other) {
      close();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = -1;
    }
    return *this;
  }
  ~Hid() { close(); }
  hid_t get() const { return id_; }
  // Closes now and reports the status (the file's close flushes, so its status matters).
  herr_t close() {
    const hid_t id = id_;
    id_ = -1;
    return id >= 0 ? closer_(id) : 0;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Turns off HDF5's automatic printing of its error stack while mok talks to the library;
// the previous handler comes back afterwards.
class SilenceHdf5 {
 public:
  SilenceHdf5() {
    saved_ok_ = H5Eget_auto2(H5E_DEFAULT, &func_, &data_) >= 0;
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~SilenceHdf5() {
    if (saved_ok_) H5Eset_auto2(H5E_DEFAULT, func_, data_);
  }
  SilenceHdf5(const SilenceHdf5&) = delete;
  SilenceHdf5& operator=(const SilenceHdf5&) = delete;

 private:
  bool saved_ok_ = false;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The most specific message on HDF5's error stack (where the failure was first detected), on one
// line (some of the library's messages span several).
std::string hdf5_detail() {
  std::string detail;
  const auto walk = [](unsigned n, const H5E_error2_t* err, void* client) -> herr_t {
    if (n == 0 && err != nullptr && err->desc != nullptr) {
      *static_cast<std::string*>(client) = err->desc;
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &detail);
  std::replace(detail.begin(), detail.end(), '\n', ' ');
  std::replace(detail.begin(), detail.end(), '\r', ' ');
  while (!detail.empty() && detail.back() == ' ') detail.pop_back();
  return detail.empty() ? "no detail from HDF5" : detail;
}

// The first filter of a dataset's pipeline that this HDF5 library cannot apply, as "lzf (id
// 32000)"; empty when every filter is available (or the dataset has none).
std::string missing_filter(hid_t dset) {
  const hid_t dcpl = H5Dget_create_plist(dset);
  if (dcpl < 0) return "";
  std::string missing;
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n && missing.empty(); ++i) {
    unsigned flags = 0, config = 0;
    size_t nelmts = 0;
    char name[128] = {0};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelmts, nullptr, sizeof name, name,
                                           &config);
    if (id >= 0 && H5Zfilter_avail(id) <= 0)
      missing = std::string(name[0] ? name : "(unnamed)") + " (id " + std::to_string(id) + ")";
  }
  H5Pclose(dcpl);
  return missing;
}

// The system error behind a failed HDF5 call: the file drivers put "errno = N" in their message.
// 0 when the stack holds none.
int hdf5_errno() {
  int found = 0;
  const auto walk = [](unsigned, const H5E_error2_t* err, void* client) -> herr_t {
    const char* at = err != nullptr && err->desc != nullptr ? std::strstr(err->desc, "errno = ") : nullptr;
    int value = 0;
    if (at != nullptr && std::sscanf(at, "errno = %d", &value) == 1 && value > 0) {
      *static_cast<int*>(client) = value;
      return 1;  // stop at the first
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &found);
  return found;
}

// What to do about a write that failed with this errno.
std::string write_fix(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT: return "free space on that file system, or write to another directory";
    case EFBIG: return "the file exceeds a file-size limit (ulimit -f) or the file system's largest file: raise the limit, or write to another file system";
    case EACCES:
    case EPERM:
    case EROFS: return "write to a directory you can write to";
    case EIO: return "the device reported an I/O error: write to another disk";
    default: return "check free space and permissions, or write to another directory";
  }
}

// A file's own dimensions (unsigned, as HDF5 gives them), printed as format_shape prints a shape.
std::string format_dims(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(static_cast<unsigned long long>(dims[i]));
  }
  return s + "]";
}

std::string format_symbols(const TensorSpec& spec) {
  std::string s = "(";
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += dim_symbol(spec.dims[i]);
  }
  return s + ")";
}

// The name a dtype carries in the file's `dtype` attribute (numpy spelling).
const char* file_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
  }
  return "unknown";
}

hid_t file_type_of(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return H5T_STD_U16LE;
    case DType::kF32: return H5T_IEEE_F32LE;
    case DType::kF64: return H5T_IEEE_F64LE;
    case DType::kI32: return H5T_STD_I32LE;
  }
  return H5T_STD_U16LE;
}

hid_t memory_type_of(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return H5T_NATIVE_UINT16;
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kF64: return H5T_NATIVE_DOUBLE;
    case DType::kI32: return H5T_NATIVE_INT32;
  }
  return H5T_NATIVE_UINT16;
}

// Every failure goes through here: "<file>: <where>: <what>", one mok::Error. A writing context
// reports a failed HDF5 call as the system's reason and what to do; a reading one as a damaged file.
class Context {
 public:
  enum class Mode { kRead, kWrite };
  explicit Context(std::string origin, Mode mode = Mode::kRead) : origin_(std::move(origin)), mode_(mode) {}
  const std::string& origin() const { return origin_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(origin_ + ": " + where + (where.empty() ? "" : ": ") + what);
  }
  // "<file>: <subject> <predicate>", e.g. "dataset /inputs/x is missing".
  [[noreturn]] void fail_subject(const std::string& subject, const std::string& predicate) const {
    throw Error(origin_ + ": " + subject + " " + predicate);
  }
  [[noreturn]] void fail_hdf5(const std::string& where, const char* call) const {
    if (mode_ == Mode::kRead) fail(where, std::string(call) + " failed (" + hdf5_detail() + ")" + kDamagedHint);
    // The temporary file's name means nothing to the caller: the reason and the fix do.
    const int err = hdf5_errno();
    const std::string reason = err != 0 ? std::string(std::strerror(err)) + " (writing " + where + ")"
                                        : where + ": " + call + " failed (" + hdf5_detail() + ")";
    throw Error(origin_ + ": cannot write the file: " + reason + "; " + write_fix(err) + "; nothing was written");
  }
  hid_t check(hid_t id, const std::string& where, const char* call) const {
    if (id < 0) fail_hdf5(where, call);
    return id;
  }
  void check_status(herr_t status, const std::string& where, const char* call) const {
    if (status < 0) fail_hdf5(where, call);
  }
  Hid own(hid_t id, Hid::Closer closer, const std::string& where, const char* call) const {
    return Hid(check(id, where, call), closer);
  }

 private:
  std::string origin_;
  Mode mode_;
};

std::string dataset_where(const std::string& path) { return "dataset /" + path; }

// ---------------------------------------------------------------------------------------------
// Writer.

Hid object_create_plist(const Context& ctx, hid_t plist_class, const std::string& where) {
  Hid plist = ctx.own(H5Pcreate(plist_class), H5Pclose, where, "H5Pcreate");
  // No timestamps in object headers: equal content must give equal bytes.
  ctx.check_status(H5Pset_obj_track_times(plist.get(), 0), where, "H5Pset_obj_track_times");
  // Attributes (and links, below) stay in the object header instead of moving to dense
  // storage (fractal heap + B-tree): a simpler layout, and HDF5 1.10 mishandles some
  // corruptions of dense storage (double free) where compact storage gives a clean error.
  ctx.check_status(H5Pset_attr_phase_change(plist.get(), kMaxCompact, kMaxCompact / 2), where,
                   "H5Pset_attr_phase_change");
  if (plist_class == H5P_GROUP_CREATE || plist_class == H5P_FILE_CREATE) {
    ctx.check_status(H5Pset_link_phase_change(plist.get(), kMaxCompact, kMaxCompact / 2), where,
                     "H5Pset_link_phase_change");
  }
  return plist;
}

void write_string_attr(const Context& ctx, hid_t loc, const char* name, const std::string& value,
                       const std::string& where) {
  // Fixed-length strings live inside the object header (no global heap), which keeps the
  // bytes reproducible; h5py reads them as bytes.
  const std::string attr_where = where + " attribute " + name;
  Hid type = ctx.own(H5Tcopy(H5T_C_S1), H5Tclose, attr_where, "H5Tcopy");
  ctx.check_status(H5Tset_size(type.get(), std::max<size_t>(value.size(), 1)), attr_where,
                   "H5Tset_size");
  ctx.check_status(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), attr_where, "H5Tset_strpad");
  ctx.check_status(H5Tset_cset(type.get(), H5T_CSET_UTF8), attr_where, "H5Tset_cset");
  Hid space = ctx.own(H5Screate(H5S_SCALAR), H5Sclose, attr_where, "H5Screate");
  Hid attr = ctx.own(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, attr_where, "H5Acreate2");
  std::string buffer = value;
  buffer.resize(std::max<size_t>(value.size(), 1), '\0');
  ctx.check_status(H5Awrite(attr.get(), type.get(), buffer.data()), attr_where, "H5Awrite");
}

template <class T>
void write_scalar_attr(const Context& ctx, hid_t loc, const char* name, T value, hid_t file_type,
                       hid_t memory_type, const std::string& where) {
  const std::string attr_where = where + " attribute " + name;
  Hid space = ctx.own(H5Screate(H5S_SCALAR), H5Sclose, attr_where, "H5Screate");
  Hid attr = ctx.own(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, attr_where, "H5Acreate2");
  ctx.check_status(H5Awrite(attr.get(), memory_type, &value), attr_where, "H5Awrite");
}

Hid create_group(const Context& ctx, hid_t file, const char* name) {
  const std::string where = std::string("group /") + name;
  Hid gcpl = object_create_plist(ctx, H5P_GROUP_CREATE, where);
  return ctx.own(H5Gcreate2(file, name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose, where,
                 "H5Gcreate2");
}

// The largest divisor of n that is at most limit (at least 1).
hsize_t largest_divisor_at_most(hsize_t n, hsize_t limit) {
  if (limit >= n) return n;
  hsize_t best = 1;
  for (hsize_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    if (i <= limit && i > best) best = i;
    if (n / i <= limit && n / i > best) best = n / i;
  }
  return best;
}

// Chunk dims that divide the shape (no partial edge chunks), filling from the innermost axis.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t elem_bytes) {
  std::vector<hsize_t> chunk(dims.size(), 1);
  hsize_t budget = std::max<hsize_t>(1, kChunkTargetBytes / elem_bytes);
  for (size_t a = dims.size(); a-- > 0;) {
    chunk[a] = largest_divisor_at_most(dims[a], budget);
    budget = std::max<hsize_t>(1, budget / chunk[a]);
  }
  return chunk;
}

void write_dataset(const Context& ctx, hid_t group, const std::string& path, const char* name,
                   const Tensor& tensor) {
  const std::string where = dataset_where(path);
  std::vector<hsize_t> dims(tensor.shape().begin(), tensor.shape().end());
  Hid space = ctx.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                      H5Sclose, where, "H5Screate_simple");
  Hid dcpl = object_create_plist(ctx, H5P_DATASET_CREATE, where);
  const bool compress = tensor.size_bytes() > kCompressAboveBytes && !dims.empty() &&
                        H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 &&
                        H5Zfilter_avail(H5Z_FILTER_SHUFFLE) > 0;
  if (compress) {
    const std::vector<hsize_t> chunk = chunk_dims(dims, dtype_size(tensor.dtype()));
    ctx.check_status(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where,
                     "H5Pset_chunk");
    ctx.check_status(H5Pset_shuffle(dcpl.get()), where, "H5Pset_shuffle");
    ctx.check_status(H5Pset_deflate(dcpl.get(), kDeflateLevel), where, "H5Pset_deflate");
    const uint64_t zero = 0;
    ctx.check_status(H5Pset_fill_value(dcpl.get(), memory_type_of(tensor.dtype()), &zero), where,
                     "H5Pset_fill_value");
  }
  Hid dset = ctx.own(H5Dcreate2(group, name, file_type_of(tensor.dtype()), space.get(), H5P_DEFAULT,
                                dcpl.get(), H5P_DEFAULT),
                     H5Dclose, where, "H5Dcreate2");
  if (tensor.numel() > 0) {
    ctx.check_status(H5Dwrite(dset.get(), memory_type_of(tensor.dtype()), H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, tensor.raw()),
                     where, "H5Dwrite");
  }
  write_string_attr(ctx, dset.get(), "dtype", file_dtype_name(tensor.dtype()), where);
  ctx.check_status(dset.close(), where, "H5Dclose");
}

void write_file(const Context& ctx, const std::string& file_path, const Golden& golden) {
  const std::string root = "root group";
  Hid fcpl = object_create_plist(ctx, H5P_FILE_CREATE, root);
  Hid fapl = ctx.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, root, "H5Pcreate");
  // Fixed format versions: the bytes do not change with the library's defaults, and HDF5 1.8+
  // readers (h5py included) can open the file.
  ctx.check_status(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), root,
                   "H5Pset_libver_bounds");
  Hid file = ctx.own(H5Fcreate(file_path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose,
                     root, "H5Fcreate");

  const GoldenMeta& meta = golden.meta;
  write_string_attr(ctx, file.get(), "format", kGoldenFormat, root);
  write_scalar_attr<int32_t>(ctx, file.get(), "format_version", kGoldenVersion, H5T_STD_I32LE,
                             H5T_NATIVE_INT32, root);
  write_string_attr(ctx, file.get(), "generator", meta.generator, root);
  write_string_attr(ctx, file.get(), "generator_version", meta.generator_version, root);
  write_scalar_attr<uint64_t>(ctx, file.get(), "seed", meta.seed, H5T_STD_U64LE, H5T_NATIVE_UINT64,
                              root);
  write_string_attr(ctx, file.get(), "profile", meta.profile, root);
  write_string_attr(ctx, file.get(), "mma_model", meta.mma_model, root);
  write_string_attr(ctx, file.get(), "routing", meta.routing, root);

  {
    Hid config = create_group(ctx, file.get(), "config");
    const spec::LayerConfig& cfg = golden.cfg;
    const std::array<std::pair<const char*, int64_t>, 7> fields = {{{"H", cfg.hidden},
                                                                    {"I", cfg.intermediate},
                                                                    {"Is", cfg.shared_intermediate},
                                                                    {"E", cfg.num_experts},
                                                                    {"K", cfg.top_k},
                                                                    {"R", cfg.num_ranks},
                                                                    {"T", cfg.tokens_per_rank}}};
    for (const auto& [name, value] : fields) {
      write_scalar_attr<int64_t>(ctx, config.get(), name, value, H5T_STD_I64LE, H5T_NATIVE_INT64,
                                 "group /config");
    }
    write_string_attr(ctx, config.get(), "profile", meta.profile, "group /config");
    write_string_attr(ctx, config.get(), "mma_model", meta.mma_model, "group /config");
    ctx.check_status(config.close(), "group /config", "H5Gclose");
  }

  // Groups and datasets in schema order, so the same content always lays out the same way.
  for (const char* group_name : kDataGroups) {
    const std::string prefix = std::string(group_name) + "/";
    Hid group;
    for (const TensorSpec& spec : golden_schema()) {
      const std::string path = spec.path;
      if (path.compare(0, prefix.size(), prefix) != 0) continue;
      const auto it = golden.tensors.find(path);
      if (it == golden.tensors.end()) continue;
      if (group.get() < 0) group = create_group(ctx, file.get(), group_name);
      write_dataset(ctx, group.get(), path, spec.path + prefix.size(), it->second);
    }
    if (group.get() >= 0) {
      ctx.check_status(group.close(), std::string("group /") + group_name, "H5Gclose");
    }
  }
  ctx.check_status(file.close(), root, "H5Fclose");
}

// ---------------------------------------------------------------------------------------------
// Reader.

bool attr_exists(const Context& ctx, hid_t loc, const char* name, const std::string& where) {
  const htri_t exists = H5Aexists(loc, name);
  if (exists < 0) ctx.fail_hdf5(where + " attribute " + name, "H5Aexists");
  return exists > 0;
}

// Opens a one-element attribute and checks its type class; nullopt when absent.
std::optional<Hid> open_scalar_attr(const Context& ctx, hid_t loc, const char* name,
                                    H5T_class_t expected_class, const char* expected_what,
                                    const std::string& where) {
  if (!attr_exists(ctx, loc, name, where)) return std::nullopt;
  const std::string attr_where = where + " attribute " + name;
  Hid attr = ctx.own(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose, attr_where, "H5Aopen");
  Hid space = ctx.own(H5Aget_space(attr.get()), H5Sclose, attr_where, "H5Aget_space");
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  Hid type = ctx.own(H5Aget_type(attr.get()), H5Tclose, attr_where, "H5Aget_type");
  const H5T_class_t cls = H5Tget_class(type.get());
  if (points != 1 || cls != expected_class) {
    ctx.fail(attr_where, std::string("expected a single ") + expected_what + kFixHint);
  }
  return attr;
}

std::optional<std::string> read_string_attr(const Context& ctx, hid_t loc, const char* name,
                                            const std::string& where) {
  std::optional<Hid> attr = open_scalar_attr(ctx, loc, name, H5T_STRING, "string", where);
  if (!attr) return std::nullopt;
  const std::string attr_where = where + " attribute " + name;
  Hid type = ctx.own(H5Aget_type(attr->get()), H5Tclose, attr_where, "H5Aget_type");
  const htri_t variable = H5Tis_variable_str(type.get());
  ctx.check(variable, attr_where, "H5Tis_variable_str");
  Hid memory_type = ctx.own(H5Tcopy(H5T_C_S1), H5Tclose, attr_where, "H5Tcopy");
  // HDF5 converts between ASCII and UTF-8 strings only when the character sets agree.
  const H5T_cset_t cset = H5Tget_cset(type.get());
  if (cset < 0) ctx.fail_hdf5(attr_where, "H5Tget_cset");
  ctx.check_status(H5Tset_cset(memory_type.get(), cset), attr_where, "H5Tset_cset");
  if (variable > 0) {
    // Written by h5py and friends: a variable-length string.
    ctx.check_status(H5Tset_size(memory_type.get(), H5T_VARIABLE), attr_where, "H5Tset_size");
    char* text = nullptr;
    ctx.check_status(H5Aread(attr->get(), memory_type.get(), &text), attr_where, "H5Aread");
    std::string value = text != nullptr ? std::string(text, strnlen(text, kMaxStringBytes)) : "";
    if (text != nullptr) H5free_memory(text);
    return value;
  }
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > kMaxStringBytes) {
    ctx.fail(attr_where, "string of " + std::to_string(size) + " bytes is out of range" + kFixHint);
  }
  ctx.check_status(H5Tset_size(memory_type.get(), size), attr_where, "H5Tset_size");
  ctx.check_status(H5Tset_strpad(memory_type.get(), H5T_STR_NULLPAD), attr_where, "H5Tset_strpad");
  std::string buffer(size, '\0');
  ctx.check_status(H5Aread(attr->get(), memory_type.get(), buffer.data()), attr_where, "H5Aread");
  // A NUL ends the text; anything but padding after it ("bfloat16\0junk") is not this value.
  const size_t length = strnlen(buffer.c_str(), size);
  if (buffer.find_first_not_of('\0', length) != std::string::npos)
    ctx.fail(attr_where, "holds bytes after the NUL that ends \"" + buffer.substr(0, length) +
                             "\" (a string attribute is its text, padded with NULs only)" + kFixHint);
  buffer.resize(length);
  return buffer;
}

// Reads an integer attribute of any signedness and width up to 64 bits as T (int64_t or
// uint64_t). HDF5's own conversion would clamp a value out of T's range (2^64 - 1 read as
// 2^63 - 1, -1 read as 0): such a value is an error naming the stored number.
template <class T>
std::optional<T> read_integer_attr(const Context& ctx, hid_t loc, const char* name, const std::string& where) {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>);
  std::optional<Hid> attr = open_scalar_attr(ctx, loc, name, H5T_INTEGER, "integer", where);
  if (!attr) return std::nullopt;
  const std::string attr_where = where + " attribute " + name;
  Hid type = ctx.own(H5Aget_type(attr->get()), H5Tclose, attr_where, "H5Aget_type");
  const H5T_sign_t sign = H5Tget_sign(type.get());
  if (sign == H5T_SGN_ERROR) ctx.fail_hdf5(attr_where, "H5Tget_sign");
  if (H5Tget_size(type.get()) > 8) ctx.fail(attr_where, "expected an integer of at most 64 bits" + std::string(kFixHint));
  if (sign == H5T_SGN_NONE) {
    uint64_t value = 0;
    ctx.check_status(H5Aread(attr->get(), H5T_NATIVE_UINT64, &value), attr_where, "H5Aread");
    if (std::is_same_v<T, int64_t> && value > static_cast<uint64_t>(INT64_MAX))
      ctx.fail(attr_where, "is " + std::to_string(value) + ", out of range (at most 2^63 - 1)" + kFixHint);
    return static_cast<T>(value);
  }
  int64_t value = 0;
  ctx.check_status(H5Aread(attr->get(), H5T_NATIVE_INT64, &value), attr_where, "H5Aread");
  if (std::is_same_v<T, uint64_t> && value < 0)
    ctx.fail(attr_where, "is " + std::to_string(value) + ", but it is a whole number from 0 to 2^64 - 1" + kFixHint);
  return static_cast<T>(value);
}

std::vector<std::string> list_links(const Context& ctx, hid_t group, const std::string& where) {
  // Native order walks the link storage directly (no sorted table is built, a path where
  // HDF5 1.10 can crash on corrupt files); the names are sorted here instead.
  std::vector<std::string> names;
  const auto collect = [](hid_t, const char* name, const H5L_info_t*, void* client) -> herr_t {
    auto* out = static_cast<std::vector<std::string>*>(client);
    if (out->size() >= kMaxLinks) return 1;  // stop: no valid golden has this many
    out->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect, &names) < 0) {
    ctx.fail_hdf5(where, "H5Literate");
  }
  if (names.size() >= kMaxLinks) {
    ctx.fail_subject(where, "holds more than " + std::to_string(kMaxLinks - 1) +
                                " objects, more than schema v1 has" + std::string(kFixHint));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Opens /<name> and checks that it is a hard link to the expected kind of object (soft and
// external links could point anywhere, even into other files).
Hid open_object(const Context& ctx, hid_t loc, const std::string& name, H5I_type_t expected,
                const std::string& where) {
  H5L_info_t link;
  ctx.check_status(H5Lget_info(loc, name.c_str(), &link, H5P_DEFAULT), where, "H5Lget_info");
  if (link.type != H5L_TYPE_HARD) {
    ctx.fail_subject(where, "is a soft or external link; golden files hold their objects directly" +
                                std::string(kFixHint));
  }
  Hid object = ctx.own(H5Oopen(loc, name.c_str(), H5P_DEFAULT), H5Oclose, where, "H5Oopen");
  if (H5Iget_type(object.get()) != expected) {
    ctx.fail_subject(where, std::string("is not ") +
                                (expected == H5I_GROUP ? "a group" : "a dataset") + kFixHint);
  }
  return object;
}

std::string describe_stored_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const std::string bits = std::to_string(size * 8);
  switch (cls) {
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield" + bits;
    case H5T_REFERENCE: return "reference";
    case H5T_VLEN: return "variable-length";
    case H5T_TIME: return "time";
    default: return "an unknown type";
  }
}

bool stored_type_matches(hid_t type, DType dtype) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  switch (dtype) {
    case DType::kBf16: return cls == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE;
    case DType::kI32: return cls == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2;
    case DType::kF32: return cls == H5T_FLOAT && size == 4;
    case DType::kF64: return cls == H5T_FLOAT && size == 8;
  }
  return false;
}

std::string expected_type_text(DType dtype) {
  if (dtype == DType::kBf16) return "bfloat16 (stored as uint16 with attribute dtype=\"bfloat16\")";
  return file_dtype_name(dtype);
}

// What a dataset must be before its data is read: the schema's shape and dtype (where its data
// lies, in this file and written, is check_storage's, after the memory check). Throws (naming the
// dataset) otherwise.
void check_dataset(const Context& ctx, hid_t dset_id, const std::string& path, const TensorSpec& spec,
                   const spec::LayerConfig& cfg);

// Opens the dataset and checks it (check_dataset).
Hid open_dataset(const Context& ctx, hid_t file, const std::string& path, const TensorSpec& spec,
                 const spec::LayerConfig& cfg) {
  Hid dset = open_object(ctx, file, "/" + path, H5I_DATASET, dataset_where(path));
  check_dataset(ctx, dset.get(), path, spec, cfg);
  return dset;
}

void check_dataset(const Context& ctx, hid_t dset_id, const std::string& path, const TensorSpec& spec,
                   const spec::LayerConfig& cfg) {
  const std::string where = dataset_where(path);

  Hid space = ctx.own(H5Dget_space(dset_id), H5Sclose, where, "H5Dget_space");
  const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
  const std::vector<int64_t> expected = spec_shape(spec, cfg);
  std::vector<hsize_t> found;
  if (space_class == H5S_SIMPLE) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > H5S_MAX_RANK) ctx.fail_hdf5(where, "H5Sget_simple_extent_ndims");
    found.resize(static_cast<size_t>(rank));
    if (H5Sget_simple_extent_dims(space.get(), found.data(), nullptr) < 0) {
      ctx.fail_hdf5(where, "H5Sget_simple_extent_dims");
    }
  } else if (space_class != H5S_SCALAR) {
    ctx.fail(where, "expected shape " + format_shape(expected) + " " + format_symbols(spec) +
                        " but the dataspace is empty (null)" + kFixHint);
  }
  bool shape_ok = found.size() == expected.size();
  for (size_t a = 0; shape_ok && a < found.size(); ++a) {
    shape_ok = found[a] == static_cast<hsize_t>(expected[a]);
  }
  if (!shape_ok) {
    ctx.fail(where, "expected shape " + format_shape(expected) + " " + format_symbols(spec) +
                        " but found " + format_dims(found) + kFixHint);
  }

  Hid type = ctx.own(H5Dget_type(dset_id), H5Tclose, where, "H5Dget_type");
  if (!stored_type_matches(type.get(), spec.dtype)) {
    ctx.fail(where, "expected dtype " + expected_type_text(spec.dtype) + " but found " +
                        describe_stored_type(type.get()) + kFixHint);
  }
  // DESIGN section 7 names the attribute for bf16 (stored as uint16, which the attribute tells
  // apart from an integer tensor); a float32 or int32 dataset is its HDF5 type, so there the
  // attribute may be left out (a candidate written with h5py from numpy), but must be right if given.
  const std::optional<std::string> dtype_attr = read_string_attr(ctx, dset_id, "dtype", where);
  if (!dtype_attr && spec.dtype != DType::kBf16) return;
  if (!dtype_attr) {
    ctx.fail(where, std::string("attribute dtype is missing (expected \"") +
                        file_dtype_name(spec.dtype) + "\": a bf16 tensor is stored as uint16 with it)" + kFixHint);
  }
  if (*dtype_attr != file_dtype_name(spec.dtype)) {
    ctx.fail(where, std::string("attribute dtype is \"") + *dtype_attr +
                        "\" but the schema says \"" + file_dtype_name(spec.dtype) + "\"" +
                        kFixHint);
  }

}

// The data must be in this file and written: HDF5 reads a dataset whose storage lies in an
// external raw file or in other files (virtual), or was never written, without an error (zeros,
// the fill value, or whatever the other file holds). Checked right before the read (after the
// memory check, so a layer too large for the machine is named as such first).
void check_storage(const Context& ctx, hid_t dset_id, const std::string& where, const std::vector<int64_t>& expected) {
  std::vector<hsize_t> found(expected.begin(), expected.end());
  Hid space = ctx.own(H5Dget_space(dset_id), H5Sclose, where, "H5Dget_space");
  Hid dcpl = ctx.own(H5Dget_create_plist(dset_id), H5Pclose, where, "H5Dget_create_plist");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL)
    ctx.fail_subject(where, "is a virtual dataset (its data lives in other files); golden files hold their data "
                            "directly: write the tensor into this file (e.g. copy it with h5py), or regenerate the "
                            "file with mok-golden");
  if (H5Pget_external_count(dcpl.get()) > 0)
    ctx.fail_subject(where, "keeps its data in an external raw file; golden files hold their data directly: write "
                            "the tensor into this file (e.g. copy it with h5py), or regenerate the file with "
                            "mok-golden");
  // Written means: contiguous storage allocated, or every chunk of a chunked one (HDF5's space
  // status calls a compressed dataset "partly allocated", so chunks are counted instead). A
  // tensor with no elements (no shared expert, say) has nothing to write.
  const bool empty = std::any_of(expected.begin(), expected.end(), [](int64_t d) { return d == 0; });
  std::string unwritten;
  if (!empty && layout == H5D_CONTIGUOUS) {
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    if (H5Dget_space_status(dset_id, &status) < 0) ctx.fail_hdf5(where, "H5Dget_space_status");
    if (status == H5D_SPACE_STATUS_NOT_ALLOCATED) unwritten = "no data written (created but never filled)";
  } else if (!empty && layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(found.size());
    if (H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) != static_cast<int>(chunk.size()))
      ctx.fail_hdf5(where, "H5Pget_chunk");
    hsize_t want = 1;
    for (size_t a = 0; a < chunk.size(); ++a) want *= chunk[a] == 0 ? 0 : (found[a] + chunk[a] - 1) / chunk[a];
    hsize_t have = 0;
    if (H5Dget_num_chunks(dset_id, space.get(), &have) < 0) ctx.fail_hdf5(where, "H5Dget_num_chunks");
    if (have < want)
      unwritten = "parts that were never written (" + std::to_string(have) + " of its " + std::to_string(want) +
                  " chunks are stored)";
  }
  if (!unwritten.empty())
    ctx.fail_subject(where, "has " + unwritten +
                                "; reading it would give its fill value, not data: write the tensor, or regenerate "
                                "the file with mok-golden");
}

// Reads a dataset that open_dataset() opened and checked.
Tensor read_dataset(const Context& ctx, const Hid& dset, const std::string& path, const TensorSpec& spec,
                    const spec::LayerConfig& cfg) {
  const std::string where = dataset_where(path);
  const std::vector<int64_t> expected = spec_shape(spec, cfg);
  check_storage(ctx, dset.get(), where, expected);

  // Shapes come from a validated config, but their product can still be absurd; make sure the
  // file really holds that much data before allocating it.
  uint64_t numel = 1;
  for (int64_t d : expected) {
    if (d != 0 && numel > UINT64_MAX / static_cast<uint64_t>(d) / 8) {
      ctx.fail(where, "shape " + format_shape(expected) + " is too large to load" + std::string(kFixHint));
    }
    numel *= static_cast<uint64_t>(d);
  }
  const uint64_t bytes = numel * dtype_size(spec.dtype);
  if (bytes > kLargeReadBytes) {
    const uint64_t stored = H5Dget_storage_size(dset.get());
    if (stored == 0 || bytes / stored > kMaxCompressionRatio) {
      ctx.fail(where, "claims " + std::to_string(bytes) + " bytes but stores only " +
                          std::to_string(stored) + "; the file is corrupt" + kFixHint);
    }
  }

  Tensor tensor;
  try {
    tensor = Tensor(spec.dtype, expected);
  } catch (const AllocationError&) {
    ctx.fail(where, "cannot allocate " + format_bytes(bytes) +
                        " to load it (out of memory); run on a machine with more memory, or use a golden of a "
                        "smaller layer");
  }
  if (tensor.numel() > 0 && H5Dread(dset.get(), memory_type_of(spec.dtype), H5S_ALL, H5S_ALL,
                                    H5P_DEFAULT, tensor.raw()) < 0) {
    const std::string detail = hdf5_detail();
    // A filter this HDF5 library lacks (h5py's lzf, a plugin's) fails the read of an intact file.
    if (const std::string filter = missing_filter(dset.get()); !filter.empty())
      ctx.fail(where, "compressed with the HDF5 filter " + filter +
                          ", which this program's HDF5 library lacks, so it cannot be read (the file may be "
                          "intact): let HDF5 find the filter's plugin (HDF5_PLUGIN_PATH, e.g. from the hdf5plugin "
                          "Python package), or rewrite the file where the filter is available (h5py has lzf) "
                          "without compression or with gzip");
    ctx.fail(where, "reading the data failed (" + detail + "); the file is truncated or corrupt" + kFixHint);
  }
  return tensor;
}

int64_t require_config_attr(const Context& ctx, hid_t config, const char* name) {
  const std::optional<int64_t> v =
      read_integer_attr<int64_t>(ctx, config, name, "group /config");
  if (!v) {
    ctx.fail("group /config", std::string("attribute ") + name + " is missing" + kFixHint);
  }
  return *v;
}

// Root profile/mma_model are copies of /config's; when both exist they must agree.
std::string merged_string(const Context& ctx, const std::optional<std::string>& root_value,
                          const std::optional<std::string>& config_value, const char* name) {
  if (!config_value && !root_value) {
    ctx.fail("group /config", std::string("attribute ") + name + " is missing" + kFixHint);
  }
  if (config_value && root_value && *config_value != *root_value) {
    ctx.fail("group /config", std::string("attribute ") + name + " is \"" + *config_value +
                                  "\" but the root attribute says \"" + *root_value + "\"" +
                                  kFixHint);
  }
  return config_value ? *config_value : *root_value;
}

void read_file(const Context& ctx, hid_t file, const ReadOptions& options, Golden& golden) {
  const std::string root = "root group";
  const std::optional<std::string> format = read_string_attr(ctx, file, "format", root);
  if (!format) {
    ctx.fail("",
             std::string("not a mok golden file: root attribute format is missing (expected \"") +
                 kGoldenFormat + "\"); give a golden made by mok-golden (or, as a candidate for mok-verify "
                                 "compare, a copy of one with your tensors written over its own: README.md, 'Golden files')");
  }
  if (*format != kGoldenFormat) {
    ctx.fail("", "not a mok golden file: root attribute format is \"" + *format +
                     "\", expected \"" + kGoldenFormat + "\"; give a golden made by mok-golden");
  }
  const std::optional<int64_t> version =
      read_integer_attr<int64_t>(ctx, file, "format_version", root);
  if (!version) ctx.fail(root, "attribute format_version is missing" + std::string(kFixHint));
  if (*version != kGoldenVersion) {
    ctx.fail(root, "format_version " + std::to_string(*version) +
                       " is not supported (this reader reads version " +
                       std::to_string(kGoldenVersion) +
                       "); use a matching mok build, or regenerate the file with mok-golden");
  }

  GoldenMeta& meta = golden.meta;
  // The root attributes the format defines (DESIGN.md, golden format): generator, its version
  // and the seed are required; routing is descriptive and may be absent.
  auto required = [&](auto value, const char* name) {
    if (!value) ctx.fail(root, std::string("attribute ") + name + " is missing" + kFixHint);
    return *value;
  };
  meta.generator = required(read_string_attr(ctx, file, "generator", root), "generator");
  meta.generator_version = required(read_string_attr(ctx, file, "generator_version", root), "generator_version");
  meta.seed = required(read_integer_attr<uint64_t>(ctx, file, "seed", root), "seed");
  meta.routing = read_string_attr(ctx, file, "routing", root).value_or("");
  const std::optional<std::string> root_profile = read_string_attr(ctx, file, "profile", root);
  const std::optional<std::string> root_mma = read_string_attr(ctx, file, "mma_model", root);

  // Root members: the config group and the data groups, nothing else.
  const std::vector<std::string> members = list_links(ctx, file, root);
  for (const std::string& name : members) {
    bool known = name == "config";
    for (const char* group : kDataGroups) known = known || name == group;
    if (!known) {
      ctx.fail_subject("object /" + name,
                       "is not part of schema v1 (the root holds /config, /inputs, "
                       "/outputs, /grads, /intermediates, /bounds)" +
                           std::string(kFixHint));
    }
  }
  if (std::find(members.begin(), members.end(), "config") == members.end()) {
    ctx.fail_subject("group /config", "is missing" + std::string(kFixHint));
  }
  {
    Hid config = open_object(ctx, file, "/config", H5I_GROUP, "group /config");
    spec::LayerConfig& cfg = golden.cfg;
    cfg.hidden = require_config_attr(ctx, config.get(), "H");
    cfg.intermediate = require_config_attr(ctx, config.get(), "I");
    cfg.shared_intermediate = require_config_attr(ctx, config.get(), "Is");
    cfg.num_experts = require_config_attr(ctx, config.get(), "E");
    cfg.top_k = require_config_attr(ctx, config.get(), "K");
    cfg.num_ranks = require_config_attr(ctx, config.get(), "R");
    cfg.tokens_per_rank = require_config_attr(ctx, config.get(), "T");
    meta.profile =
        merged_string(ctx, root_profile,
                      read_string_attr(ctx, config.get(), "profile", "group /config"), "profile");
    meta.mma_model = merged_string(
        ctx, root_mma, read_string_attr(ctx, config.get(), "mma_model", "group /config"),
        "mma_model");
  }
  // A damaged file is reported as damaged (exit 2) before its numerics are judged: the config
  // first, then whether the profile and MMA model are names at all (lower-case letters, digits,
  // '-', '_', '.'; like "bf16-v1"), and only then whether this build implements them (exit 3).
  const spec::Status cfg_status = golden.cfg.validate();
  if (!cfg_status.ok) ctx.fail("group /config", cfg_status.message + std::string(kFixHint));
  auto is_name = [](const std::string& v) {
    return !v.empty() && v.size() <= 64 && std::all_of(v.begin(), v.end(), [](char c) {
             return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
           });
  };
  for (const auto& [what, value] : {std::pair<const char*, const std::string*>{"profile", &meta.profile},
                                    {"mma_model", &meta.mma_model}})
    if (!is_name(*value))
      ctx.fail(root, std::string("attribute ") + what + " is \"" + *value +
                         "\", not the name of a numerics profile or MMA model (like \"bf16-v1\")" + kFixHint);
  // The numerics the file was made under must be the ones this build emulates: another
  // profile's or MMA model's bits would be compared against the wrong rules.
  const GoldenMeta ours;
  if (meta.profile != ours.profile || meta.mma_model != ours.mma_model)
    throw Error(ctx.origin() + ": made under profile \"" + meta.profile + "\" and MMA model \"" + meta.mma_model +
                    "\"; this build implements profile \"" + ours.profile + "\" with MMA model \"" + ours.mma_model +
                    "\" only: use a build of that profile, or regenerate the file with this one's mok-golden",
                ErrorKind::kUnsupported);

  std::vector<std::pair<std::string, const TensorSpec*>> to_load;
  for (const char* group_name : kDataGroups) {
    const std::string group_str = group_name;
    if (group_str == "intermediates" && !options.load_intermediates) continue;
    if (group_str == "bounds" && !options.load_bounds) continue;
    if (std::find(members.begin(), members.end(), group_str) == members.end()) continue;
    const std::string group_where = "group /" + group_str;
    Hid group = open_object(ctx, file, "/" + group_str, H5I_GROUP, group_where);
    for (const std::string& name : list_links(ctx, group.get(), group_where)) {
      const std::string path = group_str + "/" + name;
      const TensorSpec* spec = find_spec(path);
      if (spec == nullptr) {
        ctx.fail_subject(dataset_where(path), "is not part of schema v1" + std::string(kFixHint));
      }
      if (!spec_applies(*spec, golden.cfg)) {
        ctx.fail_subject(dataset_where(path),
                         "is present but config Is = 0 (no shared expert)" + std::string(kFixHint));
      }
      to_load.emplace_back(path, spec);
    }
  }

  // Every dataset's shape and dtype first: a config that disagrees with the datasets is a damaged
  // file, not a layer too large for this machine.
  std::vector<Hid> opened;
  opened.reserve(to_load.size());
  for (const auto& [path, spec] : to_load) opened.push_back(open_dataset(ctx, file, path, *spec, golden.cfg));
  // What loading takes is known from the config before anything is allocated: a layer too large
  // for this machine is refused here, by name, rather than failing (or being killed) halfway.
  double need = 0, largest = 0;
  std::string largest_path;
  for (const auto& [path, spec] : to_load) {
    const double bytes = spec_bytes(*spec, golden.cfg);
    need += bytes;
    if (bytes > largest) {
      largest = bytes;
      largest_path = path;
    }
  }
  const std::optional<uint64_t> available = available_memory_bytes();
  if (available && need > static_cast<double>(*available)) {
    ctx.fail("", "loading its datasets takes " + format_bytes_estimate(need) +
                     " of memory (the largest, /" + largest_path + ", " + format_bytes_estimate(largest) +
                     "), but only " + format_bytes(*available) +
                     " can be allocated here (memory limits, the machine's memory and swap); run on a machine with more "
                     "memory, or use a golden of a smaller layer");
  }
  for (size_t i = 0; i < to_load.size(); ++i)
    golden.tensors.emplace(to_load[i].first, read_dataset(ctx, opened[i], to_load[i].first, *to_load[i].second, golden.cfg));
}

// ---------------------------------------------------------------------------------------------
// Value checks.

// Stored bounds: a radius is a finite number >= 0 or NaN (not sampled), bound material likewise,
// and a value with a radius is finite; anything else would judge (or skip) elements wrongly.
void check_bound_values(const Context& ctx, const Golden& golden) {
  const auto topk_it = golden.tensors.find("inputs/topk_experts");
  const Tensor* topk = topk_it == golden.tensors.end() ? nullptr : &topk_it->second;
  for (const auto& [path, tensor] : golden.tensors) {
    const Role role = find_spec(path)->role;
    if (!is_bound_role(role)) continue;
    const std::string checked = checked_path_of_bound(path);
    const TensorSpec& checked_spec = *find_spec(checked);
    const float* v = tensor.data<float>();
    const bool exact = role == Role::kBoundExact || role == Role::kEndToEndExact;
    const float* radius = nullptr;
    if (exact) {
      const std::string partner = role == Role::kBoundExact ? bound_radius_path(checked) : end_to_end_radius_path(checked);
      radius = golden.tensors.at(partner).data<float>();  // pairs are checked before values
    }
    const auto number = [](float x) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", static_cast<double>(x));
      return std::string(text);
    };
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      const float x = v[i];
      std::string problem;
      if (exact && !std::isnan(radius[i]) && !std::isfinite(x))
        problem = "is " + number(x) + " where its radius is " + number(radius[i]) +
                  "; a value with a radius must be finite";
      else if (!exact && !std::isnan(x) && !(x >= 0 && std::isfinite(x)))
        problem = "is " + number(x) + (role == Role::kBoundTerms ? "; a sum of |terms|" : "; a radius") +
                  " must be a finite number >= 0 (NaN: not sampled)";
      if (problem.empty()) continue;
      ctx.fail(dataset_where(path), "element " + locate(checked_spec, golden.cfg, i, topk) + " " + problem +
                                        "; regenerate the file's bounds with mok-golden");
    }
  }
}

void check_values(const Context& ctx, const Golden& golden) {
  check_input_values(golden.cfg, golden.tensors, ctx.origin(), kFixHint);
  check_bound_values(ctx, golden);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API.

void validate_golden(const Golden& golden, const std::string& origin, const ReadOptions& options) {
  const Context ctx(origin);
  const spec::Status cfg_status = golden.cfg.validate();
  if (!cfg_status.ok) ctx.fail("config", cfg_status.message + std::string(kFixHint));

  for (const auto& [path, tensor] : golden.tensors) {
    const TensorSpec* spec = find_spec(path);
    if (spec == nullptr)
      ctx.fail_subject(dataset_where(path), "is not part of schema v1" + std::string(kFixHint));
    if (!spec_applies(*spec, golden.cfg)) {
      ctx.fail_subject(dataset_where(path),
                       "is present but config Is = 0 (no shared expert)" + std::string(kFixHint));
    }
    const std::vector<int64_t> expected = spec_shape(*spec, golden.cfg);
    if (tensor.shape() != expected) {
      ctx.fail(dataset_where(path), "expected shape " + format_shape(expected) + " " +
                                        format_symbols(*spec) + " but found " +
                                        tensor.shape_string() + kFixHint);
    }
    if (tensor.dtype() != spec->dtype) {
      ctx.fail(dataset_where(path), "expected dtype " + expected_type_text(spec->dtype) +
                                        " but found " + file_dtype_name(tensor.dtype()) + kFixHint);
    }
  }

  // A candidate file (another backend's results; ReadOptions::require_inputs false) may hold
  // outputs and gradients alone.
  for (const TensorSpec& spec : golden_schema()) {
    if (!options.require_inputs) break;
    if (spec.role != Role::kInput || !spec_applies(spec, golden.cfg)) continue;
    const std::string path = spec.path;
    if (path == "inputs/d_output") continue;  // forward-only cases have no d_output
    if (golden.tensors.count(path) == 0) {
      ctx.fail_subject(dataset_where(path),
                       "is missing (required input: " + std::string(spec.what) + ", " +
                           format_symbols(spec) + " " + file_dtype_name(spec.dtype) + ")" +
                           kFixHint);
    }
  }

  // Bounds belong to a tensor the file holds: bounds of a missing output or gradient would leave
  // it unchecked while looking checked (the verifier judges the tensors a golden holds).
  for (const auto& [path, tensor] : golden.tensors) {
    if (!is_bound_role(find_spec(path)->role)) continue;
    const std::string checked = checked_path_of_bound(path);
    if (golden.tensors.count(checked) == 0)
      ctx.fail_subject(dataset_where(path), "is present but /" + checked +
                                                ", the tensor it bounds, is missing; regenerate the file with "
                                                "mok-golden, or remove the bounds of /" + checked + " too");
  }

  // A backward pass gives every gradient: a golden holding some of them would leave the others
  // unchecked. (Candidate files may lack any; comparing them fails on what they lack.)
  if (options.require_inputs) {
    std::string present;
    for (const auto& [path, tensor] : golden.tensors)
      if (path.rfind("grads/", 0) == 0) present = path;
    for (const TensorSpec& spec : golden_schema()) {
      if (present.empty()) break;
      if (spec.role != Role::kGrad || !spec_applies(spec, golden.cfg) || golden.tensors.count(spec.path)) continue;
      ctx.fail_subject(dataset_where(spec.path),
                       "is missing, but the file holds other gradients (/" + present +
                           "); a backward pass gives every gradient: regenerate the file with mok-golden, or remove "
                           "/grads, its bounds and the backward intermediates (/intermediates/dy, d_*, dx_*, shared_d_*) "
                           "for a forward-only case");
    }
  }

  // Bounds come in pairs, value and radius: one without the other would silently skip the check.
  for (const auto& [path, tensor] : golden.tensors) {
    const Role role = find_spec(path)->role;
    if (role != Role::kBoundExact && role != Role::kBoundRadius && role != Role::kEndToEndExact &&
        role != Role::kEndToEndRadius)
      continue;
    const std::string checked = checked_path_of_bound(path);
    const bool e2e = role == Role::kEndToEndExact || role == Role::kEndToEndRadius;
    const std::string exact = e2e ? end_to_end_exact_path(checked) : bound_exact_path(checked);
    const std::string radius = e2e ? end_to_end_radius_path(checked) : bound_radius_path(checked);
    const std::string& partner = path == exact ? radius : exact;
    if (golden.tensors.count(partner) == 0) {
      ctx.fail_subject(dataset_where(path),
                       "is present without /" + partner + " (the bounds of " + checked +
                           " are a pair, oracle value and radius); regenerate the file's bounds with "
                           "mok-golden, or remove both datasets");
    }
  }

  // Backward results are computed from /inputs/d_output: a file with gradients, backward
  // intermediates or their bounds but without d_output is inconsistent (its backward content could
  // never be checked). Candidate files (require_inputs false) hold no inputs, so only goldens.
  if (options.require_inputs && golden.tensors.count("inputs/d_output") == 0) {
    std::string culprit;  // named in the message: a gradient before an intermediate before a bound
    int culprit_rank = 3;
    for (const auto& [path, tensor] : golden.tensors) {
      std::string judged = path;
      if (is_bound_role(find_spec(path)->role)) judged = checked_path_of_bound(path);
      const bool backward = judged.rfind("grads/", 0) == 0 || is_backward_intermediate(judged);
      const int rank = path.rfind("grads/", 0) == 0 ? 0 : path.rfind("intermediates/", 0) == 0 ? 1 : 2;
      if (backward && rank < culprit_rank) {
        culprit = path;
        culprit_rank = rank;
      }
    }
    if (!culprit.empty()) {
      ctx.fail_subject(dataset_where(culprit),
                       "belongs to a backward pass, but dataset /inputs/d_output (the gradient the backward pass "
                       "starts from) is missing; regenerate the file with mok-golden, or remove the backward "
                       "datasets (/grads, the backward /intermediates and their /bounds) for a forward-only case");
    }
  }

  if (options.check_values) check_values(ctx, golden);
}

std::string check_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("the output path is empty; give a file name such as case.h5");
  std::error_code ec;
  const fs::path target = follow_links(path, path);
  // HDF5 needs a file it can seek in and a temporary beside it: no device, pipe or standard
  // stream (/dev/stdout is a link into /proc that resolves to no real file name).
  if (fs::is_directory(fs::status(path, ec)))
    throw Error(path + ": is a directory; give the path of a file to write, e.g. " + (fs::path(path) / "case.h5").string());
  if (is_stream_or_device(path))
    throw Error(path + ": is not a regular file (a device, a pipe or a standard stream); give the path of a file to write");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw Error(path + ": '" + dir.string() + "' " +
                (fs::exists(dir, ec) ? "is not a directory; choose another path"
                                     : "does not exist; create the directory first"));
  // The temporary file beside it takes a suffix (".tmp." and the process id): its name must
  // still fit the file system's limit.
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name_len = target.filename().string().size() + 5 + std::to_string(static_cast<long>(::getpid())).size();
  if (name_max > 0 && name_len > static_cast<size_t>(name_max))
    throw Error(path + ": the file name is too long for this file system (at most " +
                std::to_string(name_max - static_cast<long>(name_len - target.filename().string().size())) +
                " characters leave room for the temporary file's suffix); choose a shorter name");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(path + ": no permission to write in '" + dir.string() + "'; choose a directory you can write to");
  return target.string();
}

namespace {

// The temporary file being written, and the dispositions the handlers replaced, for the signal
// handlers below (fixed storage: a handler may only call async-signal-safe functions such as
// unlink, sigaction and raise).
char g_tmp_path[4096];
volatile sig_atomic_t g_tmp_live = 0;
constexpr std::array<int, 3> kTmpSignals{SIGINT, SIGTERM, SIGHUP};
std::array<struct sigaction, 3> g_old_actions{};

// Removes the temporary file, puts the previous disposition back and raises the signal again,
// so whatever the program had arranged for it (its own handler, or the default: terminate)
// happens as if this writer had not been there.
extern "C" void remove_tmp_and_reraise(int sig) {
  if (g_tmp_live) ::unlink(g_tmp_path);
  for (size_t i = 0; i < kTmpSignals.size(); ++i)
    if (kTmpSignals[i] == sig) sigaction(sig, &g_old_actions[i], nullptr);
  ::raise(sig);
}

// Installs the handlers for the lifetime of a write and restores the previous ones. A signal
// that is ignored (nohup, a background job) stays ignored.
class TmpFileGuard {
 public:
  explicit TmpFileGuard(const std::string& tmp) {
    const size_t n = std::min(tmp.size(), sizeof g_tmp_path - 1);
    std::memcpy(g_tmp_path, tmp.data(), n);
    g_tmp_path[n] = '\0';
    g_tmp_live = 1;
    struct sigaction sa {};
    sa.sa_handler = remove_tmp_and_reraise;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kTmpSignals.size(); ++i) {
      sigaction(kTmpSignals[i], nullptr, &g_old_actions[i]);
      installed_[i] = g_old_actions[i].sa_handler != SIG_IGN;
      if (installed_[i]) sigaction(kTmpSignals[i], &sa, nullptr);
    }
  }
  ~TmpFileGuard() {
    for (size_t i = 0; i < kTmpSignals.size(); ++i)
      if (installed_[i]) sigaction(kTmpSignals[i], &g_old_actions[i], nullptr);
    g_tmp_live = 0;
  }
  TmpFileGuard(const TmpFileGuard&) = delete;
  TmpFileGuard& operator=(const TmpFileGuard&) = delete;

 private:
  std::array<bool, 3> installed_{};
};

}  // namespace

void write_golden(const std::string& path, const Golden& golden) {
  // A file the reader would refuse is not written: the numerics must be this build's.
  const GoldenMeta ours;
  if (golden.meta.profile != ours.profile || golden.meta.mma_model != ours.mma_model)
    throw Error(path + ": meta says profile \"" + golden.meta.profile + "\" and MMA model \"" + golden.meta.mma_model +
                "\"; this build writes \"" + ours.profile + "\" / \"" + ours.mma_model + "\" only",
                ErrorKind::kUnsupported);
  // Structure, and stored bounds: a writer may record non-finite or badly routed inputs (the
  // reader flags them), but a bound the reader would refuse is a writer's bug, not a recording.
  ReadOptions structure_only;
  structure_only.check_values = false;
  validate_golden(golden, path, structure_only);

  const std::string target = check_output_path(path);
  const SilenceHdf5 silence;
  const Context ctx(path, Context::Mode::kWrite);
  check_bound_values(ctx, golden);
  const std::string tmp_path = target + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  const TmpFileGuard guard(tmp_path);
  try {
    write_file(ctx, tmp_path, golden);
    std::error_code ec;
    std::filesystem::rename(tmp_path, target, ec);
    if (ec)
      ctx.fail("", "cannot move the finished file into place: " + ec.message() + "; " + write_fix(ec.value()) +
                       "; nothing was written");
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp_path, ignored);
    throw;
  }
}

Golden read_golden(const std::string& path, const ReadOptions& options) {
  const SilenceHdf5 silence;
  const Context ctx(path);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) ctx.fail("", "cannot open: " + ec.message());
  if (ec || !std::filesystem::exists(status)) ctx.fail("", "cannot open: no such file");
  if (std::filesystem::is_directory(status))
    ctx.fail("", "cannot open: is a directory; give the path of a golden file in it (e.g. " +
                     (std::filesystem::path(path) / "case.h5").string() + ")");
  if (!std::filesystem::is_regular_file(status))
    ctx.fail("", "cannot open: not a regular file (a device, a pipe or a socket); give the path of a golden file");
  if (::access(path.c_str(), R_OK) != 0)
    ctx.fail("", std::string("cannot open: ") + std::strerror(errno) + " (check the file's permissions)");

  // HDF5 locks a file that a program has open for writing (h5py's "r+", say); opening it then
  // fails, which is not damage.
  auto fail_open = [&ctx](const std::string& detail) {
    // errno 11 (EAGAIN): the lock is held elsewhere; a file system without locks gives others
    if (detail.find("unable to lock file") != std::string::npos && detail.find("errno = 11,") != std::string::npos)
      ctx.fail("", "cannot open: another program has it open for writing and HDF5 locks it (" + detail +
                       "); close it there (e.g. the notebook's h5py.File), or, if nothing writes it, set "
                       "HDF5_USE_FILE_LOCKING=FALSE");
    ctx.fail("", "not an HDF5 file or truncated (" + detail + ")" + kNotReadableHint);
  };
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) fail_open(is_hdf5 == 0 ? "no HDF5 signature found" : hdf5_detail());
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) fail_open(hdf5_detail());

  Golden golden;
  try {
    read_file(ctx, file.get(), options, golden);
  } catch (const std::bad_alloc&) {
    ctx.fail("", "out of memory while loading the datasets; run on a machine with more memory, or use a golden of "
                 "a smaller layer");
  }
  validate_golden(golden, path, options);
  return golden;
}

}  // namespace mok::ref
