// Post-processors of HfTokenizer: what add_special_tokens puts around the ids of one sequence
// (TemplateProcessing, BertProcessing, RobertaProcessing; ByteLevel adds nothing; Sequence nests).
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

// The id of a ["token", id] pair of Bert/RobertaProcessing.
int32_t token_pair_id(const JsonContext& ctx, const json& object, const std::string& path,
                      const char* key) {
  const json& pair = require_member(ctx, object, path, key);
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
    ctx.fail(child_path(path, key), "expected [\"token\", id]");
  }
  return pair[1].get<int32_t>();
}

PostProcessor parse_template(const JsonContext& ctx, const json& value, const std::string& path) {
  const std::string single_path = child_path(path, "single");
  const json& single = require_member(ctx, value, path, "single");
  if (!single.is_array()) ctx.fail(single_path, "expected an array of SpecialToken and Sequence");
  const json empty = json::object();
  const json& specials = value.contains("special_tokens") && value["special_tokens"].is_object()
                             ? value["special_tokens"]
                             : empty;
  PostProcessor out;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = index_path(single_path, i);
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_sequence) ctx.fail(item_path, "a single-sequence template takes one Sequence");
      seen_sequence = true;
    } else if (item.is_object() && item.contains("SpecialToken")) {
      const std::string name =
          require_string(ctx, item["SpecialToken"], child_path(item_path, "SpecialToken"), "id");
      if (!specials.contains(name)) {
        ctx.fail(item_path, concat("special token '", name, "' is not in ",
                                   child_path(path, "special_tokens")));
      }
      const std::string ids_path = child_path(child_path(path, "special_tokens"), name);
      const json& ids = require_member(ctx, specials[name], ids_path, "ids");
      if (!ids.is_array()) ctx.fail(child_path(ids_path, "ids"), "expected an array of ids");
      std::vector<int32_t>& side = seen_sequence ? out.suffix : out.prefix;
      for (const json& id : ids) {
        if (!id.is_number_integer()) ctx.fail(child_path(ids_path, "ids"), "expected integer ids");
        side.push_back(id.get<int32_t>());
      }
    } else {
      ctx.fail(item_path, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_sequence) ctx.fail(single_path, "the template has no Sequence");
  return out;
}

}  // namespace

PostProcessor parse_post_processor(const JsonContext& ctx, const json& value,
                                   const std::string& path) {
  if (value.is_null()) return {};
  const std::string type = component_type(ctx, value, path);
  if (type == "ByteLevel") return {};
  if (type == "TemplateProcessing") return parse_template(ctx, value, path);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    PostProcessor out;
    out.prefix.push_back(token_pair_id(ctx, value, path, "cls"));
    out.suffix.push_back(token_pair_id(ctx, value, path, "sep"));
    return out;
  }
  if (type == "Sequence") {
    const std::string list_path = child_path(path, "processors");
    const json& list = require_member(ctx, value, path, "processors");
    if (!list.is_array()) ctx.fail(list_path, "expected an array");
    // Each processor wraps what the ones before it produced.
    PostProcessor out;
    for (size_t i = 0; i < list.size(); ++i) {
      const PostProcessor step = parse_post_processor(ctx, list[i], index_path(list_path, i));
      out.prefix.insert(out.prefix.begin(), step.prefix.begin(), step.prefix.end());
      out.suffix.insert(out.suffix.end(), step.suffix.begin(), step.suffix.end());
    }
    return out;
  }
  fail_unsupported(ctx, child_path(path, "type"), type,
                   "TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence");
}

}  // namespace shardlm::hf
