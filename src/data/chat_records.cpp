// Chat records into conversations: OpenAI messages, ShareGPT conversations and alpaca
// instruction/input/output, from JSON lines or a JSON array, each record checked field by field.
#include "../core/input_file.hpp"
#include "data_file.hpp"
#include "chat.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace {

using Json = nlohmann::ordered_json;

// Key order matters to a template that walks a message's keys, so records keep it.
Json parse_ordered_record(const std::string& text, const std::string& where) {
  Json record;
  try {
    record = parse_ordered_json_bounded(text, where);
  } catch (const Json::exception& e) {
    throw Error(concat(where, ": not valid JSON: ", clip_for_message(e.what())));
  }
  SHARDLM_CHECK(record.is_object(), where, ": expected a JSON object");
  return record;
}

const std::string& string_field(const Json& object, const std::string& key, const std::string& where,
                                const std::string& path) {
  SHARDLM_CHECK(object.contains(key), where, ": ", path, " has no '", key, "'");
  SHARDLM_CHECK(object[key].is_string(), where, ": ", path, ".", key, " must be a string, not ",
                clip_for_message(object[key].dump()));
  return object[key].get_ref<const std::string&>();
}

ChatFormat detect(const Json& record, const std::string& where) {
  if (record.contains("messages")) return ChatFormat::Messages;
  if (record.contains("conversations")) return ChatFormat::Sharegpt;
  if (record.contains("instruction")) return ChatFormat::Alpaca;
  throw Error(concat(where, ": a chat record needs 'messages' (OpenAI), 'conversations' (ShareGPT) or 'instruction' "
                            "(alpaca); this one has none"));
}

const Json& message_list(const Json& record, const char* key, const std::string& where) {
  SHARDLM_CHECK(record.contains(key), where, ": no '", key, "' (data.chat_format says this file holds them)");
  const Json& list = record[key];
  SHARDLM_CHECK(list.is_array() && !list.empty(), where, ": '", key, "' must be a non-empty list of messages");
  return list;
}

Json from_messages(const Json& record, const std::string& where) {
  const Json& list = message_list(record, "messages", where);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = concat("messages[", i, "]");
    SHARDLM_CHECK(list[i].is_object(), where, ": ", at, " must be an object with 'role' and 'content'");
    string_field(list[i], "role", where, at);
    string_field(list[i], "content", where, at);
  }
  return list;
}

Json from_sharegpt(const Json& record, const std::string& where) {
  const Json& list = message_list(record, "conversations", where);
  Json messages = Json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = concat("conversations[", i, "]");
    SHARDLM_CHECK(list[i].is_object(), where, ": ", at, " must be an object with 'from' and 'value'");
    const std::string& from = string_field(list[i], "from", where, at);
    const std::string role = from == "human" || from == "user" ? "user"
                             : from == "gpt" || from == "assistant" ? "assistant"
                             : from == "system" ? "system" : "";
    SHARDLM_CHECK(!role.empty(), where, ": ", at, ".from = '", from, "' is not system, human or gpt");
    messages.push_back({{"role", role}, {"content", string_field(list[i], "value", where, at)}});
  }
  return messages;
}

Json from_alpaca(const Json& record, const std::string& where) {
  std::string user = string_field(record, "instruction", where, "record");
  if (record.contains("input") && !record["input"].is_null()) {
    const std::string& input = string_field(record, "input", where, "record");
    if (!input.empty()) user += "\n\n" + input;
  }
  Json messages = Json::array();
  if (record.contains("system") && !record["system"].is_null())
    messages.push_back({{"role", "system"}, {"content", string_field(record, "system", where, "record")}});
  messages.push_back({{"role", "user"}, {"content", user}});
  messages.push_back({{"role", "assistant"}, {"content", string_field(record, "output", where, "record")}});
  return messages;
}

Conversation to_conversation(const Json& record, ChatFormat format, const std::string& where) {
  SHARDLM_CHECK(record.is_object(), where, ": expected a JSON object");
  const ChatFormat f = format == ChatFormat::Auto ? detect(record, where) : format;
  switch (f) {
    case ChatFormat::Messages: return {from_messages(record, where), where};
    case ChatFormat::Sharegpt: return {from_sharegpt(record, where), where};
    default: return {from_alpaca(record, where), where};
  }
}

bool starts_with_array(const std::string& text) {
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '[';
  }
  return false;
}

}  // namespace

std::vector<Conversation> read_conversations(const std::string& path, ChatFormat format) {
  std::vector<Conversation> out;
  const std::string text = read_data_file(path);
  if (starts_with_array(text)) {  // alpaca's JSON file: one array of records
    Json records;
    try {
      records = parse_ordered_json_bounded(text, path);
    } catch (const Json::exception& e) {
      throw Error(concat(path, ": not valid JSON: ", clip_for_message(e.what())));
    }
    for (size_t i = 0; i < records.size(); ++i)
      out.push_back(to_conversation(records[i], format, concat(path, ": record ", i + 1)));
  } else {
    for_each_record_line(path, [&](const std::string& line, const std::string& where) {
      out.push_back(to_conversation(parse_ordered_record(line, where), format, where));
    });
  }
  SHARDLM_CHECK(!out.empty(), path, ": no records in the file");
  return out;
}

}  // namespace shardlm
