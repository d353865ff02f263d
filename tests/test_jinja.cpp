#define BOOST_TEST_MODULE test_jinja
#include <boost/test/unit_test.hpp>

// Tests of the Jinja interpreter (src/data/jinja*.cpp) against the renderings of
// tests/fixtures/chat: expected.json (made by transformers with render_fixtures.py) and
// expected_jinja2.json (made by jinja2 configured as transformers configures it), byte for byte:
// Jinja snippets, and six public chat templates on every prefix of each conversation with and
// without the generation prompt, refusals included.
#include <filesystem>
#include <string>

#include "jinja.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace shardlm::jinja;
using Json = nlohmann::ordered_json;

namespace {

const std::string kChat = SHARDLM_SOURCE_DIR "/tests/fixtures/chat/";

Json read_json(const std::string& path) { return Json::parse(read_text_file(path)); }

// The expectation files present: transformers' own when render_fixtures.py has been run with it.
std::vector<std::string> expectation_files() {
  std::vector<std::string> files;
  for (const char* name : {"expected.json", "expected_jinja2.json"})
    if (std::filesystem::exists(kChat + name)) files.push_back(kChat + name);
  return files;
}

Dict dict_of(const Json& object) { return Value::from_json(object).entries(); }

// Renders and compares with one recorded outcome ({"text"} or {"error", "error_type"}).
void check_outcome(const Template& t, const Dict& vars, const Json& expected, const std::string& what) {
  std::string text;
  try {
    text = t.render(vars);
  } catch (const TemplateError& e) {
    BOOST_TEST_INFO(what << ": " << e.what());
    BOOST_REQUIRE(expected.contains("error"));
    if (expected["error_type"] == "TemplateError") {  // raise_exception: the same words
      BOOST_TEST(e.raised());
      BOOST_TEST(e.message() == expected["error"].get<std::string>());
    }
    return;
  }
  BOOST_TEST_INFO(what);
  BOOST_REQUIRE_MESSAGE(expected.contains("text"), what + ": rendered, expected the error " + expected.dump());
  BOOST_TEST(text == expected["text"].get<std::string>());
}

}  // namespace

BOOST_AUTO_TEST_CASE(fixtures_exist) { BOOST_TEST(!expectation_files().empty()); }

BOOST_AUTO_TEST_CASE(snippets_render_as_jinja2) {
  const Json cases = read_json(kChat + "cases.json");
  for (const std::string& file : expectation_files()) {
    const Json expected = read_json(file);
    for (const Json& snippet : cases["snippets"]) {
      const std::string name = snippet["name"];
      const std::string what = file + " snippet " + name;
      const Json& outcome = expected["snippets"][name];
      std::unique_ptr<Template> t;
      try {
        t = std::make_unique<Template>(snippet["template"].get<std::string>(), "snippet " + name);
      } catch (const TemplateError& e) {
        BOOST_TEST_INFO(what << ": " << e.what());
        BOOST_TEST(outcome.contains("error"));
        continue;
      }
      check_outcome(*t, dict_of(snippet["context"]), outcome, what);
    }
  }
}

BOOST_AUTO_TEST_CASE(chat_templates_render_as_recorded) {
  const Json cases = read_json(kChat + "cases.json");
  const Json tokens = read_json(kChat + "templates/tokens.json");
  for (const std::string& file : expectation_files()) {
    const Json expected = read_json(file);
    for (const auto& [name, special] : tokens.items()) {
      const Template t(read_text_file(kChat + "templates/" + name + ".jinja"), name + ".jinja");
      for (const Json& conversation : cases["conversations"]) {
        const std::string case_name = conversation["name"];
        const Json& prefixes = expected["templates"][name][case_name];
        const Json& messages = conversation["messages"];
        for (size_t k = 1; k <= messages.size(); ++k) {
          for (bool generation : {false, true}) {
            Dict vars;
            vars.set("messages", Value::from_json(Json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(k))));
            vars.set("add_generation_prompt", Value::boolean(generation));
            vars.set("tools", Value::none());
            vars.set("documents", Value::none());
            for (const auto& [key, token] : special.items())
              if (!token.is_null()) vars.set(key, Value::string(token.get<std::string>()));
            check_outcome(t, vars, prefixes[k - 1][generation ? "gen" : "plain"],
                          concat(file, " ", name, " ", case_name, " prefix ", k, generation ? " +gen" : ""));
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(errors_name_the_template_and_line) {
  auto message_of = [](const std::string& text) {
    try {
      Template t(text, "t.jinja");
      t.render({});
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BOOST_TEST(message_of("a\n{{ x | frobnicate }}") == "t.jinja:2: no filter named 'frobnicate'");
  BOOST_TEST(message_of("a\n\n{% if x %}open").find("t.jinja:3: the 'if' opened here is not closed") == 0);
  BOOST_TEST(message_of("{{ 1 + }}").find("t.jinja:1: expected an expression") == 0);
  BOOST_TEST(message_of("x\n{% frob %}").find("t.jinja:2: unknown or unsupported tag 'frob'") == 0);
  BOOST_TEST(message_of("x\n{{ 'a' ") == "t.jinja:2: a tag is not closed");
  BOOST_TEST(message_of("\n\n{{ raise_exception('no system role') }}") ==
             "t.jinja:3: the template refuses the input: no system role");
  BOOST_TEST(message_of("{{ missing.attr }}") == "t.jinja:1: 'missing' is undefined");
}

// What jinja2 3.1 renders (transformers' sandboxed environment): dict literals whose closing braces meet the
// tag's, and 'in' over an undefined name (False: jinja2's Undefined iterates as empty).
BOOST_AUTO_TEST_CASE(nested_braces_and_in_undefined_render_as_jinja2) {
  auto render = [](const std::string& text) { return Template(text, "t.jinja").render({}); };
  BOOST_TEST(render("{{ {'a': {'b': 1}} }}") == "{'a': {'b': 1}}");
  BOOST_TEST(render("{{ {'a':1}}}") == "{'a': 1}");
  BOOST_TEST(render("{{ [1, {'k': [2]}] | length }}") == "2");
  BOOST_TEST(render("{{ 'x' in missing }}|{{ 'x' not in missing }}") == "False|True");
  BOOST_TEST(render("{% if 'tools' in missing %}y{% else %}n{% endif %}") == "n");
  // split's remainder keeps its trailing spaces; round is Python's (2.675 is 2.67499999... in binary).
  BOOST_TEST(render("{{ 'a b  c '.split(none, 1) }}") == "['a', 'b  c ']");
  BOOST_TEST(render("{{ 2.675 | round(2) }}|{{ 0.125 | round(2) }}|{{ 2.5 | round }}|{{ 1234.5 | round(-2) }}") ==
             "2.67|0.12|2.0|1200.0");
}

// jinja2 refuses an unknown filter or test when it compiles the template, except inside an `if` or a
// conditional expression, where it is an error only when reached; a for loop's body or `if`, a macro
// and a block set inside an `if` are compiled strictly again (the snippets unknown_* check what
// renders; here, what is refused before anything renders).
BOOST_AUTO_TEST_CASE(unknown_filters_are_refused_when_read_or_when_reached_as_jinja2_does) {
  auto read = [](const std::string& text) {
    try {
      Template t(text, "t.jinja");
      return std::string("read");
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
  };
  for (const std::string soft : {"{% if tools %}{{ tools | tojson | indent(4) }}{% endif %}",
                                 "{% if x | frob %}{% endif %}", "{% if a %}{% elif b %}{{ x is frobbed }}{% endif %}",
                                 "{% if a %}{% else %}{{ x | frob }}{% endif %}", "{{ (x | frob) if a else (y is frobbed) }}",
                                 "{% for i in [] %}{% if i %}{{ i | frob }}{% endif %}{% endfor %}",
                                 "{% macro m() %}{{ 1 if a else x | frob }}{% endmacro %}",
                                 "{% if a %}{% set y = x | frob %}{% for i in x | frob %}{% endfor %}{% endif %}"})
    BOOST_TEST(read(soft) == "read", soft);
  for (const std::string strict : {"{{ x | frob }}", "{% for i in [] %}{{ i | frob }}{% endfor %}",
                                   "{% if a %}{% for i in [] %}{{ i | frob }}{% endfor %}{% endif %}",
                                   "{% if a %}{% for i in [] if i | frob %}{% endfor %}{% endif %}",
                                   "{% if a %}{% macro m() %}{{ x | frob }}{% endmacro %}{% endif %}",
                                   "{% if a %}{% macro m(p=x | frob) %}{% endmacro %}{% endif %}",
                                   "{% if a %}{% set y %}{{ x | frob }}{% endset %}{% endif %}",
                                   "{% if a %}{% generation %}{{ x | frob }}{% endgeneration %}{% endif %}",
                                   "{% set y = x | frob %}", "{{ a and x | frob }}"})
    BOOST_TEST(read(strict) == "t.jinja:1: no filter named 'frob'", strict);
  BOOST_TEST(read("{% macro m() %}{{ 1 is frobbed }}{% endmacro %}") == "t.jinja:1: no test named 'frobbed'");
  // Reached, the branch is refused at its line.
  Dict vars;
  vars.set("tools", Value::list({Value::string("t")}));
  BOOST_TEST(Template("{% if tools %}{{ tools | tojson | indent(4) }}{% endif %}ok", "t.jinja").render({}) == "ok");
  try {
    Template("\n{% if tools %}\n{{ tools | tojson | indent(4) }}{% endif %}", "t.jinja").render(vars);
    BOOST_ERROR("rendered");
  } catch (const TemplateError& e) {
    BOOST_TEST(std::string(e.what()) == "t.jinja:3: no filter named 'indent'");
  }
}

// The text `text` renders to with no variables, or the TemplateError's message where it fails.
static std::string rendered_or_message(const std::string& text) {
  try {
    return Template(text, "t.jinja").render({});
  } catch (const TemplateError& e) {
    return std::string(e.what());
  }
}

// Arguments a filter or test does not take are refused with its name and what it takes (jinja2: a
// TypeError), never ignored; str.format's named fields, and its format specs refused naming the field.
BOOST_AUTO_TEST_CASE(arguments_filters_do_not_take_are_refused) {
  BOOST_TEST(rendered_or_message("{{ 1 | tojson(indnt=2) }}") ==
             "t.jinja:1: filter 'tojson' got an unexpected keyword argument 'indnt' (it takes ensure_ascii, indent, "
             "separators, sort_keys)");
  BOOST_TEST(rendered_or_message("{{ 'a' | upper(1) }}") == "t.jinja:1: filter 'upper' takes 0 arguments, got 1 (it takes none)");
  BOOST_TEST(rendered_or_message("{{ 'a' | replace('a') }}") == "t.jinja:1: filter 'replace' is missing its argument 'new'");
  BOOST_TEST(rendered_or_message("{{ [1] | join(',', d=',') }}") == "t.jinja:1: filter 'join' got multiple values for argument 'd'");
  BOOST_TEST(rendered_or_message("{{ 1 is eq(other=1) }}") == "t.jinja:1: test 'eq' takes no keyword arguments (got 'other')");
  BOOST_TEST(rendered_or_message("{{ 1 | tojson(separators=',') }}").find("tojson: separators must be two strings") !=
             std::string::npos);
  BOOST_TEST(rendered_or_message("{{ '{name}, {0}'.format('x', name='n') }}") == "n, x");
  BOOST_TEST(rendered_or_message("{{ '{name:>5}'.format(name='x') }}") ==
             "t.jinja:1: format: the field '{name:>5}' has the format spec '>5', which shardlm's templates do not support "
             "(only {}, {0}, {name}, .attr, [key], !s, !r)");
  BOOST_TEST(rendered_or_message("{{ '{nme}'.format(name='x') }}") == "t.jinja:1: format: the field '{nme}' names no keyword argument");
}

// Python's integers have no bounds and shardlm's 64: past them it refuses rather than wrap.
BOOST_AUTO_TEST_CASE(integers_past_64_bits_are_refused) {
  BOOST_TEST(rendered_or_message("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 1 ** 4000000000000 }}") == "4611686018427387904 -9223372036854775808 1");
  BOOST_TEST(rendered_or_message("{{ 2 ** 64 }}") == "t.jinja:1: 2 ** 64 does not fit in 64 bits (shardlm's integers are 64-bit)");
  BOOST_TEST(rendered_or_message("{{ 3 ** 100000000000 }}").find("does not fit in 64 bits") != std::string::npos);
  BOOST_TEST(rendered_or_message("{{ 9223372036854775807 + 1 }}").find("does not fit in 64 bits") != std::string::npos);
  BOOST_TEST(rendered_or_message("{{ 4294967296 * 4294967296 }}").find("does not fit in 64 bits") != std::string::npos);
  BOOST_TEST(rendered_or_message("{{ '9223372036854775807' | int }} {{ '-9223372036854775808' | int }}") ==
             "9223372036854775807 -9223372036854775808");
  BOOST_TEST(rendered_or_message("{{ '9223372036854775808' | int }}").find("does not fit in 64 bits") != std::string::npos);
  BOOST_TEST(rendered_or_message("{{ 1e300 | int }}").find("does not fit in 64 bits") != std::string::npos);
  BOOST_TEST(rendered_or_message("{{ 99999999999999999999 }}") ==
             "t.jinja:1: the integer 99999999999999999999 does not fit in 64 bits (shardlm's integers are 64-bit)");
}

BOOST_AUTO_TEST_CASE(python_float_repr) {
  BOOST_TEST(python_float(0.1 + 0.2) == "0.30000000000000004");
  BOOST_TEST(python_float(1e16) == "1e+16");
  BOOST_TEST(python_float(123456789012345.0) == "123456789012345.0");
  BOOST_TEST(python_float(0.0001) == "0.0001");
  BOOST_TEST(python_float(0.00001) == "1e-05");
  BOOST_TEST(python_float(-2.5) == "-2.5");
}
