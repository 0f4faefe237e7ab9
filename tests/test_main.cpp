#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "nibble/util.h"
#include "test_util.h"

namespace nibble::test {

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    path_ = base / (tag + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(path_)) break;
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_command(const std::string& cmdline) {
  TempDir tmp("nibble-cmd");
  auto out = tmp / "out.txt", err = tmp / "err.txt";
  std::string full = cmdline + " >" + out.string() + " 2>" + err.string();
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace nibble::test

int main(int argc, char** argv) {
  nibble::select_blas_kernels(argv);  // the kernels the CLI (which the end-to-end tests run) uses
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
