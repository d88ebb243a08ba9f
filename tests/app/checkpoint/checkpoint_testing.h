// Damaging checkpoints on purpose, for tests of what tessera does with them: overwrite the first
// element of a float dataset (a NaN weight, as a diverged run would leave). Written through HDF5,
// so the chunk checksums stay valid: the file is well-formed, only its numbers are bad.
#pragma once

#include <hdf5.h>

#include <string>

#include "kernels/check.h"

namespace tessera::testing {

inline void set_first_value(const std::string& file, const std::string& dataset, float value) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  TESSERA_CHECK(f >= 0, "cannot open ", file, " for writing");
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const hid_t space = d >= 0 ? H5Dget_space(d) : -1;
  bool ok = space >= 0;
  if (ok) {
    const hsize_t coord[H5S_MAX_RANK] = {0};  // element (0, 0, ...)
    const hsize_t one = 1;
    const hid_t mem = H5Screate_simple(1, &one, nullptr);
    ok = H5Sselect_elements(space, H5S_SELECT_SET, 1, coord) >= 0 &&
         H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &value) >= 0;
    H5Sclose(mem);
    H5Sclose(space);
  }
  if (d >= 0) H5Dclose(d);
  H5Fclose(f);
  TESSERA_CHECK(ok, "cannot write ", dataset, " in ", file);
}

}  // namespace tessera::testing
