// fsdp::printable: untrusted bytes made printable for one-line messages (see
// fsdp/core/error.hpp). Kept apart from error.cpp (MPI, HDF5) so that code built alone, such as
// the safetensors fuzzer, can link it.
#include "fsdp/core/error.hpp"

#include <sstream>

#include <cerrno>
#include <unistd.h>

namespace fsdp {

std::string printable(std::string_view s, std::size_t max_bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == max_bytes) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string format_number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

void write_line(int fd, std::string_view line) {
  std::string text(line);
  text += '\n';
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace fsdp
