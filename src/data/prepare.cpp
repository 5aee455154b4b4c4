// fsdp_prepare's logic: collect text files, concatenate their bytes, split, write HDF5
// (see fsdp/data/prepare.hpp and docs/data.md).
#include "fsdp/data/prepare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fs = std::filesystem;

namespace fsdp::data {

namespace {

// "a FIFO", "a socket", ... for what is neither a regular file, a folder nor a symlink.
std::string kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block:
    case fs::file_type::character: return "a device";
    default: return "not a regular file";
  }
}

// Regular file, not a symlink, not a fortune index (.dat). Files of other kinds (FIFOs,
// sockets, devices) are never opened: reading a FIFO blocks, a device may never end; they
// are recorded in `skipped` ("<path> (a FIFO)", escaped).
bool wanted(const fs::directory_entry& e, std::vector<std::string>* skipped) {
  std::error_code ec;
  const fs::file_status st = e.symlink_status(ec);
  if (ec || fs::is_symlink(st) || fs::is_directory(st)) return false;
  if (!fs::is_regular_file(st)) {
    if (skipped) skipped->push_back(printable(e.path().string()) + " (" + kind_of(st.type()) + ")");
    return false;
  }
  return e.path().extension() != ".dat";
}

// A path made comparable: absolute, symlinks of the existing part resolved.
fs::path canonical_or_absolute(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : c;
}

// Whether `p` lies inside folder `dir` (both canonical).
bool inside(const fs::path& p, const fs::path& dir) {
  auto d = dir.begin(), q = p.begin();
  for (; d != dir.end(); ++d, ++q) {
    if (d->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *d) return false;
  }
  return true;
}

}  // namespace

void check_output_not_input(const std::string& out, const std::vector<std::string>& inputs) {
  const fs::path o = canonical_or_absolute(out);
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) continue;  // reported when the inputs are read
    if (fs::exists(out, ec) && fs::equivalent(out, in, ec) && !ec) {
      throw InputError("-o/--output: " + printable(out) + " is the input " + printable(in) +
                       " (expected an output path that is not one of the inputs)");
    }
    if (fs::is_directory(st) && inside(o, canonical_or_absolute(in))) {
      throw InputError("-o/--output: " + printable(out) + " lies inside the input folder " + printable(in) +
                       " (expected an output path outside the inputs)");
    }
  }
}

namespace {

// Writes an HDF5 file through `fill` atomically (fsdp::AtomicFile: out + ".tmp", fsync,
// rename, directory fsync), so a failure never leaves a half-written `out` nor the temporary.
template <class F>
void write_atomically(const std::string& out, F&& fill) {
  AtomicFile file(out);
  file.write([&](const std::string& tmp) {
    auto f = h5::File::create(tmp);
    fill(f);
    f.close();
  });
}

// A 1-D int32 dataset (the wrapper has no int32 writer): HDF5 C API, parents created.
void write_i32(const h5::File& f, const std::string& dataset, const std::vector<int32_t>& data) {
  try {
    const hsize_t n = data.size();
    h5::Handle space(FSDP_CHECK_HDF5(H5Screate_simple(1, &n, nullptr)));
    h5::Handle lcpl(FSDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)));
    FSDP_CHECK_HDF5(H5Pset_create_intermediate_group(lcpl.id(), 1));
    h5::Handle dset(FSDP_CHECK_HDF5(H5Dcreate2(f.id(), dataset.c_str(), H5T_STD_I32LE, space.id(), lcpl.id(),
                                               H5P_DEFAULT, H5P_DEFAULT)));
    if (n > 0) FSDP_CHECK_HDF5(H5Dwrite(dset.id(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
  } catch (const Error& e) {
    throw Error(f.path() + ": " + dataset + ": " + e.what(), e.exit_code());
  }
}

void check_output_folder(const std::string& out) {
  const fs::path parent = fs::absolute(fs::path(out)).parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    throw InputError(out + ": output folder " + parent.string() + " does not exist (expected an existing folder)");
  }
}

}  // namespace

std::vector<fs::path> collect_input_files(const std::vector<std::string>& inputs,
                                          std::vector<std::string>* skipped) {
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::directory_entry top(fs::path(in), ec);
    const auto st = fs::symlink_status(in, ec);
    if (ec || !fs::exists(st)) throw InputError(printable(in) + ": input not found (expected a file or folder)");
    if (fs::is_directory(st)) {
      // Does not descend into symlinked folders (the iterator's default).
      fs::recursive_directory_iterator it(in, ec), end;
      if (ec) throw InputError(printable(in) + ": cannot read folder (" + ec.message() + ")");
      for (; it != end; it.increment(ec)) {
        if (ec) throw InputError(printable(in) + ": cannot read folder (" + ec.message() + ")");
        if (wanted(*it, skipped)) files.push_back(it->path());
      }
      if (ec) throw InputError(printable(in) + ": cannot read folder (" + ec.message() + ")");
    } else if (!fs::is_symlink(st) && !fs::is_regular_file(st)) {
      // Named on the command line: refused, never opened (a FIFO would block the read).
      throw InputError(printable(in) + ": input is " + kind_of(st.type()) +
                       " (expected a regular file or folder)");
    } else if (wanted(top, nullptr)) {
      files.push_back(fs::path(in));
    }
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  files.erase(std::unique(files.begin(), files.end()), files.end());
  if (files.empty()) {
    std::string list;
    for (const auto& in : inputs) {
      if (!list.empty()) list += ' ';
      list += printable(in);
    }
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

ByteSplit build_byte_split(const std::vector<fs::path>& files, double val_fraction, ProgressMeter* progress) {
  val_token_count(0, val_fraction);  // validate before reading anything
  ByteSplit s;
  // The sizes stat(2) reports now: the progress total and a capacity hint (a file that grows
  // or shrinks meanwhile is still read to its end).
  int64_t expected = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (!ec) expected += static_cast<int64_t>(size);
  }
  if (progress) progress->set_total(expected);
  s.bytes.reserve(static_cast<std::size_t>(expected));
  // Read in chunks of 1 MiB (one progress step each) through a buffer, so the exact
  // reservation above is never overshot by a last partial chunk.
  std::vector<char> chunk(std::size_t{1} << 20);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw InputError(printable(f.string()) + ": cannot read input file");
    for (;;) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<std::size_t>(in.gcount());
      s.bytes.insert(s.bytes.end(), chunk.data(), chunk.data() + got);
      if (progress && got > 0) progress->add(static_cast<int64_t>(got));
      if (got < chunk.size()) break;  // end of file (or an error, checked below)
    }
    if (in.bad()) throw InputError(printable(f.string()) + ": error while reading input file");
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
  write_atomically(out, [&](h5::File& f) {
    const auto n_train = static_cast<hsize_t>(split.train_tokens);
    const auto n_val = static_cast<hsize_t>(split.val_tokens());
    f.write_u8("/train/tokens", split.bytes.data(), {n_train});
    f.write_u8("/val/tokens", split.bytes.data() + n_train, {n_val});
    f.set_attr("/", "vocab_size", int64_t{256});
    f.set_attr("/", "tokenizer", std::string("bytes"));
    f.set_attr("/", "source", source);
    f.set_attr("/", "num_files", split.num_files);
  });
}

PrepareSummary prepare_byte_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                    double val_fraction, ProgressMeter* progress) {
  val_token_count(0, val_fraction);
  check_output_folder(out);
  check_output_not_input(out, inputs);
  PrepareSummary summary;
  const auto files = collect_input_files(inputs, &summary.skipped);
  const ByteSplit split = build_byte_split(files, val_fraction, progress);
  std::string source = "fsdp_prepare (bytes):";
  for (const auto& in : inputs) source += " " + in;
  write_byte_token_file(out, split, source);
  summary.files = split.num_files;
  summary.train_tokens = split.train_tokens;
  summary.val_tokens = split.val_tokens();
  return summary;
}

// ---------------------------------------------------------------- pairs (seq2seq)

void PairExamples::add(const std::vector<int32_t>& input, const std::vector<int32_t>& target) {
  inputs.insert(inputs.end(), input.begin(), input.end());
  targets.insert(targets.end(), target.begin(), target.end());
  input_offsets.push_back(static_cast<int64_t>(inputs.size()));
  target_offsets.push_back(static_cast<int64_t>(targets.size()));
}

namespace {

// ByT5 ids of bytes [begin, end) followed by eos: b -> b + 3, then 1.
std::vector<int32_t> byt5_ids(const std::string& line, std::size_t begin, std::size_t end) {
  std::vector<int32_t> ids;
  ids.reserve(end - begin + 1);
  for (std::size_t i = begin; i < end; ++i) ids.push_back(static_cast<int32_t>(static_cast<uint8_t>(line[i])) + 3);
  ids.push_back(1);
  return ids;
}

}  // namespace

PairExamples read_pairs_tsv(const std::string& path, ProgressMeter* progress) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // stat before open: a FIFO would block
  if (!ec && fs::exists(st) && !fs::is_regular_file(st)) {
    throw InputError(printable(path) + ": pairs file is " +
                     (fs::is_directory(st) ? std::string("a directory") : kind_of(st.type())) +
                     " (expected a regular TSV file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read pairs file (expected a TSV of input<TAB>target lines)");
  if (progress) {
    const auto size = fs::file_size(path, ec);
    progress->set_total(ec ? 0 : static_cast<int64_t>(size));
  }
  int64_t unreported = 0;  // bytes read since the last progress->add (batched: one per MiB)
  PairExamples ex;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (progress) {
      // The line and its newline (getline sets eof when the last line has none).
      unreported += static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
      if (unreported >= (int64_t{1} << 20)) {
        progress->add(unreported);
        unreported = 0;
      }
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos) {
      throw InputError(where + "no tab (expected input<TAB>target)");
    }
    if (line.find('\t', tab + 1) != std::string::npos) {
      throw InputError(where + "more than one tab (expected input<TAB>target, with no tab inside either)");
    }
    if (tab == 0) throw InputError(where + "empty input (expected input<TAB>target, both non-empty)");
    if (tab + 1 == line.size()) throw InputError(where + "empty target (expected input<TAB>target, both non-empty)");
    ex.add(byt5_ids(line, 0, tab), byt5_ids(line, tab + 1, line.size()));
  }
  if (in.bad()) throw InputError(path + ": error while reading pairs file");
  if (progress) progress->add(unreported);
  if (ex.size() == 0) throw InputError(path + ": no lines (expected input<TAB>target lines)");
  return ex;
}

PairSplit split_pairs(const PairExamples& all, double val_fraction) {
  const int64_t n = all.size();
  const int64_t n_val = val_token_count(n, val_fraction);
  const int64_t n_train = n - n_val;
  if (n_val == 0 || n_train == 0) {
    std::ostringstream os;
    os << "--val-fraction: " << val_fraction << " of " << n << " pairs leaves an empty "
       << (n_val == 0 ? "validation" : "training") << " split (expected both splits non-empty)";
    throw InputError(os.str());
  }
  PairSplit s;
  auto side = [&](int64_t i, const std::vector<int32_t>& tok, const std::vector<int64_t>& off) {
    return std::vector<int32_t>(tok.begin() + off[static_cast<std::size_t>(i)],
                                tok.begin() + off[static_cast<std::size_t>(i) + 1]);
  };
  for (int64_t i = 0; i < n; ++i) {
    (i < n_train ? s.train : s.val)
        .add(side(i, all.inputs, all.input_offsets), side(i, all.targets, all.target_offsets));
  }
  return s;
}

void write_pairs_file(const std::string& out, const PairSplit& split, const std::string& source) {
  write_atomically(out, [&](h5::File& f) {
    for (const auto& [name, ex] : {std::pair<std::string, const PairExamples*>{"train", &split.train},
                                   std::pair<std::string, const PairExamples*>{"val", &split.val}}) {
      write_i32(f, "/" + name + "/inputs", ex->inputs);
      write_i32(f, "/" + name + "/targets", ex->targets);
      f.write_i64("/" + name + "/input_offsets", ex->input_offsets.data(), {ex->input_offsets.size()});
      f.write_i64("/" + name + "/target_offsets", ex->target_offsets.data(), {ex->target_offsets.size()});
    }
    f.set_attr("/", "vocab_size", int64_t{259});
    f.set_attr("/", "tokenizer", std::string("byt5"));
    f.set_attr("/", "source", source);
    f.set_attr("/", "num_examples", split.train.size() + split.val.size());
  });
}

PairsSummary summarize_pairs(const PairSplit& split) {
  PairsSummary s;
  s.train_examples = split.train.size();
  s.val_examples = split.val.size();
  for (const PairExamples* ex : {&split.train, &split.val}) {
    s.input_tokens += static_cast<int64_t>(ex->inputs.size());
    s.target_tokens += static_cast<int64_t>(ex->targets.size());
    for (int64_t i = 0; i < ex->size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      s.max_input_len = std::max(s.max_input_len, ex->input_offsets[k + 1] - ex->input_offsets[k]);
      s.max_target_len = std::max(s.max_target_len, ex->target_offsets[k + 1] - ex->target_offsets[k]);
    }
  }
  const auto n = static_cast<double>(s.train_examples + s.val_examples);
  if (n > 0) {
    s.mean_input_len = static_cast<double>(s.input_tokens) / n;
    s.mean_target_len = static_cast<double>(s.target_tokens) / n;
  }
  return s;
}

PairsSummary prepare_pairs_dataset(const std::string& tsv, const std::string& out, double val_fraction,
                                   ProgressMeter* progress) {
  val_token_count(0, val_fraction);
  check_output_folder(out);
  check_output_not_input(out, {tsv});
  const PairSplit split = split_pairs(read_pairs_tsv(tsv, progress), val_fraction);
  write_pairs_file(out, split, "fsdp_prepare --pairs (ByT5 ids b + 3, eos 1): " + tsv);
  return summarize_pairs(split);
}

}  // namespace fsdp::data
