// fsdp_h5_poke: edits HDF5 files the way corruption or a forger would, for the CLI tests
// (tests/cli/integrity.sh), without h5py:
//   fsdp_h5_poke set-i64 FILE OBJECT ATTR VALUE   overwrite (or create) an int64 attribute
//   fsdp_h5_poke offset FILE DATASET              print the dataset's byte offset in FILE
// Exit 0 on success, 1 on any failure (message on stderr).
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "fsdp_h5_poke: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "set-i64" && argc == 6) {
    const hid_t f = H5Fopen(argv[2], H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return fail(std::string(argv[2]) + ": cannot open read-write");
    const int64_t v = std::strtoll(argv[5], nullptr, 10);
    if (H5Aexists_by_name(f, argv[3], argv[4], H5P_DEFAULT) > 0) H5Adelete_by_name(f, argv[3], argv[4], H5P_DEFAULT);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate_by_name(f, argv[3], argv[4], H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const bool ok = a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(space);
    H5Fclose(f);
    return ok ? 0 : fail(std::string(argv[2]) + ": cannot write attribute " + argv[4]);
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
  return fail("usage: fsdp_h5_poke set-i64 FILE OBJECT ATTR VALUE | offset FILE DATASET");
}
