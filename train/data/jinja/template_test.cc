#include "train/data/jinja/template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace loom::jinja {
namespace {

using Json = nlohmann::ordered_json;

Dict Variables(const Json& j) {
  Dict out;
  for (auto it = j.begin(); it != j.end(); ++it) out.emplace_back(it.key(), Value::FromJson(*it));
  return out;
}

absl::StatusOr<Rendered> Render(const std::string& source, const Dict& variables = {}) {
  absl::StatusOr<Template> t = Template::Parse(source, "t.jinja");
  if (!t.ok()) return t.status();
  return t->Render(variables);
}

std::string Error(const std::string& source, const Dict& variables = {}) {
  absl::StatusOr<Rendered> r = Render(source, variables);
  return r.ok() ? "rendered: " + r->text : std::string(r.status().message());
}

// Every case of tools/chat_template_reference/jinja_cases.py renders as
// transformers' own chat-template environment (Jinja2) rendered it.
TEST(TemplateTest, MatchesJinja2OnEveryCase) {
  std::ifstream in("train/data/jinja/testdata/cases.json");
  ASSERT_TRUE(in) << "testdata missing";
  Json cases = Json::parse(in)["cases"];
  ASSERT_GE(cases.size(), 30u);
  for (const Json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    absl::StatusOr<Rendered> r = Render(c["template"].get<std::string>(), Variables(c["variables"]));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["expected"].get<std::string>());
    std::vector<std::pair<size_t, size_t>> spans;
    for (const Json& s : c["generation_spans"]) spans.emplace_back(s[0], s[1]);
    EXPECT_EQ(r->generation_spans, spans);
  }
}

TEST(TemplateTest, UnsupportedConstructsNameThemselvesAndTheLine) {
  EXPECT_EQ(Error("a\n{% macro m() %}x{% endmacro %}"), "t.jinja:2: unsupported construct {% macro %}");
  EXPECT_EQ(Error("{% include 'x' %}"), "t.jinja:1: unsupported construct {% include %}");
  EXPECT_EQ(Error("\n\n{% raw %}{{ x }}{% endraw %}"), "t.jinja:3: unsupported construct {% raw %}");
  EXPECT_EQ(Error("{% set x %}y{% endset %}"),
            "t.jinja:1: unsupported construct {% set %}...{% endset %} (block set)");
  EXPECT_EQ(Error("{% set a, b = 1, 2 %}"),
            "t.jinja:1: unsupported construct {% set a, b = ... %} (tuple assignment)");
  EXPECT_EQ(Error("{% for x in y recursive %}{% endfor %}"),
            "t.jinja:1: unsupported construct {% for ... recursive %}");
  EXPECT_EQ(Error("{{ 'x' | wordwrap }}"), "t.jinja:1: unsupported filter 'wordwrap'");
  EXPECT_EQ(Error("{{ 1 is callable }}"), "t.jinja:1: unsupported test 'callable'");
  EXPECT_EQ(Error("{{ 'x'.zfill(3) }}"), "t.jinja:1: unsupported method string.zfill()");
  EXPECT_EQ(Error("{{ cycler(1) }}"), "t.jinja:1: unsupported function 'cycler'");
  EXPECT_EQ(Error("{{ strftime_now('%Y') }}"),
            "t.jinja:1: strftime_now() is not supported: the rendered text would depend on the clock");
  EXPECT_EQ(Error("{{ [1] }}"),
            "t.jinja:1: printing a list (Python's repr) is not supported; use |tojson");
  EXPECT_EQ(Error("{{ 'É' | upper }}"), "t.jinja:1: filter 'upper' of non-ASCII text is not supported");
  EXPECT_EQ(Error("{{ '%s' % 1 }}"),
            "t.jinja:1: operator '%' between a string and a integer is not supported");
}

TEST(TemplateTest, UndefinedVariablesAreErrorsNamingThem) {
  EXPECT_EQ(Error("ok\n{{ mesages }}"), "t.jinja:2: undefined variable 'mesages'");
  EXPECT_EQ(Error("{% if system_prompt %}x{% endif %}"), "t.jinja:1: undefined variable 'system_prompt'");
  EXPECT_EQ(Error("{% for m in msgs %}{% endfor %}"), "t.jinja:1: undefined variable 'msgs'");
  Dict m = {{"m", Value::MakeDict({{"role", Value::String("user")}})}};
  // A missing key is Jinja's undefined: false in a test, an error when used.
  EXPECT_EQ(Error("{% if m.content %}x{% endif %}.", m), "rendered: .");
  EXPECT_EQ(Error("{{ m.content }}", m), "t.jinja:1: 'm.content' is undefined (printed)");
  EXPECT_EQ(Error("{{ m['content'] + 'x' }}", m), "t.jinja:1: 'm['content']' is undefined (operator +)");
  EXPECT_EQ(Error("{{ m.content.strip() }}", m),
            "t.jinja:1: 'm.content' is undefined (calling .strip())");
  EXPECT_EQ(Error("{{ m.content | trim }}", m),
            "t.jinja:1: 'm.content' is undefined (filter 'trim')");
  EXPECT_EQ(Error("{{ x.y }}"), "t.jinja:1: undefined variable 'x'");
  EXPECT_EQ(Error("{{ x.y is defined }}"), "rendered: False");
}

TEST(TemplateTest, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(Error("{% if x %}\nno end"), "t.jinja:2: the template ends inside a block: expected {% endif %}");
  EXPECT_EQ(Error("{% endif %}"), "t.jinja:1: {% endif %} without an open block");
  EXPECT_EQ(Error("a\n{{ x "), "t.jinja:2: unterminated {{ ... }}");
  EXPECT_EQ(Error("{{ 'abc }}"), "t.jinja:1: unterminated string literal");
  EXPECT_EQ(Error("{# x"), "t.jinja:1: unterminated comment {# ... #}");
  EXPECT_EQ(Error("{{ a ; b }}"), "t.jinja:1: unexpected character ';' in a tag");
  EXPECT_EQ(Error("{{ a b }}"), "t.jinja:1: expected '}}', found 'b'");
  EXPECT_EQ(Error("{% break %}"), "t.jinja:1: {% break %} outside a loop");
}

TEST(TemplateTest, RaiseExceptionAndNamespaceRules) {
  EXPECT_EQ(Error("\n{{ raise_exception('roles must alternate') }}"),
            "t.jinja:2: the template raised an exception: roles must alternate");
  EXPECT_EQ(Error("{% set d = {} %}{% set d.x = 1 %}"),
            "t.jinja:1: {% set d.x %}: only a namespace() takes attribute assignment, 'd' is a dict");
}

TEST(TemplateTest, GenerationSpansAreByteRanges) {
  absl::StatusOr<Rendered> r =
      Render("é{% generation %}ü{% endgeneration %}-{% generation %}{% endgeneration %}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "éü-");
  using Spans = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(r->generation_spans, (Spans{{2, 4}, {5, 5}}));
}

}  // namespace
}  // namespace loom::jinja
