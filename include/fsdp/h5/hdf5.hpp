// fsdp/h5/hdf5.hpp: the only place that touches the HDF5 C API's handles (the h5 layer:
// data/ and checkpoint/ link it; core knows no HDF5).
//
// Move-only RAII owners of hid_t (HighFive's habit): destructors never throw. Every call is
// checked with FSDP_CHECK_HDF5; HDF5's automatic error stack printing is switched off so a
// failure surfaces as one fsdp::Error line. Error messages name the file and the object.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"

namespace fsdp::detail {
// The outermost message of HDF5's error stack and the system error of a failed read or write
// under it ("No space left on device"), as fsdp::Error; clears the stack.
[[noreturn]] void throw_hdf5_error(const char* call, const char* file, int line);
}  // namespace fsdp::detail

// Checks an HDF5 call returning herr_t or hid_t (negative = failure); evaluates to the value.
#define FSDP_CHECK_HDF5(call)                                                             \
  ([&]() {                                                                                \
    auto fsdp_h5_rc_ = (call);                                                            \
    if (fsdp_h5_rc_ < 0) ::fsdp::detail::throw_hdf5_error(#call, __FILE__, __LINE__);     \
    return fsdp_h5_rc_;                                                                   \
  }())

namespace fsdp::h5 {

// Owns one hid_t; closes it with the matching H5*close on destruction.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership without closing; returns the id (H5I_INVALID_HID if none).
  hid_t release() noexcept {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// An HDF5 file. Paths of objects are absolute ("/train/tokens") or relative to the root.
class File {
 public:
  // Opens an existing file read-only; throws InputError naming `path` if missing, not a
  // regular file (a FIFO is refused without being opened), or not a readable HDF5 file.
  // Every later failure on this file is an InputError too ("<path>: <object>: ...").
  static File open_read(const std::string& path);
  // Creates (truncates) a file for writing.
  static File create(const std::string& path);

  const std::string& path() const { return path_; }
  hid_t id() const { return h_.id(); }
  // Opened by open_read: any failure reading it is an input error (exit code 2).
  bool read_only() const { return read_only_; }
  bool exists(const std::string& object_path) const;  // group or dataset ("/a/b")
  void create_group(const std::string& group_path);    // creates missing parents too

  // 1-D datasets. `dims` of a dataset: its shape (throws InputError if missing or if the
  // object is a group, "<path>: <dataset>: is a group (expected a dataset)").
  std::vector<hsize_t> dims(const std::string& dataset) const;
  // The dataset's stored element class: H5T_INTEGER or H5T_FLOAT, and size in bytes.
  H5T_class_t type_class(const std::string& dataset) const;
  std::size_t type_size(const std::string& dataset) const;

  void write_f32(const std::string& dataset, const float* data, std::vector<hsize_t> shape);
  void write_i64(const std::string& dataset, const int64_t* data, std::vector<hsize_t> shape);
  void write_u8(const std::string& dataset, const uint8_t* data, std::vector<hsize_t> shape);
  // Reads `count` elements starting at flat element `offset` of a 1-D dataset, converting
  // to the requested type (HDF5 converts integer widths). Throws if out of range.
  void read_f32(const std::string& dataset, float* out, hsize_t offset, hsize_t count) const;
  void read_i32(const std::string& dataset, int32_t* out, hsize_t offset, hsize_t count) const;
  void read_i64(const std::string& dataset, int64_t* out, hsize_t offset, hsize_t count) const;
  std::vector<float> read_all_f32(const std::string& dataset) const;
  std::vector<int64_t> read_all_i64(const std::string& dataset) const;

  // Attributes on any object (group or dataset; "/" for the root).
  bool has_attr(const std::string& object_path, const std::string& name) const;
  void set_attr(const std::string& object_path, const std::string& name, int64_t value);
  void set_attr(const std::string& object_path, const std::string& name, double value);
  void set_attr(const std::string& object_path, const std::string& name, const std::string& value);
  int64_t attr_i64(const std::string& object_path, const std::string& name) const;
  double attr_f64(const std::string& object_path, const std::string& name) const;
  std::string attr_str(const std::string& object_path, const std::string& name) const;

  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;
  // Closes silently. A file created for writing whose metadata cannot be flushed any more
  // (a full disk) is emptied first (ftruncate to 0) so that HDF5 can close it: the caller is
  // discarding it anyway (AtomicFile removes the temporary).
  ~File();

  // Flushes and closes; further use is an error. If the flush fails (e.g. ENOSPC), the file
  // is emptied and closed as in the destructor, and fsdp::Error names the file and the
  // system error ("No space left on device").
  void close();

 private:
  File(Handle h, std::string path) : h_(std::move(h)), path_(std::move(path)) {}
  Handle h_;
  std::string path_;
  bool read_only_ = false;
};

}  // namespace fsdp::h5
