// fsdp_prepare's logic: collect text files, concatenate their bytes, split, write HDF5
// (see fsdp/data/prepare.hpp and docs/data.md).
#include "fsdp/data/prepare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "fsdp/core/error.hpp"
#include "fsdp/detail/hdf5.hpp"

namespace fs = std::filesystem;

namespace fsdp::data {

namespace {

// Regular file, not a symlink, not a fortune index (.dat).
bool wanted(const fs::directory_entry& e) {
  std::error_code ec;
  if (e.is_symlink(ec) || !e.is_regular_file(ec)) return false;
  return e.path().extension() != ".dat";
}

}  // namespace

std::vector<fs::path> collect_input_files(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::directory_entry top(fs::path(in), ec);
    const auto st = fs::symlink_status(in, ec);
    if (ec || !fs::exists(st)) throw InputError(in + ": input not found (expected a file or folder)");
    if (fs::is_directory(st)) {
      // Does not descend into symlinked folders (the iterator's default).
      fs::recursive_directory_iterator it(in, ec), end;
      if (ec) throw InputError(in + ": cannot read folder (" + ec.message() + ")");
      for (; it != end; it.increment(ec)) {
        if (ec) throw InputError(in + ": cannot read folder (" + ec.message() + ")");
        if (wanted(*it)) files.push_back(it->path());
      }
      if (ec) throw InputError(in + ": cannot read folder (" + ec.message() + ")");
    } else if (wanted(top)) {
      files.push_back(fs::path(in));
    }
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  files.erase(std::unique(files.begin(), files.end()), files.end());
  if (files.empty()) {
    std::string list;
    for (const auto& in : inputs) list += (list.empty() ? "" : " ") + in;
    throw InputError("no input files in " + (list.empty() ? std::string("(none given)") : list) +
                     " (expected regular files; symlinks and *.dat are skipped)");
  }
  return files;
}

int64_t val_token_count(int64_t n, double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    std::ostringstream os;
    os << "--val-fraction: " << val_fraction << " (expected 0 < fraction < 1)";
    throw InputError(os.str());
  }
  return static_cast<int64_t>(std::floor(val_fraction * static_cast<double>(n)));
}

ByteSplit build_byte_split(const std::vector<fs::path>& files, double val_fraction) {
  val_token_count(0, val_fraction);  // validate before reading anything
  ByteSplit s;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw InputError(f.string() + ": cannot read input file");
    s.bytes.insert(s.bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw InputError(f.string() + ": error while reading input file");
  }
  s.num_files = static_cast<int64_t>(files.size());
  const auto n = static_cast<int64_t>(s.bytes.size());
  const int64_t n_val = val_token_count(n, val_fraction);
  s.train_tokens = n - n_val;
  if (n_val == 0 || s.train_tokens == 0) {
    std::ostringstream os;
    os << "--val-fraction: " << val_fraction << " of " << n << " bytes leaves an empty "
       << (n_val == 0 ? "validation" : "training") << " split (expected both splits non-empty)";
    throw InputError(os.str());
  }
  return s;
}

void write_byte_token_file(const std::string& out, const ByteSplit& split, const std::string& source) {
  const std::string tmp = out + ".tmp";
  try {
    auto f = h5::File::create(tmp);
    const auto n_train = static_cast<hsize_t>(split.train_tokens);
    const auto n_val = static_cast<hsize_t>(split.val_tokens());
    f.write_u8("/train/tokens", split.bytes.data(), {n_train});
    f.write_u8("/val/tokens", split.bytes.data() + n_train, {n_val});
    f.set_attr("/", "vocab_size", int64_t{256});
    f.set_attr("/", "tokenizer", std::string("bytes"));
    f.set_attr("/", "source", source);
    f.set_attr("/", "num_files", split.num_files);
    f.close();
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error(out + ": cannot move " + tmp + " into place (" + why + ")");
  }
}

PrepareSummary prepare_byte_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                    double val_fraction) {
  val_token_count(0, val_fraction);
  const fs::path parent = fs::absolute(fs::path(out)).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    throw InputError(out + ": output folder " + parent.string() + " does not exist (expected an existing folder)");
  }
  const auto files = collect_input_files(inputs);
  const ByteSplit split = build_byte_split(files, val_fraction);
  std::string source = "fsdp_prepare (bytes):";
  for (const auto& in : inputs) source += " " + in;
  write_byte_token_file(out, split, source);
  return PrepareSummary{split.num_files, split.train_tokens, split.val_tokens()};
}

}  // namespace fsdp::data
