// tests/child_process.hpp: run a piece of a test in a forked child process.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

namespace test_util {

// Runs `body` in a forked child (no MPI there: it must not communicate) and returns its wait
// status (WIFSIGNALED / WEXITSTATUS ...); the child exits 0 when `body` returns.
template <class Body>
int in_child(Body body) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

}  // namespace test_util
