// StderrCapture: everything written to file descriptor 2 between construction and text(), for
// tests that check what mkernel logs (fd 2 goes to a temporary file meanwhile).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/catch.h"

namespace mktest {

class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    char tmpl[] = "/tmp/mkernel-stderr-XXXXXX";
    fd_ = mkstemp(tmpl);
    REQUIRE(fd_ >= 0);
    path_ = tmpl;
    saved_ = dup(2);
    REQUIRE(dup2(fd_, 2) == 2);
  }
  ~StderrCapture() {
    restore();
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Restores fd 2 and returns what was written.
  std::string text() {
    restore();
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
};

}  // namespace mktest
