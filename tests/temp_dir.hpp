// TempDir: a fresh folder for one test's files, removed with everything in it at the end.
#pragma once

#include <stdlib.h>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <string>

// A fresh folder under the system's temporary directory ("shardlm_test_NAME_XXXXXX"), removed
// with everything in it when the object goes.
struct TempDir {
  std::filesystem::path root;
  explicit TempDir(const std::string& name) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("shardlm_test_" + name + "_XXXXXX")).string();
    BOOST_REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    root = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Writes `text` to root/rel (creating its folders); returns the file's path.
  std::string write(const std::string& rel, const std::string& text) const {
    const std::filesystem::path p = root / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};
