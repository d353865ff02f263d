// Small helpers shared by the serial and MPI suites.
#pragma once

#include <boost/test/unit_test.hpp>

#include <functional>
#include <string>

#include "shardlm/core.hpp"

// The message of the shardlm::Error `f` throws; fails the test if it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const shardlm::Error& e) {
    return e.what();
  }
  BOOST_ERROR("expected a shardlm::Error, none was thrown");
  return "";
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
