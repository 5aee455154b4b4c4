// fsdp_prepare's logic: collect text files, concatenate their bytes, split, write HDF5
// (see fsdp/data/prepare.hpp and docs/data.md).
#include "fsdp/data/prepare.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <istream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/file_lock.hpp"
#include "fsdp/core/output_lock.hpp"
#include "fsdp/core/process.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/data/input_file.hpp"
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

// The output's checks (its folder exists, it is none of `inputs` and not inside one), then its
// lock, held by the caller until it returns: taken before any input is read, so a second
// fsdp_prepare of the same output is refused at once instead of deleting the first one's
// temporary (fsdp/core/output_lock.hpp).
OutputLock claim_output(const std::string& out, const std::vector<std::string>& inputs) {
  check_output_folder(out);
  check_output_not_input(out, inputs);
  return OutputLock(out, "-o/--output");
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
    InputFile file(f);  // gzip and zstd files are read as their decompressed bytes
    std::istream& in = file.stream();
    int64_t reported = 0;  // the file's bytes on disk added to progress so far
    for (;;) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = static_cast<std::size_t>(in.gcount());
      s.bytes.insert(s.bytes.end(), chunk.data(), chunk.data() + got);
      if (progress && file.disk_bytes_read() > reported) {
        progress->add(file.disk_bytes_read() - reported);
        reported = file.disk_bytes_read();
      }
      if (got < chunk.size()) break;  // end of file (errors throw InputError naming it)
    }
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
  const OutputLock lock = claim_output(out, inputs);
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
  InputFile input(path);  // gzip and zstd files are read as their decompressed text
  std::istream& in = input.stream();
  if (progress) {
    const auto size = fs::file_size(path, ec);
    progress->set_total(ec ? 0 : static_cast<int64_t>(size));
  }
  int64_t reported = 0;  // the file's bytes on disk added to progress so far (batched: a MiB)
  PairExamples ex;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (progress && input.disk_bytes_read() - reported >= (int64_t{1} << 20)) {
      progress->add(input.disk_bytes_read() - reported);
      reported = input.disk_bytes_read();
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
  if (progress) progress->add(input.disk_bytes_read() - reported);
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

void write_pairs_file(const std::string& out, const PairSplit& split, const std::string& source,
                      const PairsVocab& vocab) {
  write_atomically(out, [&](h5::File& f) {
    for (const auto& [name, ex] : {std::pair<std::string, const PairExamples*>{"train", &split.train},
                                   std::pair<std::string, const PairExamples*>{"val", &split.val}}) {
      write_i32(f, "/" + name + "/inputs", ex->inputs);
      write_i32(f, "/" + name + "/targets", ex->targets);
      f.write_i64("/" + name + "/input_offsets", ex->input_offsets.data(), {ex->input_offsets.size()});
      f.write_i64("/" + name + "/target_offsets", ex->target_offsets.data(), {ex->target_offsets.size()});
    }
    f.set_attr("/", "vocab_size", vocab.vocab_size);
    f.set_attr("/", "tokenizer", vocab.tokenizer);
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
  const OutputLock lock = claim_output(out, {tsv});
  const PairSplit split = split_pairs(read_pairs_tsv(tsv, progress), val_fraction);
  write_pairs_file(out, split, "fsdp_prepare --pairs (ByT5 ids b + 3, eos 1): " + tsv);
  return summarize_pairs(split);
}

// ---------------------------------------------------------------- token streams (SentencePiece, token files)

namespace {

// A 1-D token dataset of `n` ids stored as uint16 or uint32 (little-endian), filled in order
// from int32 ids by append() (one HDF5 hyperslab write each; HDF5 converts the type).
class TokenStreamWriter {
 public:
  TokenStreamWriter(const h5::File& f, const std::string& dataset, int64_t n, int dtype_bytes)
      : where_(f.path() + ": " + dataset), n_(n) {
    try {
      const hsize_t dims = static_cast<hsize_t>(n);
      h5::Handle space(FSDP_CHECK_HDF5(H5Screate_simple(1, &dims, nullptr)));
      h5::Handle lcpl(FSDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)));
      FSDP_CHECK_HDF5(H5Pset_create_intermediate_group(lcpl.id(), 1));
      dset_ = h5::Handle(FSDP_CHECK_HDF5(H5Dcreate2(f.id(), dataset.c_str(),
                                                    dtype_bytes == 2 ? H5T_STD_U16LE : H5T_STD_U32LE, space.id(),
                                                    lcpl.id(), H5P_DEFAULT, H5P_DEFAULT)));
    } catch (const Error& e) {
      throw Error(where_ + ": " + e.what(), e.exit_code());
    }
  }

  void append(const int32_t* ids, int64_t count) {
    if (count == 0) return;
    if (count < 0 || offset_ + count > n_) throw Error(where_ + ": append past the dataset's end");
    try {
      h5::Handle fspace(FSDP_CHECK_HDF5(H5Dget_space(dset_.id())));
      const hsize_t start = static_cast<hsize_t>(offset_), cnt = static_cast<hsize_t>(count);
      FSDP_CHECK_HDF5(H5Sselect_hyperslab(fspace.id(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr));
      h5::Handle mspace(FSDP_CHECK_HDF5(H5Screate_simple(1, &cnt, nullptr)));
      FSDP_CHECK_HDF5(H5Dwrite(dset_.id(), H5T_NATIVE_INT32, mspace.id(), fspace.id(), H5P_DEFAULT, ids));
    } catch (const Error& e) {
      throw Error(where_ + ": " + e.what(), e.exit_code());
    }
    offset_ += count;
  }

  int64_t written() const { return offset_; }

 private:
  std::string where_;
  int64_t n_, offset_ = 0;
  h5::Handle dset_;
};

// An input error raised while the output is being written: carried through
// AtomicFile::write (which prefixes fsdp::Errors with the output's name) unchanged, so the
// line names the input file first. The temporary is removed all the same.
struct InputFault {
  Error error;
};

void set_record_attrs(h5::File& f, const TokenizerRecord& r) {
  f.set_attr("/", "vocab_size", r.vocab_size);
  f.set_attr("/", "tokenizer", r.kind);
  if (!r.model_path.empty()) {  // sentencepiece, hf-bpe
    f.set_attr("/", "tokenizer_model", r.model_path);
    f.set_attr("/", "tokenizer_model_bytes", r.model_bytes);
    f.set_attr("/", "tokenizer_model_sha256", r.model_sha256);
    f.set_attr("/", "bos_id", r.bos_id);
    f.set_attr("/", "eos_id", r.eos_id);
    f.set_attr("/", "add_bos", int64_t{r.add_bos ? 1 : 0});
    f.set_attr("/", "add_eos", int64_t{r.add_eos ? 1 : 0});
    f.set_attr("/", "num_documents", r.num_documents);
  }
  if (!r.token_format.empty()) f.set_attr("/", "token_format", r.token_format);
}

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

}  // namespace

DocumentUnit parse_document_unit(const std::string& name) {
  if (name == "file") return DocumentUnit::file;
  if (name == "line") return DocumentUnit::line;
  if (name == "jsonl") return DocumentUnit::jsonl;
  throw InputError("--document: '" + printable(name, 64) + "' (expected file, line or jsonl)");
}

bool resolve_special(const std::optional<bool>& want, int32_t id, const std::string& flag, const std::string& model) {
  if (!want) return id >= 0;  // (prepare_tokenized_dataset adds one token for BOS == EOS)
  if (*want && id < 0) {
    throw InputError(flag + ": the tokenizer model " + printable(model) + " has no " +
                     (flag.find("bos") != std::string::npos ? "BOS" : "EOS") + " token (id -1) (expected --no-" +
                     flag.substr(2) + ", or leave it out: the token is added only where the model has one)");
  }
  return *want;
}

int token_dtype_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

namespace {

// An unnamed temporary file in `dir` holding the token stream as int32 ids, written in order
// and read back once: O_TMPFILE, so it has no name and nothing is left whatever ends the
// process; where the file system lacks O_TMPFILE, mkstemp and an unlink at once. Its
// descriptor is owned by a UniqueFd.
class TokenSpill {
 public:
  // `out` names the output in errors.
  TokenSpill(const fs::path& dir, const std::string& out) : out_(out) {
    const std::string d = dir.empty() ? std::string(".") : dir.string();
    fd_.reset(::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!fd_) {
      std::string name = (fs::path(d) / ".fsdp_prepare_tokens.XXXXXX").string();
      fd_.reset(::mkstemp(name.data()));
      if (fd_) ::unlink(name.c_str());
    }
    if (!fd_) fail("cannot create a temporary file in " + printable(d));
  }

  void append(const int32_t* ids, std::size_t n) {
    buf_.insert(buf_.end(), ids, ids + n);
    if (buf_.size() >= kBufferIds) flush();
  }
  // Writes the buffered ids. Throws fsdp::Error naming the output (and strerror: a full
  // disk is ENOSPC).
  void flush() {
    const auto* p = reinterpret_cast<const char*>(buf_.data());
    std::size_t left = buf_.size() * sizeof(int32_t);
    while (left > 0) {
      const ssize_t w = ::pwrite(fd_.get(), p, left, bytes_);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write the token stream's temporary file");
      p += w;
      bytes_ += w;
      left -= static_cast<std::size_t>(w);
    }
    buf_.clear();
  }
  int64_t size() const {
    return static_cast<int64_t>(bytes_ / static_cast<off_t>(sizeof(int32_t)) + buf_.size());
  }
  // Reads ids [offset, offset + count) (after flush()).
  void read(int64_t offset, int64_t count, int32_t* out) const {
    auto* p = reinterpret_cast<char*>(out);
    std::size_t left = static_cast<std::size_t>(count) * sizeof(int32_t);
    off_t at = static_cast<off_t>(offset) * static_cast<off_t>(sizeof(int32_t));
    while (left > 0) {
      const ssize_t r = ::pread(fd_.get(), p, left, at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail("cannot read back the token stream's temporary file");
      p += r;
      at += r;
      left -= static_cast<std::size_t>(r);
    }
  }

 private:
  static constexpr std::size_t kBufferIds = std::size_t{1} << 20;
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(printable(out_) + ": " + what + " (" + std::strerror(errno) + ")");
  }
  std::string out_;
  UniqueFd fd_;
  std::vector<int32_t> buf_;
  off_t bytes_ = 0;  // written to the file
};

// The text of one JSON Lines record: its string field `key`; "" for a blank line. Throws
// InputError "<where>: ..." for a line that is not a JSON object or lacks the string field.
std::string jsonl_text(const std::string& line, const std::string& key, const std::string& where) {
  if (line.find_first_not_of(" \t") == std::string::npos) return {};
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(where + ": not JSON (parse error at byte " + std::to_string(e.byte) +
                     "; --document jsonl reads one JSON object per line)");
  }
  const auto it = record.is_object() ? record.find(key) : record.end();
  if (it == record.end() || !it->is_string()) {
    throw InputError(where + ": no string field \"" + printable(key, 64) +
                     "\" (--document jsonl reads each line's --text-key field, default \"text\")");
  }
  return it->get<std::string>();
}

// One document of a batch: its text and where it came from (file index; line number, 0 for a
// whole file).
struct Document {
  std::string text;
  int32_t file = 0;
  int64_t line = 0;
};

// Encodes one batch: document i's ids into ids[i], on up to handles.size() threads (one
// handle each), each thread taking the next document not yet taken. The first failure in
// document order is rethrown once every thread has stopped.
void encode_batch(const std::vector<Document>& docs, const std::vector<std::string>& names,
                  const std::vector<std::unique_ptr<TextTokenizer>>& handles,
                  std::vector<std::vector<int32_t>>& ids) {
  ids.assign(docs.size(), {});
  const auto where = [&](const Document& d) {
    return d.line > 0 ? names[d.file] + ":" + std::to_string(d.line) : names[d.file];
  };
  const std::size_t threads = std::min(handles.size(), docs.size());
  if (threads <= 1) {
    for (std::size_t i = 0; i < docs.size(); ++i) {
      handles[0]->encode(docs[i].text, ids[i], where(docs[i]));
    }
    return;
  }
  // After a failure at document k, documents after k are skipped but those before it are
  // still encoded: one of them may fail too, and the first in order is the one reported.
  std::atomic<std::size_t> next{0}, first_bad{docs.size()};
  std::vector<std::exception_ptr> errors(docs.size());
  auto work = [&](std::size_t t) {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= first_bad.load()) return;
      try {
        handles[t]->encode(docs[i].text, ids[i], where(docs[i]));
      } catch (...) {
        errors[i] = std::current_exception();
        for (std::size_t k = first_bad.load(); i < k && !first_bad.compare_exchange_weak(k, i);) {
        }
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

TokenStreamCounts encode_documents(const std::vector<fs::path>& files, const TextTokenizer& tok,
                                   bool add_bos, bool add_eos, const DocumentFormat& document,
                                   int num_threads,
                                   const std::function<void(const int32_t*, std::size_t)>& emit,
                                   ProgressMeter* progress, std::size_t batch_bytes) {
  if (progress) {
    int64_t expected = 0;
    for (const auto& f : files) {
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      if (!ec) expected += static_cast<int64_t>(size);
    }
    progress->set_total(expected);
  }
  const int threads = num_threads > 0 ? num_threads : usable_cpus();
  std::vector<std::unique_ptr<TextTokenizer>> handles;
  for (int t = 0; t < threads; ++t) handles.push_back(tok.clone_for_thread());
  // A batch holds batch_bytes of text per thread (4 MiB): enough documents to share out, and
  // the memory (the batch's text and ids) does not grow with the corpus.
  const std::size_t batch_limit =
      std::max<std::size_t>(1, batch_bytes) * static_cast<std::size_t>(threads);
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(printable(f.string()));
  const int32_t bos = tok.bos_id(), eos = tok.eos_id();
  TokenStreamCounts counts;
  std::vector<Document> batch;
  std::size_t pending_bytes = 0;  // input bytes read for the batch (newlines included)
  int64_t pending_disk = 0;       // the files' bytes on disk read for the batch (progress)
  std::vector<std::vector<int32_t>> ids;
  auto run_batch = [&] {
    encode_batch(batch, names, handles, ids);
    for (const auto& v : ids) {
      if (add_bos) emit(&bos, 1);
      emit(v.data(), v.size());
      if (add_eos) emit(&eos, 1);
      counts.tokens += static_cast<int64_t>(v.size()) + (add_bos ? 1 : 0) + (add_eos ? 1 : 0);
    }
    counts.documents += static_cast<int64_t>(batch.size());
    if (progress) progress->add(pending_disk);
    batch.clear();
    pending_bytes = 0;
    pending_disk = 0;
  };
  auto add_document = [&](std::string&& text, int32_t file, int64_t line, std::size_t bytes_read) {
    pending_bytes += bytes_read;
    if (!text.empty()) batch.push_back(Document{std::move(text), file, line});
    if (pending_bytes >= batch_limit) run_batch();
  };
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    const auto file = static_cast<int32_t>(fi);
    InputFile input(files[fi]);  // gzip and zstd files are read as their decompressed text
    std::istream& in = input.stream();
    // Progress counts the files' bytes on disk (compressed ones' too), added once the batch
    // that holds them is encoded; batches are sized by their text.
    int64_t counted = 0;  // this file's bytes on disk already in pending_disk
    const auto count_disk = [&] {
      pending_disk += input.disk_bytes_read() - counted;
      counted = input.disk_bytes_read();
    };
    if (document.unit == DocumentUnit::file) {
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::size_t n = text.size();
      count_disk();
      add_document(std::move(text), file, 0, n);
    } else {
      std::string line;
      int64_t lineno = 0;
      while (std::getline(in, line)) {
        ++lineno;
        const std::size_t n = line.size() + (in.eof() ? 0 : 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (document.unit == DocumentUnit::jsonl) {
          line = jsonl_text(line, document.text_key, names[fi] + ":" + std::to_string(lineno));
        }
        count_disk();
        add_document(std::move(line), file, lineno, n);
        line = std::string();
      }
    }
    count_disk();
    ++counts.files;
  }
  if (!batch.empty() || pending_bytes > 0 || pending_disk > 0) run_batch();
  return counts;
}

TokenizedSummary prepare_tokenized_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                           double val_fraction, const TokenizerOptions& options,
                                           ProgressMeter* progress) {
  val_token_count(0, val_fraction);
  std::vector<std::string> all_inputs = inputs;
  all_inputs.push_back(options.model);
  const OutputLock lock = claim_output(out, all_inputs);
  std::string note;
  const std::unique_ptr<TextTokenizer> tok =
      load_text_tokenizer(options.model, options.specials, &note);
  const bool add_bos = resolve_special(options.add_bos, tok->bos_id(), "--add-bos", tok->path());
  // One token for both (GPT-2's <|endoftext|>): by default once per document, not twice.
  const bool same = tok->eos_id() >= 0 && tok->eos_id() == tok->bos_id();
  const bool add_eos = !options.add_eos && same && add_bos
                           ? false
                           : resolve_special(options.add_eos, tok->eos_id(), "--add-eos", tok->path());
  TokenizedSummary summary;
  summary.tokenizer_note = note;
  const auto files = collect_input_files(inputs, &summary.skipped);
  // The stream goes to an unnamed file beside the output, so memory stays one batch whatever
  // the corpus; the split is known once its length is.
  TokenSpill spill(fs::path(out).parent_path(), out);
  const TokenStreamCounts counts =
      encode_documents(files, *tok, add_bos, add_eos, options.document, options.num_threads,
                       [&](const int32_t* ids, std::size_t n) { spill.append(ids, n); }, progress);
  spill.flush();
  const int64_t n = spill.size();
  const int64_t n_val = val_token_count(n, val_fraction);
  const int64_t n_train = n - n_val;
  if (n_val == 0 || n_train == 0) {
    std::ostringstream os;
    os << "--val-fraction: " << val_fraction << " of " << n << " tokens (" << counts.documents
       << " documents) leaves an empty " << (n_val == 0 ? "validation" : "training")
       << " split (expected more text or another fraction)";
    throw InputError(os.str());
  }
  TokenizerRecord r;
  r.kind = tok->kind();
  r.vocab_size = tok->vocab_size();
  r.model_path = absolute_path(tok->path());
  r.model_bytes = tok->model_bytes();
  r.model_sha256 = tok->model_sha256();
  r.bos_id = tok->bos_id();
  r.eos_id = tok->eos_id();
  r.add_bos = add_bos;
  r.add_eos = add_eos;
  r.num_documents = counts.documents;
  std::string source = "fsdp_prepare --tokenizer " + options.model +
                       (options.document.unit == DocumentUnit::line    ? " --document line"
                        : options.document.unit == DocumentUnit::jsonl ? " --document jsonl --text-key " +
                                                                             options.document.text_key
                                                                       : "") +
                       ":";
  for (const auto& in : inputs) source += " " + in;
  const int dtype = token_dtype_bytes(r.vocab_size);
  write_atomically(out, [&](h5::File& f) {
    std::vector<int32_t> chunk;
    using Part = std::tuple<const char*, int64_t, int64_t>;  // dataset, first id, count
    for (const auto& [name, begin, count] :
         {Part{"/train/tokens", 0, n_train}, Part{"/val/tokens", n_train, n_val}}) {
      TokenStreamWriter w(f, name, count, dtype);
      for (int64_t at = 0; at < count; at += int64_t{1} << 20) {
        const int64_t k = std::min<int64_t>(int64_t{1} << 20, count - at);
        chunk.resize(static_cast<std::size_t>(k));
        spill.read(begin + at, k, chunk.data());
        w.append(chunk.data(), k);
      }
    }
    set_record_attrs(f, r);
    f.set_attr("/", "source", source);
    f.set_attr("/", "num_files", counts.files);
  });
  summary.kind = r.kind;
  summary.files = counts.files;
  summary.documents = counts.documents;
  summary.train_tokens = n_train;
  summary.val_tokens = n_val;
  summary.vocab_size = r.vocab_size;
  summary.bos_id = add_bos ? tok->bos_id() : -1;
  summary.eos_id = add_eos ? tok->eos_id() : -1;
  return summary;
}

TokenFilesSummary prepare_token_file_dataset(const TokenFileOptions& options, const std::string& out,
                                             double val_fraction, ProgressMeter* progress) {
  if (options.vocab_size == 0) {
    throw InputError("--vocab-size: missing (required with --token-file: llm.c and nanoGPT files do not record "
                     "it; e.g. 50257 for GPT-2, 128256 for Llama 3)");
  }
  if (options.vocab_size < 1 || options.vocab_size > (int64_t{1} << 31) - 1) {
    throw InputError("--vocab-size: " + std::to_string(options.vocab_size) + " (expected 1 .. 2^31-1)");
  }
  if (options.files.empty()) throw InputError("--token-file: none given (expected llm.c or nanoGPT token files)");
  const bool val_from_files = !options.val_files.empty();
  if (!val_from_files) val_token_count(0, val_fraction);
  std::vector<std::string> all = options.files;
  all.insert(all.end(), options.val_files.begin(), options.val_files.end());
  const OutputLock lock = claim_output(out, all);

  // Inspect every file before writing anything: one format (and one llm.c magic) for all.
  std::vector<TokenFileInfo> infos;
  int64_t n_train = 0, n_val = 0, total_bytes = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    TokenFileInfo info = inspect_token_file(all[i], options.format);
    if (!infos.empty() && (info.format != infos.front().format || info.magic != infos.front().magic)) {
      throw InputError(printable(info.path) + ": " + info.describe() + " file, but " + printable(infos.front().path) +
                       " is " + infos.front().describe() + " (expected every token file in one format)");
    }
    (i < options.files.size() ? n_train : n_val) += info.num_tokens;
    total_bytes += info.num_tokens * info.token_bytes;
    infos.push_back(std::move(info));
  }
  if (!val_from_files) {
    const int64_t n = n_train;
    n_val = val_token_count(n, val_fraction);
    n_train = n - n_val;
    if (n_val == 0 || n_train == 0) {
      std::ostringstream os;
      os << "--val-fraction: " << val_fraction << " of " << n << " tokens leaves an empty "
         << (n_val == 0 ? "validation" : "training")
         << " split (expected more tokens, another fraction, or --val-token-file)";
      throw InputError(os.str());
    }
  }
  if (progress) progress->set_total(total_bytes);

  TokenizerRecord r;
  r.kind = infos.front().kind();
  r.vocab_size = options.vocab_size;
  r.token_format = infos.front().describe();
  std::string source = "fsdp_prepare --token-file (" + r.token_format + "):";
  for (const auto& f : options.files) source += " " + f;
  if (val_from_files) {
    source += " --val-token-file:";
    for (const auto& f : options.val_files) source += " " + f;
  }
  const int dtype = token_dtype_bytes(options.vocab_size);
  try {
    write_atomically(out, [&](h5::File& f) {
      TokenStreamWriter train(f, "/train/tokens", n_train, dtype);
      TokenStreamWriter val(f, "/val/tokens", n_val, dtype);
      std::vector<int32_t> chunk;
      for (const TokenFileInfo& info : infos) {
        std::optional<TokenFileReader> reader;
        try {
          reader.emplace(info, options.vocab_size);
        } catch (const Error& e) {
          throw InputFault{e};
        }
        while (reader->remaining() > 0) {
          const int64_t c = std::min<int64_t>(reader->remaining(), int64_t{1} << 20);
          chunk.resize(static_cast<std::size_t>(c));
          try {
            reader->read(c, chunk.data());
          } catch (const Error& e) {
            throw InputFault{e};
          }
          const int64_t to_train = std::min(c, n_train - train.written());
          train.append(chunk.data(), to_train);
          val.append(chunk.data() + to_train, c - to_train);
          if (progress) progress->add(c * info.token_bytes);
        }
      }
      set_record_attrs(f, r);
      f.set_attr("/", "source", source);
      f.set_attr("/", "num_files", static_cast<int64_t>(infos.size()));
    });
  } catch (const InputFault& fault) {
    throw fault.error;
  }
  TokenFilesSummary s;
  s.train_files = static_cast<int64_t>(options.files.size());
  s.val_files = static_cast<int64_t>(options.val_files.size());
  s.train_tokens = n_train;
  s.val_tokens = n_val;
  s.vocab_size = options.vocab_size;
  s.format = r.token_format;
  return s;
}

// ---------------------------------------------------------------- prompt-completion pairs (sft)

PairExamples read_prompt_completion_jsonl(const std::string& path, const TextTokenizer& tok,
                                          bool add_bos, bool add_eos) {
  InputFile input(path);  // gzip and zstd files are read as their decompressed text
  std::istream& in = input.stream();
  PairExamples ex;
  std::string line;
  std::vector<int32_t> prompt, completion;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw InputError(where + ": not a JSON object (expected {\"prompt\": ..., \"completion\": ...})");
    }
    for (const char* key : {"prompt", "completion"}) {
      if (!j.is_object() || !j.contains(key) || !j[key].is_string()) {
        throw InputError(where + ": no string \"" + key +
                         "\" (expected {\"prompt\": ..., \"completion\": ...}, TRL's prompt-completion lines)");
      }
    }
    const std::string& c = j["completion"].get_ref<const std::string&>();
    if (c.empty()) throw InputError(where + ": \"completion\" is empty (expected text to learn)");
    prompt.clear();
    completion.clear();
    if (add_bos) prompt.push_back(tok.bos_id());
    tok.encode(j["prompt"].get_ref<const std::string&>(), prompt, where);
    tok.encode(c, completion, where);
    if (add_eos) completion.push_back(tok.eos_id());
    ex.add(prompt, completion);
  }
  if (ex.size() == 0) throw InputError(path + ": no prompt-completion lines");
  return ex;
}

TokenizedPairsSummary prepare_tokenized_pairs(const std::string& jsonl, const std::string& out,
                                              double val_fraction, const TokenizerOptions& options) {
  val_token_count(0, val_fraction);
  const OutputLock lock = claim_output(out, {jsonl, options.model});
  TokenizedPairsSummary s;
  const std::unique_ptr<TextTokenizer> tok =
      load_text_tokenizer(options.model, options.specials, &s.tokenizer_note);
  const bool add_bos = resolve_special(options.add_bos, tok->bos_id(), "--add-bos", tok->path());
  const bool add_eos = resolve_special(options.add_eos, tok->eos_id(), "--add-eos", tok->path());
  const PairSplit split =
      split_pairs(read_prompt_completion_jsonl(jsonl, *tok, add_bos, add_eos), val_fraction);
  write_pairs_file(out, split, "fsdp_prepare --pairs " + jsonl + " --tokenizer " + tok->path(),
                   {tok->vocab_size(), tok->kind()});
  s.pairs = summarize_pairs(split);
  s.kind = tok->kind();
  s.vocab_size = tok->vocab_size();
  s.bos_id = add_bos ? tok->bos_id() : -1;
  s.eos_id = add_eos ? tok->eos_id() : -1;
  return s;
}

}  // namespace fsdp::data
