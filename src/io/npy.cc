#include "io/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/text_file.h"

namespace dsv4 {

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict += " ";
    n *= size_t(shape[i]);
  }
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  // Written next to the target and renamed at the end, so that a failed
  // write (disk full) never leaves a truncated array under the real name.
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error(path + ": cannot create");
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t hl = uint16_t(dict.size());
    f.write(reinterpret_cast<const char*>(&hl), 2);
    f.write(dict.data(), std::streamsize(dict.size()));
    f.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(float)));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(path + ": cannot write: " + why);
  }
}

NpyArray read_npy(const std::string& path) {
  const std::string bytes = read_text_file(path, ".npy file");
  const std::string name = input_name(path);
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw Error(name + ": not a .npy file");
  int major = uint8_t(bytes[6]);
  size_t hl, off;
  if (major == 1) {
    hl = uint8_t(bytes[8]) | (size_t(uint8_t(bytes[9])) << 8);
    off = 10;
  } else {
    if (bytes.size() < 12) throw Error(name + ": truncated .npy header");
    hl = 0;
    for (int i = 3; i >= 0; --i) hl = (hl << 8) | uint8_t(bytes[8 + i]);
    off = 12;
  }
  if (off + hl > bytes.size()) throw Error(name + ": truncated .npy header");
  std::string h = bytes.substr(off, hl);
  bool f8 = h.find("'<f8'") != std::string::npos;
  if (!f8 && h.find("'<f4'") == std::string::npos) throw Error(name + ": only little-endian float32/float64 .npy is supported");
  if (h.find("'fortran_order': True") != std::string::npos) throw Error(name + ": Fortran order not supported");
  NpyArray a;
  size_t p = h.find('(');
  size_t q = h.find(')', p);
  if (p == std::string::npos || q == std::string::npos) throw Error(name + ": no shape in .npy header");
  std::string dims = h.substr(p + 1, q - p - 1);
  size_t n = 1;
  for (size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    if (j == i) throw Error(name + ": bad shape in .npy header");
    // Bounded so that neither the dimension nor the element count (x 8 bytes)
    // can overflow: such a shape cannot fit in the file anyway.
    if (j - i > 18) throw Error(name + ": shape in .npy header is too large");
    const uint64_t d = std::stoull(dims.substr(i, j - i));
    if (d != 0 && n > (uint64_t(1) << 60) / d) throw Error(name + ": shape in .npy header is too large");
    a.shape.push_back(int64_t(d));
    n *= size_t(d);
    i = j;
  }
  size_t data_off = off + hl, esz = f8 ? 8 : 4;
  if (bytes.size() - data_off < n * esz) throw Error(name + ": truncated .npy data");
  if (n == 0) return a;  // (memcpy with the null data() of an empty vector is undefined)
  a.data.resize(n);
  if (f8) {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, bytes.data() + data_off + i * 8, 8);
      a.data[i] = float(d);
    }
  } else {
    std::memcpy(a.data.data(), bytes.data() + data_off, n * 4);
  }
  return a;
}

}  // namespace dsv4
