// fsdp/core/atomic_file.hpp: the one way fsdp_train, fsdp_merge and fsdp_prepare publish a
// file or a directory, so a crash or a full disk never leaves a half-written one under its
// final name.
//
// The protocol (what `git`, SQLite and torch.distributed.checkpoint's FileSystemWriter do):
// write everything to a temporary name in the SAME directory (`path + ".tmp"`: a rename
// within one file system is atomic), fsync the temporary, rename it onto the final name,
// fsync the directory so the rename itself is durable. On any failure the temporary is
// removed and an fsdp::Error (exit code 1) names the final path and the system's reason
// (strerror: a full disk reads "No space left on device").
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace fsdp {

// fsyncs a file (`directory` false) or a directory. Throws fsdp::Error
// "<path>: cannot open for fsync: <strerror>" or "<path>: fsync failed: <strerror>".
void fsync_path(const std::string& path, bool directory);

// rename(2)s `from` onto `to` (files or directories, same file system), then fsyncs the
// directory holding `to`. Throws fsdp::Error "<to>: cannot rename from <from>: <strerror>".
void rename_durably(const std::string& from, const std::string& to);

// One file being written atomically. The writer fills tmp_path() by any means (an
// std::ofstream, HDF5, ...), closes it, then calls commit(). Destroying the object without
// a successful commit() removes the temporary (never throws), so an exception anywhere
// between construction and commit leaves neither a temporary nor a changed `path`.
class AtomicFile {
 public:
  // Removes a temporary left by an earlier crash. Does not create anything.
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  const std::string& path() const { return path_; }          // the final name
  const std::string& tmp_path() const { return tmp_path_; }  // path + ".tmp"

  // fsyncs tmp_path(), renames it onto path(), fsyncs the directory. On failure removes the
  // temporary and throws fsdp::Error "<path>: <what> failed: <strerror>" (if only the
  // directory fsync fails, the file is already in place). Call once.
  void commit();

  // Runs `fill(tmp_path())`, then commit(). If `fill` throws an fsdp::Error, the temporary
  // is removed and the error is rethrown (same exit code) as "<path>: <message>", with a
  // leading "<tmp_path>: " or "<path>: " of the message dropped, so the line names the
  // final file once. Other exceptions are rethrown unchanged after the removal.
  void write(const std::function<void(const std::string& tmp)>& fill);

 private:
  void remove_tmp() noexcept;
  std::string path_, tmp_path_;
  bool committed_ = false;
  int signal_slot_ = -1;  // this temporary's entry for remove_temporaries_on_signal
};

// For a tool that ends on SIGTERM, SIGINT or SIGHUP (fsdp_merge, fsdp_prepare; fsdp_train
// has its own graceful stop): installs a handler that unlinks the temporaries of the
// AtomicFiles alive at that moment, then restores the default action and raises the signal
// again, so the process still ends by it (exit status 128 + N in a shell). A killed merge
// leaves no model.safetensors.tmp (28 GB at 7B) behind; the final files are untouched either
// way. A signal the process inherited as ignored (SIGINT and SIGQUIT of a background job
// without job control) stays ignored. unlink(2) is async-signal-safe; the temporaries are
// kept in a fixed table of 32 absolute paths of < 4096 bytes (one beyond that is left for the
// next writer's AtomicFile to remove, as after SIGKILL). Never fails: sigaction(2) fails only
// for an invalid signal or address.
void remove_temporaries_on_signal() noexcept;

// Writes `bytes` as the whole content of `path`, atomically (AtomicFile with a plain
// write(2) loop). Throws fsdp::Error "<path>: write failed: <strerror>" (or a commit error).
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace fsdp
