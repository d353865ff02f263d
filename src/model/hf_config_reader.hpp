// Private to src/model: reading and writing a Hugging Face config.json, shared by the families'
// mappings (src/model/<family>/*_family.cpp) and the dispatch in hf_config.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "shardlm/core.hpp"

namespace shardlm {

using OrderedJson = nlohmann::ordered_json;

// The shortest decimal that reads back as the same float, so JSON shows 1e-05, not 9.99999974737875e-06.
double shortest_decimal(float f);

// Reads config[key] (or the first of several spellings) as T; Error naming the key and the file.
class HfConfigReader {
 public:
  using Json = nlohmann::json;
  HfConfigReader(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  // Whether the file names `key` at all (null included: find() treats null as absent).
  bool has(const char* key) const { return j_.contains(key); }
  const Json* find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      auto it = j_.find(k);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }
  template <typename T>
  T get(std::initializer_list<const char*> keys) const {
    const Json* v = find(keys);
    SHARDLM_CHECK(v, source_, ": config.json has no '", *keys.begin(), "'");
    return as<T>(*v, *keys.begin());
  }
  template <typename T>
  T get_or(std::initializer_list<const char*> keys, T fallback) const {
    const Json* v = find(keys);
    return v ? as<T>(*v, *keys.begin()) : fallback;
  }
  // A float that must be finite and > 0 (an epsilon, a rotary base).
  float positive_or(std::initializer_list<const char*> keys, float fallback) const {
    const float x = get_or<float>(keys, fallback);
    SHARDLM_CHECK(std::isfinite(x) && x > 0, source_, ": config.json '", *keys.begin(), "' = ", x, ": must be > 0");
    return x;
  }
  template <typename T>
  T as(const Json& v, const char* key) const {
    try {
      if constexpr (std::is_same_v<T, int>) {
        SHARDLM_CHECK(v.is_number_integer(), source_, ": config.json '", key, "' must be an integer, got ",
                      clip_for_message(v.dump()));
        // Read at 64 bits (JSON's unsigned too) and range-checked: 4294967298 must not become 2.
        const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                                                 : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
        SHARDLM_CHECK(fits, source_, ": config.json '", key, "' = ", v.dump(), " is out of range (at most ", INT32_MAX,
                      ")");
      } else if constexpr (std::is_same_v<T, bool>) {
        SHARDLM_CHECK(v.is_boolean(), source_, ": config.json '", key, "' must be true or false, got ",
                      clip_for_message(v.dump()));
      } else if constexpr (std::is_same_v<T, std::string>) {
        SHARDLM_CHECK(v.is_string(), source_, ": config.json '", key, "' must be a string, got ",
                      clip_for_message(v.dump()));
      } else {
        SHARDLM_CHECK(v.is_number(), source_, ": config.json '", key, "' must be a number, got ",
                      clip_for_message(v.dump()));
      }
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(concat(source_, ": config.json '", key, "': ", e.what()));
    }
  }
  const std::string& source() const { return source_; }
  const Json* root() const { return &j_; }  // the whole object read

 private:
  const Json& j_;
  std::string source_;
};

}  // namespace shardlm
