// The HDF5 C API behind fsdp::h5 (see fsdp/h5/hdf5.hpp).
//
// Every hid_t lives in a Handle that closes it with the H5*close matching its type; every
// call is checked with FSDP_CHECK_HDF5, and failures are re-thrown with the file and the
// object path in front so a user sees e.g. "run.h5: /train/tokens: HDF5 error in ...".
// HDF5's automatic error stack printing is switched off when a file is opened or created.
#include "fsdp/h5/hdf5.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

namespace fsdp::detail {

void throw_hdf5_error(const char* call, const char* file, int line) {
  // The outermost message of HDF5's error stack, and the system error of a failed read or
  // write deeper in it (the sec2 driver records "errno = 28, error message = '...'"), so a
  // full disk reads "No space left on device" instead of only "can't write data".
  struct Found {
    std::string detail;
    int sys_errno = 0;
  } found;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* f = static_cast<Found*>(data);
    if (!err->desc) return 0;
    if (n == 0) f->detail = err->desc;
    if (f->sys_errno == 0) {
      const char* e = std::strstr(err->desc, "errno = ");
      if (e) f->sys_errno = std::atoi(e + 8);
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &found);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << "HDF5 error in " << call << " at " << file << ":" << line;
  if (!found.detail.empty()) os << ": " << found.detail;
  if (found.sys_errno > 0) os << ": " << std::strerror(found.sys_errno);
  throw Error(os.str());
}

}  // namespace fsdp::detail

namespace fsdp::h5 {

// ---- Handle ----

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    Handle tmp(std::move(*this));  // closes our old id at end of scope
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Handle::~Handle() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;  // already closed or not ours: nothing to do, never throw
  }
}

namespace {

// "a directory", "a FIFO", ... for a non-regular file's st_mode.
std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "not a regular file";
}

// Switches off HDF5's printing of its error stack to stderr (we report through fsdp::Error),
// and HDF5's own clean-up at exit. The latter because of HDF5 1.10: when H5Fclose fails (its
// final metadata flush hits a full disk) the file's memory is freed but its id stays
// registered, and H5close at exit then closes it again and crashes (SIGSEGV in
// H5F__close_cb). Every file we write is closed by its owner before exit (File), so there is
// nothing for that clean-up to do. H5dont_atexit must come before the library initialises:
// this is the first HDF5 call of the process (every File starts here).
void quiet_hdf5() {
  static const bool once = [] {
    H5dont_atexit();
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// Releases the disk space of a file being written whose flush failed, so that closing it (which
// writes its metadata once more) succeeds: H5Fclose must not fail (see quiet_hdf5).
void empty_for_close(hid_t id) noexcept {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(id, H5P_DEFAULT, &handle) >= 0 && handle) {
    (void)!::ftruncate(*static_cast<int*>(handle), 0);  // the sec2 driver's handle is an int fd
  }
  H5Eclear2(H5E_DEFAULT);
}

// Runs `f`, prefixing any fsdp::Error with "<file>: <object>: ". In a file opened for
// reading every failure is the file's fault (bad structure, a group where a dataset belongs,
// corrupted metadata): exit code 2, like the other input errors.
template <class F>
auto in_context(const File& file, const std::string& object, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(file.path() + ": " + object + ": " + e.what(),
                file.read_only() ? kExitInputError : e.exit_code());
  }
}

// "/a/b/c" -> {"a", "b", "c"}.
std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : p) {
    if (c == '/') {
      if (!cur.empty()) parts.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(std::move(cur));
  return parts;
}

hsize_t element_count(const std::vector<hsize_t>& shape) {
  hsize_t n = 1;
  for (hsize_t d : shape) n *= d;
  return n;
}

// Link-creation property list that creates missing intermediate groups.
Handle lcpl_with_parents() {
  Handle p(FSDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)));
  FSDP_CHECK_HDF5(H5Pset_create_intermediate_group(p.id(), 1));
  return p;
}

Handle open_dataset(const File& f, const std::string& dataset) {
  if (!f.exists(dataset)) {
    throw InputError(f.path() + ": dataset " + dataset + " not found");
  }
  return in_context(f, dataset, [&] {
    Handle obj(FSDP_CHECK_HDF5(H5Oopen(f.id(), dataset.c_str(), H5P_DEFAULT)));
    const H5I_type_t type = H5Iget_type(obj.id());
    if (type != H5I_DATASET) {
      throw InputError(std::string("is ") + (type == H5I_GROUP ? "a group" : "not a dataset") +
                       " (expected a dataset)");
    }
    return obj;
  });
}

Handle open_object(const File& f, const std::string& object_path) {
  if (object_path != "/" && !f.exists(object_path)) {
    throw InputError(f.path() + ": object " + object_path + " not found");
  }
  return in_context(f, object_path,
                    [&] { return Handle(FSDP_CHECK_HDF5(H5Oopen(f.id(), object_path.c_str(), H5P_DEFAULT))); });
}

void write_dataset(const File& f, const std::string& dataset, hid_t file_type, hid_t mem_type,
                   const void* data, const std::vector<hsize_t>& shape) {
  in_context(f, dataset, [&] {
    if (shape.empty()) throw Error("write: empty shape (expected rank >= 1)");
    Handle space(FSDP_CHECK_HDF5(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
    Handle lcpl = lcpl_with_parents();
    Handle dset(FSDP_CHECK_HDF5(H5Dcreate2(f.id(), dataset.c_str(), file_type, space.id(), lcpl.id(),
                                           H5P_DEFAULT, H5P_DEFAULT)));
    if (element_count(shape) > 0) {
      FSDP_CHECK_HDF5(H5Dwrite(dset.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
    }
    return 0;
  });
}

// Hyperslab read of [offset, offset + count) of a 1-D dataset into `out` as `mem_type`.
void read_range(const File& f, const std::string& dataset, hid_t mem_type, void* out, hsize_t offset,
                hsize_t count) {
  Handle dset = open_dataset(f, dataset);
  in_context(f, dataset, [&] {
    Handle space(FSDP_CHECK_HDF5(H5Dget_space(dset.id())));
    const int rank = FSDP_CHECK_HDF5(H5Sget_simple_extent_ndims(space.id()));
    if (rank != 1) {
      throw InputError("expected a 1-D dataset, found rank " + std::to_string(rank));
    }
    hsize_t n = 0;
    FSDP_CHECK_HDF5(H5Sget_simple_extent_dims(space.id(), &n, nullptr));
    if (offset > n || count > n - offset) {
      throw InputError("read of [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                       ") is out of range (dataset has " + std::to_string(n) + " elements)");
    }
    if (count == 0) return 0;
    FSDP_CHECK_HDF5(H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, &offset, nullptr, &count, nullptr));
    Handle mem(FSDP_CHECK_HDF5(H5Screate_simple(1, &count, nullptr)));
    FSDP_CHECK_HDF5(H5Dread(dset.id(), mem_type, mem.id(), space.id(), H5P_DEFAULT, out));
    return 0;
  });
}

Handle open_attr(const File& f, const std::string& object_path, const std::string& name) {
  if (!f.has_attr(object_path, name)) {
    throw InputError(f.path() + ": attribute " + name + " of " + object_path + " not found");
  }
  Handle obj = open_object(f, object_path);
  return in_context(f, object_path + " attribute " + name,
                    [&] { return Handle(FSDP_CHECK_HDF5(H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT))); });
}

// Creates (replacing any existing) a scalar attribute of `type` and writes `value`.
void write_attr(File& f, const std::string& object_path, const std::string& name, hid_t type,
                const void* value) {
  Handle obj = open_object(f, object_path);
  in_context(f, object_path + " attribute " + name, [&] {
    if (FSDP_CHECK_HDF5(H5Aexists(obj.id(), name.c_str())) > 0) {
      FSDP_CHECK_HDF5(H5Adelete(obj.id(), name.c_str()));
    }
    Handle space(FSDP_CHECK_HDF5(H5Screate(H5S_SCALAR)));
    Handle attr(FSDP_CHECK_HDF5(H5Acreate2(obj.id(), name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT)));
    FSDP_CHECK_HDF5(H5Awrite(attr.id(), type, value));
    return 0;
  });
}

}  // namespace

// ---- File ----

File File::open_read(const std::string& path) {
  quiet_hdf5();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(path + ": cannot open HDF5 file (" + std::strerror(errno) + ")");
  }
  // Never open a FIFO, socket or device: H5Fis_hdf5 would block on a FIFO with no writer.
  if (!S_ISREG(st.st_mode)) {
    throw InputError(path + ": cannot open HDF5 file (" + file_kind(st.st_mode) +
                     ", expected a regular file)");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw InputError(path + ": cannot open HDF5 file (not an HDF5 file or unreadable)");
  }
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    H5Eclear2(H5E_DEFAULT);
    throw InputError(path + ": cannot open HDF5 file (H5Fopen failed)");
  }
  File f(Handle(id), path);
  f.read_only_ = true;
  return f;
}

File File::create(const std::string& path) {
  quiet_hdf5();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) {
    H5Eclear2(H5E_DEFAULT);
    throw Error(path + ": cannot create HDF5 file (the folder is missing or not writable, or the file is open elsewhere)");
  }
  return File(Handle(id), path);
}

bool File::exists(const std::string& object_path) const {
  // H5Lexists fails (rather than returning 0) when an intermediate group is missing, so walk.
  return in_context(*this, object_path, [&] {
    std::string cur;
    for (const std::string& part : split_path(object_path)) {
      cur += "/" + part;
      if (FSDP_CHECK_HDF5(H5Lexists(h_.id(), cur.c_str(), H5P_DEFAULT)) <= 0) return false;
      if (FSDP_CHECK_HDF5(H5Oexists_by_name(h_.id(), cur.c_str(), H5P_DEFAULT)) <= 0) return false;
    }
    return true;
  });
}

void File::create_group(const std::string& group_path) {
  if (exists(group_path)) return;
  in_context(*this, group_path, [&] {
    Handle lcpl = lcpl_with_parents();
    Handle g(FSDP_CHECK_HDF5(H5Gcreate2(h_.id(), group_path.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT)));
    return 0;
  });
}

std::vector<hsize_t> File::dims(const std::string& dataset) const {
  Handle dset = open_dataset(*this, dataset);
  return in_context(*this, dataset, [&] {
    Handle space(FSDP_CHECK_HDF5(H5Dget_space(dset.id())));
    const int rank = FSDP_CHECK_HDF5(H5Sget_simple_extent_ndims(space.id()));
    std::vector<hsize_t> d(static_cast<std::size_t>(rank));
    if (rank > 0) FSDP_CHECK_HDF5(H5Sget_simple_extent_dims(space.id(), d.data(), nullptr));
    return d;
  });
}

H5T_class_t File::type_class(const std::string& dataset) const {
  Handle dset = open_dataset(*this, dataset);
  return in_context(*this, dataset, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Dget_type(dset.id())));
    return FSDP_CHECK_HDF5(H5Tget_class(t.id()));
  });
}

std::size_t File::type_size(const std::string& dataset) const {
  Handle dset = open_dataset(*this, dataset);
  return in_context(*this, dataset, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Dget_type(dset.id())));
    const std::size_t s = H5Tget_size(t.id());
    if (s == 0) ::fsdp::detail::throw_hdf5_error("H5Tget_size", __FILE__, __LINE__);
    return s;
  });
}

void File::write_f32(const std::string& dataset, const float* data, std::vector<hsize_t> shape) {
  write_dataset(*this, dataset, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data, shape);
}
void File::write_i64(const std::string& dataset, const int64_t* data, std::vector<hsize_t> shape) {
  write_dataset(*this, dataset, H5T_STD_I64LE, H5T_NATIVE_INT64, data, shape);
}
void File::write_u8(const std::string& dataset, const uint8_t* data, std::vector<hsize_t> shape) {
  write_dataset(*this, dataset, H5T_STD_U8LE, H5T_NATIVE_UINT8, data, shape);
}

void File::read_f32(const std::string& dataset, float* out, hsize_t offset, hsize_t count) const {
  read_range(*this, dataset, H5T_NATIVE_FLOAT, out, offset, count);
}
void File::read_i32(const std::string& dataset, int32_t* out, hsize_t offset, hsize_t count) const {
  read_range(*this, dataset, H5T_NATIVE_INT32, out, offset, count);
}
void File::read_i64(const std::string& dataset, int64_t* out, hsize_t offset, hsize_t count) const {
  read_range(*this, dataset, H5T_NATIVE_INT64, out, offset, count);
}

std::vector<float> File::read_all_f32(const std::string& dataset) const {
  const auto d = dims(dataset);
  std::vector<float> v(element_count(d));
  if (d.size() == 1) {
    read_f32(dataset, v.data(), 0, v.size());
  } else {  // any rank: whole-dataset read
    Handle dset = open_dataset(*this, dataset);
    in_context(*this, dataset, [&] {
      if (!v.empty()) FSDP_CHECK_HDF5(H5Dread(dset.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
      return 0;
    });
  }
  return v;
}

std::vector<int64_t> File::read_all_i64(const std::string& dataset) const {
  const auto d = dims(dataset);
  std::vector<int64_t> v(element_count(d));
  if (d.size() == 1) {
    read_i64(dataset, v.data(), 0, v.size());
  } else {
    Handle dset = open_dataset(*this, dataset);
    in_context(*this, dataset, [&] {
      if (!v.empty()) FSDP_CHECK_HDF5(H5Dread(dset.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
      return 0;
    });
  }
  return v;
}

bool File::has_attr(const std::string& object_path, const std::string& name) const {
  if (object_path != "/" && !exists(object_path)) return false;
  return in_context(*this, object_path, [&] {
    return FSDP_CHECK_HDF5(H5Aexists_by_name(h_.id(), object_path.c_str(), name.c_str(), H5P_DEFAULT)) > 0;
  });
}

void File::set_attr(const std::string& object_path, const std::string& name, int64_t value) {
  write_attr(*this, object_path, name, H5T_NATIVE_INT64, &value);
}
void File::set_attr(const std::string& object_path, const std::string& name, double value) {
  write_attr(*this, object_path, name, H5T_NATIVE_DOUBLE, &value);
}
void File::set_attr(const std::string& object_path, const std::string& name, const std::string& value) {
  // Variable-length UTF-8 string (what h5py writes for a Python str).
  Handle t = in_context(*this, object_path + " attribute " + name, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Tcopy(H5T_C_S1)));
    FSDP_CHECK_HDF5(H5Tset_size(t.id(), H5T_VARIABLE));
    FSDP_CHECK_HDF5(H5Tset_cset(t.id(), H5T_CSET_UTF8));
    return t;
  });
  const char* p = value.c_str();
  write_attr(*this, object_path, name, t.id(), &p);
}

int64_t File::attr_i64(const std::string& object_path, const std::string& name) const {
  Handle a = open_attr(*this, object_path, name);
  return in_context(*this, object_path + " attribute " + name, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Aget_type(a.id())));
    if (FSDP_CHECK_HDF5(H5Tget_class(t.id())) != H5T_INTEGER) throw InputError("expected an integer attribute");
    int64_t v = 0;
    FSDP_CHECK_HDF5(H5Aread(a.id(), H5T_NATIVE_INT64, &v));
    return v;
  });
}

double File::attr_f64(const std::string& object_path, const std::string& name) const {
  Handle a = open_attr(*this, object_path, name);
  return in_context(*this, object_path + " attribute " + name, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Aget_type(a.id())));
    const H5T_class_t c = FSDP_CHECK_HDF5(H5Tget_class(t.id()));
    if (c != H5T_FLOAT && c != H5T_INTEGER) throw InputError("expected a numeric attribute");
    double v = 0;
    FSDP_CHECK_HDF5(H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v));
    return v;
  });
}

std::string File::attr_str(const std::string& object_path, const std::string& name) const {
  Handle a = open_attr(*this, object_path, name);
  return in_context(*this, object_path + " attribute " + name, [&] {
    Handle t(FSDP_CHECK_HDF5(H5Aget_type(a.id())));
    if (FSDP_CHECK_HDF5(H5Tget_class(t.id())) != H5T_STRING) throw InputError("expected a string attribute");
    const htri_t is_var = FSDP_CHECK_HDF5(H5Tis_variable_str(t.id()));
    if (is_var > 0) {
      Handle mem(FSDP_CHECK_HDF5(H5Tcopy(H5T_C_S1)));
      FSDP_CHECK_HDF5(H5Tset_size(mem.id(), H5T_VARIABLE));
      FSDP_CHECK_HDF5(H5Tset_cset(mem.id(), FSDP_CHECK_HDF5(H5Tget_cset(t.id()))));
      char* p = nullptr;
      FSDP_CHECK_HDF5(H5Aread(a.id(), mem.id(), &p));
      std::string s = p ? p : "";
      Handle space(FSDP_CHECK_HDF5(H5Aget_space(a.id())));
      H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, &p);
      return s;
    }
    // Fixed-length: read the stored bytes, then cut at the first NUL (NULTERM/NULLPAD) and
    // trailing spaces (SPACEPAD).
    const std::size_t n = H5Tget_size(t.id());
    if (n == 0) ::fsdp::detail::throw_hdf5_error("H5Tget_size", __FILE__, __LINE__);
    std::string buf(n, '\0');
    FSDP_CHECK_HDF5(H5Aread(a.id(), t.id(), buf.data()));
    const auto nul = buf.find('\0');
    if (nul != std::string::npos) buf.resize(nul);
    if (H5Tget_strpad(t.id()) == H5T_STR_SPACEPAD) {
      while (!buf.empty() && buf.back() == ' ') buf.pop_back();
    }
    return buf;
  });
}

File::~File() {
  if (!h_.valid() || read_only_) return;  // Handle closes it
  if (H5Fflush(h_.id(), H5F_SCOPE_LOCAL) < 0) empty_for_close(h_.id());
  H5Fclose(h_.release());
  H5Eclear2(H5E_DEFAULT);
}

void File::close() {
  if (!h_.valid()) return;
  const hid_t id = h_.release();  // further use fails in HDF5 and throws
  in_context(*this, "/", [&] {
    if (H5Fflush(id, H5F_SCOPE_LOCAL) < 0) {
      try {
        ::fsdp::detail::throw_hdf5_error("H5Fflush", __FILE__, __LINE__);
      } catch (...) {
        empty_for_close(id);
        H5Fclose(id);
        H5Eclear2(H5E_DEFAULT);
        throw;
      }
    }
    FSDP_CHECK_HDF5(H5Fclose(id));
    return 0;
  });
}

}  // namespace fsdp::h5
