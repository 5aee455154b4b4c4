/* make_group_tokens_h5.c: writes tests/data/cli/group_tokens.h5, the fixture of the CLI test
 * "/train/tokens is a group, not a dataset" (tests/cli/prepare.sh group_not_dataset).
 *
 * Like docs/data.md's token file except that /train/tokens is an (empty) group: /val/tokens
 * (uint8, 512 bytes of text) and the root attribute vocab_size = 256 (int64) are as
 * expected. No h5py/hdf5-tools are installed, so the fixture is checked in; regenerate it with
 *   gcc -I/usr/include/hdf5/serial -o /tmp/make_group_tokens_h5 tests/data/cli/make_group_tokens_h5.c \
 *     -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 && /tmp/make_group_tokens_h5 tests/data/cli/group_tokens.h5
 */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CHECK(x)                                                  \
  do {                                                            \
    if ((x) < 0) {                                                \
      fprintf(stderr, "make_group_tokens_h5: %s failed\n", #x);   \
      return 1;                                                   \
    }                                                             \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_group_tokens_h5 OUT.h5\n");
    return 2;
  }
  enum { N = 512 };
  uint8_t tokens[N];
  const char* text = "the quick brown fox jumps over the lazy dog. ";
  for (int i = 0; i < N; ++i) tokens[i] = (uint8_t)text[i % strlen(text)];

  hid_t file = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  CHECK(file);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  CHECK(lcpl);
  CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  hid_t group = H5Gcreate2(file, "/train/tokens", lcpl, H5P_DEFAULT, H5P_DEFAULT);
  CHECK(group);
  hsize_t dims[1] = {N};
  hid_t space = H5Screate_simple(1, dims, NULL);
  CHECK(space);
  hid_t dset = H5Dcreate2(file, "/val/tokens", H5T_STD_U8LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  CHECK(dset);
  CHECK(H5Dwrite(dset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens));

  hid_t scalar = H5Screate(H5S_SCALAR);
  CHECK(scalar);
  int64_t vocab = 256;
  hid_t a = H5Acreate2(file, "vocab_size", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  CHECK(a);
  CHECK(H5Awrite(a, H5T_NATIVE_INT64, &vocab));
  CHECK(H5Aclose(a));

  CHECK(H5Sclose(scalar));
  CHECK(H5Dclose(dset));
  CHECK(H5Sclose(space));
  CHECK(H5Gclose(group));
  CHECK(H5Pclose(lcpl));
  CHECK(H5Fclose(file));
  return 0;
}
