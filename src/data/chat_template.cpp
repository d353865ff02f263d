// Chat templates: where a run's comes from (data.chat_template, the model folder, the tokenizer's
// folder), with the special tokens transformers passes to it, and rendering one conversation.
#include <filesystem>

#include "../core/input_file.hpp"
#include "data_file.hpp"
#include "jinja.hpp"
#include "chat.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

struct ChatTemplate::Impl {
  std::shared_ptr<const jinja::Template> tmpl;
  jinja::Dict specials;  // bos_token, eos_token, ... as transformers passes them
  std::string eos;
};

namespace {

std::string read_text(const std::string& path) { return read_input_file(path, "chat template file", 64 << 20); }

// A special token in tokenizer_config.json: a string, or an added token's {"content": ...}.
std::string special_token(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

Json read_config(const std::string& path) {
  try {
    return parse_ordered_json_bounded(read_text(path), path);
  } catch (const Json::exception& e) {
    throw Error(concat(path, ": not valid JSON: ", clip_for_message(e.what())));
  }
}

// chat_template: a string, or [{"name", "template"}] whose "default" is taken (else the first).
std::string template_of(const Json& config, const std::string& path) {
  const Json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  SHARDLM_CHECK(t.is_array() && !t.empty(), path, ": chat_template must be a string or a list of {name, template}");
  for (const Json& named : t)
    if (named.value("name", "") == "default" && named.contains("template")) return named["template"].get<std::string>();
  SHARDLM_CHECK(t[0].contains("template") && t[0]["template"].is_string(), path, ": chat_template[0] has no 'template'");
  return t[0]["template"].get<std::string>();
}

ChatTemplate from_config(const Json& config, const std::string& path) {
  ChatTemplate t = ChatTemplate::from_text(template_of(config, path), path + " (chat_template)",
                                           special_token(config, "bos_token"), special_token(config, "eos_token"));
  return t;
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool has_template(const fs::path& config) {
  if (!is_file(config)) return false;
  const Json j = read_config(config.string());
  return j.contains("chat_template") && !j["chat_template"].is_null();
}

}  // namespace

ChatTemplate ChatTemplate::from_text(const std::string& text, const std::string& source, const std::string& bos_token,
                                     const std::string& eos_token) {
  auto impl = std::make_shared<Impl>();
  impl->tmpl = std::make_shared<jinja::Template>(text, source);
  if (!bos_token.empty()) impl->specials.set("bos_token", jinja::Value::string(bos_token));
  if (!eos_token.empty()) impl->specials.set("eos_token", jinja::Value::string(eos_token));
  impl->eos = eos_token;
  ChatTemplate t;
  t.impl_ = impl;
  return t;
}

ChatTemplate ChatTemplate::from_file(const std::string& path) {
  if (fs::path(path).extension() == ".json") {
    const Json config = read_config(path);
    SHARDLM_CHECK(config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null(), path,
                  ": no chat_template in this file");
    return from_config(config, path);
  }
  return from_text(read_text(path), path);
}

std::string ChatTemplate::render(const Json& messages, bool add_generation_prompt) const {
  jinja::Dict vars = impl_->specials;
  vars.set("messages", jinja::Value::from_json(messages));
  vars.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  vars.set("tools", jinja::Value::none());
  vars.set("documents", jinja::Value::none());
  return impl_->tmpl->render(vars);
}

const std::string& ChatTemplate::source() const { return impl_->tmpl->source(); }
const std::string& ChatTemplate::eos_token() const { return impl_->eos; }

ChatTemplate find_chat_template(const std::string& override_path, const std::string& model_dir,
                                const std::string& tokenizer_json) {
  std::vector<fs::path> folders;
  if (!model_dir.empty()) folders.emplace_back(model_dir);
  if (!tokenizer_json.empty()) {
    std::error_code ec;
    folders.push_back(fs::is_directory(tokenizer_json, ec) ? fs::path(tokenizer_json) : fs::path(tokenizer_json).parent_path());
  }
  if (!override_path.empty()) {
    ChatTemplate t = ChatTemplate::from_file(override_path);
    if (fs::path(override_path).extension() == ".json") return t;
    for (const fs::path& folder : folders)  // a bare .jinja takes the model's special tokens
      if (is_file(folder / "tokenizer_config.json")) {
        const Json config = read_config((folder / "tokenizer_config.json").string());
        return ChatTemplate::from_text(read_text(override_path), override_path, special_token(config, "bos_token"),
                                       special_token(config, "eos_token"));
      }
    return t;
  }
  std::string looked;
  for (const fs::path& folder : folders) {
    const fs::path jinja_file = folder / "chat_template.jinja", config = folder / "tokenizer_config.json";
    if (is_file(jinja_file)) {
      const Json specials = is_file(config) ? read_config(config.string()) : Json::object();
      return ChatTemplate::from_text(read_text(jinja_file.string()), jinja_file.string(),
                                     special_token(specials, "bos_token"), special_token(specials, "eos_token"));
    }
    if (has_template(config)) return from_config(read_config(config.string()), config.string());
    looked += concat(looked.empty() ? "" : ", ", folder.string());
  }
  throw Error(concat("data.format = chat needs a chat template, and none was found (",
                     looked.empty() ? std::string("no model.dir or tokenizer folder to look in")
                                    : "no chat_template.jinja, nor chat_template in tokenizer_config.json, in " + looked,
                     "): give data.chat_template = PATH (a .jinja file or a tokenizer_config.json)"));
}

}  // namespace shardlm
