// tests/test_output_lock.cpp: fsdp::OutputLock (fsdp/core/output_lock.hpp), the lock that keeps
// a second fsdp_prepare of the same output from deleting the first one's temporary. flock is per
// open file description, so two OutputLocks of this one process exclude each other as two
// processes do (tests/cli/prepare.sh concurrent_output holds the lock from another process).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/file_lock.hpp"
#include "fsdp/core/output_lock.hpp"

namespace fs = std::filesystem;

namespace {

class OutputLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fsdp_output_lock_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// The error a second writer gets: exit code 2, the option, the output and the lock file named.
fsdp::Error refusal(const std::string& output) {
  try {
    fsdp::OutputLock second(output, "-o/--output");
  } catch (const fsdp::Error& e) {
    return e;
  }
  ADD_FAILURE() << "a second OutputLock of " << output << " was granted";
  return fsdp::Error("granted");
}

TEST_F(OutputLockTest, ASecondWriterOfTheSameOutputIsRefusedWhileTheFirstHoldsIt) {
  const std::string out = path("out.h5");
  std::optional<fsdp::OutputLock> first(std::in_place, out, "-o/--output");
  EXPECT_EQ(first->lock_path(), out + ".lock");
  EXPECT_TRUE(fs::is_regular_file(out + ".lock"));
  const fsdp::Error e = refusal(out);
  EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
  EXPECT_EQ(std::string(e.what()), "-o/--output: " + out +
                                        " is being written by another process (it holds " + out +
                                        ".lock); wait for it to end or choose another output");
  EXPECT_TRUE(fs::is_regular_file(out + ".lock"))
      << "the refused writer removed the holder's lock file";
  // Another output is not affected.
  EXPECT_NO_THROW(fsdp::OutputLock(path("other.h5"), "-o/--output"));
  first.reset();
  EXPECT_FALSE(fs::exists(out + ".lock")) << "the lock file outlived its holder";
  EXPECT_NO_THROW(fsdp::OutputLock(out, "-o/--output")) << "released, the lock is free again";
}

// A writer that died left its (unlocked) lock file: the next one takes it over and removes it.
TEST_F(OutputLockTest, ALockFileLeftByADeadWriterIsTakenOver) {
  const std::string out = path("out.h5");
  std::ofstream(out + ".lock") << "left by a crash\n";
  {
    fsdp::OutputLock lock(out, "-o/--output");
    EXPECT_EQ(refusal(out).exit_code(), fsdp::kExitInputError);
  }
  EXPECT_FALSE(fs::exists(out + ".lock"));
}

TEST_F(OutputLockTest, AMissingFolderOrALinkedLockFileIsOneClearError) {
  const std::string missing = path("no_such_folder/out.h5");
  try {
    fsdp::OutputLock lock(missing, "-o/--output");
    ADD_FAILURE() << "locked an output in a missing folder";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    EXPECT_EQ(std::string(e.what()),
              "-o/--output: cannot create " + missing + ".lock: No such file or directory");
  }
  // A symbolic link in the lock file's place is not followed (O_NOFOLLOW): its target stays.
  const std::string out = path("out.h5");
  std::ofstream(path("target")) << "keep\n";
  fs::create_symlink(path("target"), out + ".lock");
  try {
    fsdp::OutputLock lock(out, "-o/--output");
    ADD_FAILURE() << "locked through a symbolic link";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create " + out + ".lock"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_symlink(out + ".lock"));
  std::ifstream target(path("target"));
  std::string line;
  std::getline(target, line);
  EXPECT_EQ(line, "keep");
}

// try_lock_file (fsdp/core/file_lock.hpp), what OutputLock and the run directory's lock share:
// a second open file description finds it held and gets the descriptor to read the holder's
// note; a FIFO is refused as not a regular file (opening it read-write does not block); the
// descriptor closes with its owner, releasing the lock.
TEST_F(OutputLockTest, TryLockFileHoldsOnceAndRefusesWhatIsNotARegularFile) {
  const std::string file = path("x.lock");
  {
    fsdp::LockFile first = fsdp::try_lock_file(file, "key");
    ASSERT_TRUE(first.held);
    ASSERT_EQ(::write(first.fd.get(), "holder\n", 7), 7);
    fsdp::LockFile second = fsdp::try_lock_file(file, "key");
    EXPECT_FALSE(second.held);
    ASSERT_TRUE(second.fd);
    char buf[8] = {};
    EXPECT_EQ(::pread(second.fd.get(), buf, 7, 0), 7);
    EXPECT_EQ(std::string(buf), "holder\n");
    fsdp::UniqueFd moved = std::move(first.fd);
    EXPECT_FALSE(first.fd);
    EXPECT_FALSE(fsdp::try_lock_file(file, "key").held) << "the moved descriptor still holds it";
  }
  EXPECT_TRUE(fsdp::try_lock_file(file, "key").held) << "closing the owner released the lock";
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  try {
    fsdp::try_lock_file(path("fifo"), "train.run_dir");
    ADD_FAILURE() << "locked a FIFO";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    EXPECT_EQ(std::string(e.what()), "train.run_dir: cannot lock " + path("fifo") + ": not a regular file");
  }
}

}  // namespace
