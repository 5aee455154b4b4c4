// fsdp_h5_poke: edits HDF5 files the way corruption or a forger would, for the CLI tests
// (tests/cli/integrity.sh), without h5py:
//   fsdp_h5_poke set-i64 FILE OBJECT ATTR VALUE   overwrite (or create) an int64 attribute
//   fsdp_h5_poke set-str FILE OBJECT ATTR VALUE   overwrite (or create) a string attribute
//   fsdp_h5_poke get-str FILE OBJECT ATTR         print a string attribute (and a newline)
//   fsdp_h5_poke offset FILE DATASET              print the dataset's byte offset in FILE
//   fsdp_h5_poke reseal FILE                      store the shard file's metadata checksum
//                                                 anew (ckpt::metadata_checksum): a forger's
//                                                 step, to reach the checks behind it
// Exit 0 on success, 1 on any failure (message on stderr).
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "fsdp/checkpoint/checkpoint.hpp"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "fsdp_h5_poke: %s\n", what.c_str());
  return 1;
}

// Replaces attribute `name` of `obj` in `file` by a scalar of `type` holding `value`.
bool set_attr(const char* file, const char* obj, const char* name, hid_t type, hid_t mem_type, const void* value) {
  const hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return false;
  if (H5Aexists_by_name(f, obj, name, H5P_DEFAULT) > 0) H5Adelete_by_name(f, obj, name, H5P_DEFAULT);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate_by_name(f, obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = a >= 0 && H5Awrite(a, mem_type, value) >= 0;
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  return H5Fclose(f) >= 0 && ok;
}

// A variable-length UTF-8 string type (what the checkpoint writer uses).
hid_t vlen_string() {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "set-i64" && argc == 6) {
    const int64_t v = std::strtoll(argv[5], nullptr, 10);
    if (!set_attr(argv[2], argv[3], argv[4], H5T_STD_I64LE, H5T_NATIVE_INT64, &v))
      return fail(std::string(argv[2]) + ": cannot write attribute " + argv[4]);
    return 0;
  }
  if (cmd == "set-str" && argc == 6) {
    const hid_t t = vlen_string();
    const char* p = argv[5];
    const bool ok = set_attr(argv[2], argv[3], argv[4], t, t, &p);
    H5Tclose(t);
    return ok ? 0 : fail(std::string(argv[2]) + ": cannot write attribute " + argv[4]);
  }
  if (cmd == "get-str" && argc == 5) {
    const hid_t f = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return fail(std::string(argv[2]) + ": cannot open");
    const hid_t a = H5Aopen_by_name(f, argv[3], argv[4], H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) {
      H5Fclose(f);
      return fail(std::string(argv[2]) + ": no attribute " + argv[4] + " on " + argv[3]);
    }
    const hid_t t = vlen_string();
    char* p = nullptr;
    const bool ok = H5Aread(a, t, &p) >= 0 && p;
    if (ok) std::printf("%s\n", p);
    if (p) H5free_memory(p);
    H5Tclose(t);
    H5Aclose(a);
    H5Fclose(f);
    return ok ? 0 : fail(std::string(argv[2]) + ": attribute " + argv[4] + " is not a string");
  }
  if (cmd == "offset" && argc == 4) {
    const hid_t f = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return fail(std::string(argv[2]) + ": cannot open");
    const hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
    if (d < 0) return fail(std::string(argv[2]) + ": no dataset " + argv[3]);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    if (off == HADDR_UNDEF) return fail(std::string(argv[3]) + ": not a contiguous dataset");
    std::printf("%llu\n", static_cast<unsigned long long>(off));
    return 0;
  }
  if (cmd == "reseal" && argc == 3) {
    std::string sum;
    try {
      sum = fsdp::ckpt::metadata_checksum(argv[2]);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    const hid_t t = vlen_string();
    const char* p = sum.c_str();
    const bool ok = set_attr(argv[2], "/", fsdp::ckpt::kMetadataChecksumAttr, t, t, &p);
    H5Tclose(t);
    return ok ? 0 : fail(std::string(argv[2]) + ": cannot write attribute " + fsdp::ckpt::kMetadataChecksumAttr);
  }
  return fail(
      "usage: fsdp_h5_poke set-i64 FILE OBJECT ATTR VALUE | set-str FILE OBJECT ATTR VALUE | "
      "get-str FILE OBJECT ATTR | offset FILE DATASET | reseal FILE");
}
