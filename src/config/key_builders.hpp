// The kinds of deck key (an int with a floor, a word out of a list, a data file, ...): each builds a
// KeySpec's parser, resolved text and reference type from one statement of the key's range.
#pragma once

#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "config_internal.hpp"

namespace shardlm::config_detail {

// Field accessor usable on a const or a mutable RunConfig.
#define SHARDLM_FIELD(path) [](auto& c) -> auto& { return c.path; }

// "`a` \| `b` \| `c`": a list of words as the reference's type column shows it.
std::string word_list(const std::vector<std::string>& words);

// An int of at least `min`; `why_min` is the complaint below it ("must be >= 1 (...)"), whose words up to
// the bracket are the reference's range ("int >= 1").
template <typename F>
KeySpec int_key(const char* name, F field, int min, const char* why_min, const char* required = nullptr) {
  KeySpec k{name, required,
            [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = parse_int(name, t, min, why_min); },
            [=](const RunConfig& c) { return std::to_string(field(c)); }};
  std::string range = why_min;
  range = range.substr(0, range.find(" ("));
  k.type = "int " + range.substr(range.rfind("must be ", 0) == 0 ? 8 : 0);
  return k;
}

template <typename F>
KeySpec unsigned_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              field(c) = static_cast<std::remove_reference_t<decltype(field(c))>>(parse_unsigned(name, t));
            },
            [=](const RunConfig& c) { return std::to_string(field(c)); }};
  k.type = "int >= 0";
  return k;
}

// The values a real-valued key accepts: `text` is the reference's range and, after "must be ", the complaint.
struct Range {
  const char* text;  // "> 0", "in [0, 1)"
  bool (*ok)(double);
};
inline constexpr Range kPositive{"> 0", [](double v) { return v > 0; }};
inline constexpr Range kNonNegative{">= 0", [](double v) { return v >= 0; }};
inline constexpr Range kUnitInterval{"in [0, 1)", [](double v) { return v >= 0 && v < 1; }};
inline constexpr Range kUnitClosed{"in [0, 1]", [](double v) { return v >= 0 && v <= 1; }};

template <typename F>
KeySpec double_key(const char* name, F field, Range range) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              double v = parse_double(name, t);
              if (!range.ok(v)) bad_value(name, t, std::string("must be ") + range.text);
              field(c) = v;
            },
            [=](const RunConfig& c) { return format_double(field(c)); }};
  k.type = std::string("float ") + range.text;
  return k;
}

template <typename F>
KeySpec positive_float_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              float v = parse_float(name, t);
              if (!(v > 0)) bad_value(name, t, "must be > 0");
              field(c) = v;
            },
            [=](const RunConfig& c) { return format_float(field(c)); }};
  k.type = "float > 0";
  return k;
}

// A lowercase word out of a fixed list; the canonical spelling is the list's.
template <typename F>
KeySpec choice_key(const char* name, F field, std::vector<std::string> choices) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              std::string v = lower(trim(t));
              for (const std::string& ch : choices)
                if (v == ch) return void(field(c) = ch);
              bad_value(name, quoted(t), choice_list(choices));
            },
            [=](const RunConfig& c) { return field(c); }};
  k.type = word_list(choices);
  return k;
}

// A lowercase word naming one of the enum's values (as `value_name` spells them), stored as the enum. The
// values are the enum's own, in its order: choices.cpp's name functions answer "?" past the last one.
template <typename F, typename E>
KeySpec enum_key(const char* name, F field, const char* (*value_name)(E)) {
  std::vector<E> values;
  std::vector<std::string> names;
  for (int i = 0; std::string(value_name(static_cast<E>(i))) != "?"; ++i) {
    values.push_back(static_cast<E>(i));
    names.emplace_back(value_name(values.back()));
  }
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              const std::string v = lower(trim(t));
              for (E e : values)
                if (v == value_name(e)) return void(field(c) = e);
              bad_value(name, quoted(t), choice_list(names));
            },
            [=](const RunConfig& c) { return std::string(value_name(field(c))); }};
  k.type = word_list(names);
  return k;
}

template <typename F>
KeySpec dtype_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              try {
                field(c) = parse_dtype(lower(trim(t)));
              } catch (const Error&) {
                bad_value(name, quoted(t), "must be fp32, bf16 or fp16");
              }
            },
            [=](const RunConfig& c) { return std::string(dtype_name(field(c))); }};
  k.type = word_list({"fp32", "bf16", "fp16"});
  return k;
}

// A data file: stored absolute and normalised; it must exist and be readable now, so a typo
// fails at start-up on every rank rather than after the model is built.
void check_data_file(const char* name, const std::string& text, const std::string& abs);
std::string absolute_path(const std::string& base_dir, const std::string& path);  // normalised

template <typename F>
KeySpec path_key(const char* name, F field, const char* required = nullptr) {
  KeySpec k{name, required,
            [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
              std::string v = trim(t);
              if (v.empty()) return void(field(c).clear());  // an empty eval_file means "no evaluation"
              std::string abs = absolute_path(base_dir, v);  // an absolute v replaces base_dir
              check_data_file(name, v, abs);
              field(c) = abs;
            },
            [=](const RunConfig& c) { return field(c); }};
  k.type = "path to a file";
  return k;
}

// Free text kept as written (trimmed); relative paths stay relative to the current folder. `type` says
// what the text is ("path to a folder").
template <typename F>
KeySpec text_key(const char* name, F field, const char* type) {
  KeySpec k{name, nullptr, [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = trim(t); },
            [=](const RunConfig& c) { return field(c); }};
  k.type = type;
  return k;
}

// A folder the run writes besides run.dir (checkpoint.dir): kept absolute, a relative path taken from the current
// folder, so that what records it (deck.resolved.ini, each checkpoint's deck) names it from anywhere (a run
// folder's checkpoints for inspect, export and generate: run_checkpoint_folder). Empty stays empty.
template <typename F>
KeySpec output_folder_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              const std::string v = trim(t);
              field(c) = v.empty() ? v : std::filesystem::absolute(v).lexically_normal().string();
            },
            [=](const RunConfig& c) { return field(c); }};
  k.type = "path to a folder";
  return k;
}

// Text that must not be empty, kept as written (run.dir).
template <typename F>
KeySpec nonempty_text_key(const char* name, F field, const char* type) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              std::string v = trim(t);
              if (v.empty()) bad_value(name, quoted(t), "must not be empty");
              field(c) = v;
            },
            [=](const RunConfig& c) { return field(c); }};
  k.type = type;
  return k;
}

template <typename F>
KeySpec flag_key(const char* name, F field) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = parse_bool(name, t); },
            [=](const RunConfig& c) { return std::string(field(c) ? "true" : "false"); }};
  k.type = "bool";
  return k;
}

// A folder of a known kind, relative to the deck's folder: it must hold each of `files` ("has no
// FILE (KIND is expected)" otherwise). model.dir: a Hugging Face model directory, whose config.json
// then gives the model's shape; model.adapter: a PEFT adapter directory.
void check_folder(const char* name, const std::string& text, const std::string& abs,
                  const std::vector<std::string>& files, const char* kind);

template <typename F>
KeySpec folder_key(const char* name, F field, std::vector<std::string> files, const char* kind) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
              std::string v = trim(t);
              if (v.empty()) return void(field(c).clear());
              const std::string abs = absolute_path(base_dir, v);
              check_folder(name, t, abs, files, kind);
              field(c) = abs;
            },
            [=](const RunConfig& c) { return field(c); }};
  k.type = "path to a folder";
  return k;
}

// Comma-separated module names, kept as written until the model's family resolves them (lora.cpp).
template <typename F>
KeySpec names_key(const char* name, F field, const char* type = "comma-separated names") {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) { field(c) = split_names(name, t); },
            [=](const RunConfig& c) { return join_names(field(c)); }};
  k.type = type;
  return k;
}

// fsdp.strategy: a PyTorch ShardingStrategy name, in capitals.
KeySpec strategy_key(const char* name);
// data.tokenizer: "auto" (model.dir's tokenizer.json, else byte), "byte", or a tokenizer.json file or a
// folder holding one, relative to the deck's folder.
KeySpec tokenizer_key(const char* name);
// checkpoint.resume: "none", "auto" or a path; whether the path exists is checked when the run resumes.
KeySpec resume_key(const char* name);

}  // namespace shardlm::config_detail
