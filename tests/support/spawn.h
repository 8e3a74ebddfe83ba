// tests/support/spawn.h
//
// Starts the built `dsv41` (DSV41_EXE) as a child process without a shell, so a test can kill it
// (kill -9) or run many at once; its stdout and stderr go to files (or /dev/null).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace dsv41::test {

// fork + exec DSV41_EXE args...; returns the child's pid (-1 on failure).
inline pid_t spawn_dsv41(const std::vector<std::string>& args, const std::string& log = "/dev/null") {
  std::vector<std::string> all = {DSV41_EXE};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for pid: its exit code, or 128 + the signal that ended it.
inline int wait_dsv41(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace dsv41::test
