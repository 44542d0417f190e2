// Unit tests of the chat-template engine (src/chat): each feature, each limit, each error.
// Expected outputs are Jinja2's (what transformers renders with); where @huggingface/jinja
// differs the test says so. The real templates are cross-checked byte for byte against
// @huggingface/jinja in chat_template_vs_hf_js (compare.mjs).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "chat/fallback.h"
#include "chat/jinja.h"

namespace hybridlm::chat {
namespace {

using nlohmann::ordered_json;

std::string R(const std::string& tmpl, const ordered_json& ctx = ordered_json::object(), const Limits& lim = {}) {
  return Template::parse(tmpl, lim).render(ctx);
}

// The message of the Error that parsing or rendering throws ("" when none is thrown).
std::string E(const std::string& tmpl, const ordered_json& ctx = ordered_json::object(), const Limits& lim = {}) {
  try {
    Template::parse(tmpl, lim).render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(tmpl, ctx, needle)                                                  \
  do {                                                                                   \
    const std::string msg_ = E(tmpl, ctx);                                               \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "error: '" << msg_ << "'";       \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << "not one line: " << msg_;          \
  } while (0)

std::string read_data(const std::string& rel) {
  const char* env = std::getenv("HYBRIDLM_TEST_DATA");
  const std::filesystem::path p = std::filesystem::path(env ? env : "tests/data") / rel;
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << "missing test data " << p;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- syntax and whitespace

TEST(JinjaSyntax, TextOutputComment) {
  EXPECT_EQ(R("plain"), "plain");
  EXPECT_EQ(R("a{{ 'b' }}c{# note #}d"), "abcd");
  EXPECT_EQ(R("{{ x }}", {{"x", "val"}}), "val");
  EXPECT_EQ(R("{{ '}}' }}"), "}}");  // end markers inside strings are text
  EXPECT_EQ(R("{{ '{{\"a\"}}' }}"), "{{\"a\"}}");
  EXPECT_EQ(R(""), "");
  EXPECT_EQ(R("{##}x"), "x");
}

TEST(JinjaSyntax, StringEscapes) {
  EXPECT_EQ(R(R"({{ 'a\nb\tc\\d\'e' }})"), "a\nb\tc\\d'e");
  EXPECT_EQ(R(R"({{ "q\"q" }})"), "q\"q");
  EXPECT_EQ(R(R"({{ '\u00e9\x41' }})"), "\xc3\xa9" "A");
  EXPECT_EQ(R(R"({{ '\q' }})"), "\\q");  // unknown escape kept, as Python does
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");   // adjacent literals concatenate
}

TEST(JinjaWhitespace, TrailingNewlineAndCrlf) {
  EXPECT_EQ(R("x\n"), "x");  // keep_trailing_newline=False drops one
  EXPECT_EQ(R("x\n\n"), "x\n");
  EXPECT_EQ(R("a\r\nb"), "a\nb");
}

TEST(JinjaWhitespace, MinusMarkers) {
  EXPECT_EQ(R("a  \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(R("a \n{%- if true -%}\n  b  \n{%- endif -%}\n c"), "abc");
  EXPECT_EQ(R("a {#- c -#} b"), "ab");
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
  // trim_blocks: the newline after %} goes; lstrip_blocks: the indent before {% goes.
  EXPECT_EQ(R("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(R("  {% set a = 1 %}\nv={{ a }}"), "v=1");
  EXPECT_EQ(R("a  {% if true %}b{% endif %}"), "a  b");  // not at line start: kept
  EXPECT_EQ(R("{{ 'x' }}\ny"), "x\ny");                   // not after }}
  EXPECT_EQ(R("  {# c #}\nz"), "z");
  // `+` turns both off for one tag.
  EXPECT_EQ(R("  {%+ if true %}\nx{% endif %}"), "  x");
  EXPECT_EQ(R("{% if true +%}\nx{% endif %}"), "\nx");
  // Tabs count as indentation (LFM2 and Mistral templates indent with tabs).
  EXPECT_EQ(R("\t{% if true %}\n\tx\n\t{% endif %}\n"), "\tx\n");
}

// ---- statements

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(R(t, {{"n", 1}}), "one");
  EXPECT_EQ(R(t, {{"n", 2}}), "two");
  EXPECT_EQ(R(t, {{"n", 3}}), "many");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
              "{{ loop.length }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %};{% endfor %}",
              {{"xs", {"a", "b", "c"}}}),
            "10323F;21213;32103L;");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% endfor %}", {{"xs", {1, 2}}}),
            ">1<2 1>2< ");
}

TEST(JinjaStatements, ForElseFilterUnpackBreakContinue) {
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in xs if x > 1 %}{{ x }}/{{ loop.length }} {% endfor %}", {{"xs", {1, 2, 3}}}), "2/2 3/2 ");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "b=1;a=2;");
  EXPECT_EQ(R("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"x", 1}, {"y", 2}}}}), "xy");
  EXPECT_EQ(R("{% for c in 'hé' %}[{{ c }}]{% endfor %}"), "[h][\xc3\xa9]");
  EXPECT_EQ(R("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
              "{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(R("{% for x in undefined_thing %}x{% else %}none{% endfor %}"), "none");  // Jinja2: iterates as empty
  EXPECT_EQ(R("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
}

TEST(JinjaStatements, ScopingAndNamespace) {
  // A set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(R("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"), "4");
  // New attributes after construction, and `is defined` on them (Nemotron, Qwen3).
  EXPECT_EQ(R("{% set ns = namespace() %}{{ ns.a is defined }}{% set ns.a = 'v' %}{{ ns.a }}"), "Falsev");
  // `if` does not open a scope.
  EXPECT_EQ(R("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  // A top-level set shadows an input variable for the rest of the template.
  EXPECT_EQ(R("{% set messages = messages[1:] %}{{ messages | length }}", {{"messages", {1, 2, 3}}}), "2");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set t = 1, 2 %}{{ t | length }}"), "2");
}

TEST(JinjaStatements, BlockSet) {
  EXPECT_EQ(R("{% set s %}a{{ 1 + 1 }}b{% endset %}[{{ s }}]"), "[a2b]");
}

TEST(JinjaStatements, Macros) {
  EXPECT_EQ(R("{% macro m(a, b='B') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(b=3, a=4) }}"),
            "1-B 1-2 4-3");
  // A macro sees template-level names, not its caller's locals.
  EXPECT_EQ(R("{% set g = 'G' %}{% macro m() %}{{ g }}{{ l }}{% endmacro %}{% for l in [1] %}{{ m() }}{% endfor %}"),
            "G");
  // Macro output used as a value (Jamba's get_last_user_index(...)|int).
  EXPECT_EQ(R("{% macro n() %}{{ 40 }}{% endmacro %}{{ n() | int + 2 }}"), "42");
  // *args spreads a list (Jamba).
  EXPECT_EQ(R("{% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ m(*['x', 'y']) }}"), "xy");
  // Recursion is bounded by the render depth.
  EXPECT_ERROR("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", ordered_json::object(), "nests deeper than");
}

TEST(JinjaStatements, GenerationTagRendersBody) {
  EXPECT_EQ(R("a{% generation %}b{% endgeneration %}c"), "abc");
}

// ---- expressions

TEST(JinjaExpressions, Literals) {
  EXPECT_EQ(R("{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 1_000 }} {{ true }} {{ False }} {{ none }} {{ None }}"),
            "1 -2 1.5 1000.0 1000 True False None None");
  EXPECT_EQ(R("{{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }} {{ [] }}"),
            "[1, 'a', None, True] {'k': 'v', 'n': [1]} [1, 2] []");
  EXPECT_EQ(R("{{ [\"it's\"] }}"), "[\"it's\"]");  // Python repr picks double quotes
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}"),
            "7 9 3 -4 1 2 1024");
  EXPECT_EQ(R("{{ 7 / 2 }} {{ 4 / 2 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 2.5 * 2 }}"),
            "3.5 2.0 0.30000000000000004 1e+16 1e-05 5.0");
  EXPECT_EQ(R("{{ 'ab' + 'cd' }} {{ 'ab' ~ 1 ~ none }} {{ [1] + [2] }} {{ '-' * 3 }} {{ [0] * 2 }}"),
            "abcd ab1None [1, 2] --- [0, 0]");
  EXPECT_EQ(R("{{ true + 1 }}"), "2");
  EXPECT_ERROR("{{ 'a' + 1 }}", ordered_json::object(), "unsupported operand types for +: 'str' and 'int'");
  EXPECT_ERROR("{{ 1 // 0 }}", ordered_json::object(), "division or modulo by zero");
  EXPECT_ERROR("{{ 9223372036854775807 + 1 }}", ordered_json::object(), "integer overflow");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(R("{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True False True True True False");
  EXPECT_EQ(R("{{ {'a': [1]} == {'a': [1]} }} {{ [1, 2] != [1, 2] }}"), "True False");  // by value, as Python
  EXPECT_EQ(R("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ not 1 }}",
              {{"d", {{"k", 1}}}}),
            "True True True True False");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }}|{{ none or [] }}"), "x y |[]");
  EXPECT_EQ(R("{{ 'y' if c else 'n' }}{{ 'only' if c }}", {{"c", false}}), "n");
  EXPECT_ERROR("{{ 1 < 'a' }}", ordered_json::object(), "cannot compare int with str");
}

TEST(JinjaExpressions, AttributeSubscriptSlice) {
  const ordered_json ctx = {{"m", {{"role", "user"}, {"list", {1, 2, 3, 4, 5}}}}, {"s", "héllo"}};
  EXPECT_EQ(R("{{ m.role }} {{ m['role'] }} {{ m.list[0] }} {{ m.list[-1] }} {{ m.list.1 }}", ctx), "user user 1 5 2");
  EXPECT_EQ(R("{{ m.list[1:3] }} {{ m.list[::-1] }} {{ m.list[:-2] }} {{ m.list[::2] }} {{ m.list[10:] }}", ctx),
            "[2, 3] [5, 4, 3, 2, 1] [1, 2, 3] [1, 3, 5] []");
  EXPECT_EQ(R("{{ s[1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s | length }}", ctx), "\xc3\xa9 \xc3\xa9l oll\xc3\xa9h 5");
  // Missing keys and indices are undefined (print nothing, falsy).
  EXPECT_EQ(R("[{{ m.nope }}][{{ m.list[9] }}]{{ m.nope is defined }}", ctx), "[][]False");
  EXPECT_ERROR("{{ m.list[::0] }}", ctx, "slice step cannot be zero");
}

TEST(JinjaExpressions, UndefinedSemantics) {
  // Jinja2's default Undefined: prints empty, falsy, iterates as empty, length 0 ...
  EXPECT_EQ(R("[{{ u }}]{{ u is defined }}{{ u is undefined }}{{ u | length }}{{ 'x' if u else 'y' }}{{ u ~ 'c' }}"),
            "[]FalseTrue0yc");
  EXPECT_EQ(R("{{ u == u }}{{ u is none }}"), "TrueFalse");
  // ... but an attribute, item or call of it is an error (hf-jinja would print nothing).
  EXPECT_ERROR("{{ u.v }}", ordered_json::object(), "'u' is undefined");
  EXPECT_ERROR("{{ m.content.strip() }}", (ordered_json{{"m", ordered_json::object()}}), "'m.content' is undefined");
  EXPECT_ERROR("{{ u[0] }}", ordered_json::object(), "'u' is undefined");
  EXPECT_ERROR("{{ u + 1 }}", ordered_json::object(), "'u' is undefined");
  // None has no attributes: undefined, not an error (Jinja2).
  EXPECT_EQ(R("[{{ n.x }}]", {{"n", nullptr}}), "[]");
}

// ---- tests (`is`)

TEST(JinjaTests, All) {
  const ordered_json ctx = {{"s", "x"}, {"n", nullptr}, {"d", {{"a", 1}}}, {"l", {1}}, {"i", 3}, {"f", 1.5}, {"b", true}};
  EXPECT_EQ(R("{{ s is string }}{{ i is string }}{{ n is none }}{{ s is not none }}{{ d is mapping }}{{ l is mapping }}",
              ctx),
            "TrueFalseTrueTrueTrueFalse");
  EXPECT_EQ(R("{{ i is number }}{{ f is number }}{{ s is number }}{{ i is integer }}{{ f is float }}{{ b is boolean }}",
              ctx),
            "TrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ l is iterable }}{{ s is iterable }}{{ d is iterable }}{{ i is iterable }}{{ l is sequence }}", ctx),
            "TrueTrueTrueFalseTrue");
  EXPECT_EQ(R("{{ b is true }}{{ b is false }}{{ i is odd }}{{ i is even }}{{ i is divisibleby 3 }}{{ i is divisibleby(2) }}",
              ctx),
            "TrueFalseTrueFalseTrueFalse");
  EXPECT_EQ(R("{{ s is equalto 'x' }}{{ i is eq 3 }}{{ i is ne 3 }}{{ i is gt 2 }}{{ 1 is in [1] }}{{ s is lower }}", ctx),
            "TrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ s if s is defined else 'no' }}", ctx), "x");  // a test followed by `else`
}

// ---- filters

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(R("[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}]"), "[a b][a]");
  EXPECT_EQ(R("{{ 'aB' | upper }} {{ 'aB' | lower }} {{ 'hello wORLD-x(y' | title }} {{ 'hELLO' | capitalize }}"),
            "AB ab Hello World-X(Y Hello");
  EXPECT_EQ(R("{{ 'banana' | replace('a', 'o') }} {{ 'banana' | replace('a', 'o', 2) }} {{ 'ab' | replace('', '-') }}"),
            "bonono bonona -a-b-");
  EXPECT_EQ(R("{{ 12 | string }}{{ 'x' | string | length }} {{ '<a href=\"x\">&' | e }} {{ 'x' | safe }}"),
            "121 &lt;a href=&#34;x&#34;&gt;&amp; x");
  EXPECT_EQ(R("{{ none | trim }}"), "None");  // Jinja2 stringifies None (hf-jinja prints nothing)
}

TEST(JinjaFilters, Default) {
  EXPECT_EQ(R("{{ u | default('d') }} {{ '' | default('d') }}|{{ '' | default('d', true) }} {{ u | d }}|"), "d |d |");
  EXPECT_EQ(R("{{ n | default('d') }}", {{"n", nullptr}}), "None");
}

TEST(JinjaFilters, Sequences) {
  const ordered_json ctx = {{"l", {3, 1, 2}}, {"s", "abc"}, {"d", {{"x", 1}, {"y", 2}}}};
  EXPECT_EQ(R("{{ l | length }} {{ s | length }} {{ d | length }} {{ l | count }}", ctx), "3 3 2 3");
  EXPECT_EQ(R("{{ l | first }} {{ l | last }} {{ s | first }} {{ [] | first is defined }}", ctx), "3 2 a False");
  EXPECT_EQ(R("{{ l | join(', ') }} {{ l | join }} {{ s | list }} {{ d | list }} {{ l | reverse | list }}", ctx),
            "3, 1, 2 312 ['a', 'b', 'c'] ['x', 'y'] [2, 1, 3]");
  EXPECT_EQ(R("{{ d | items | list }} {{ d.items() | list }} {{ [1, 1, 2] | unique | list }}", ctx),
            "[['x', 1], ['y', 2]] [['x', 1], ['y', 2]] [1, 2]");
  EXPECT_EQ(R("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '10' | float }}"),
            "42 4 0 7 3 10.0");
  EXPECT_EQ(R("{{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }}"), "3 2.57 3.0");
}

TEST(JinjaFilters, SelectRejectMap) {
  const ordered_json ctx = {{"ms",
                             {{{"role", "system"}, {"content", "s"}},
                              {{"role", "user"}, {"content", "u1"}},
                              {{"role", "assistant"}, {"content", "a"}, {"tool_calls", {1}}},
                              {{"role", "user"}, {"content", "u2"}}}}};
  EXPECT_EQ(R("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}", ctx), "u1,u2");
  EXPECT_EQ(R("{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}", ctx), "2");
  EXPECT_EQ(R("{{ ms | selectattr('tool_calls') | list | length }}", ctx), "1");
  // Jinja2 keeps the items lacking the key (hf-jinja keeps none).
  EXPECT_EQ(R("{{ ms | selectattr('tool_calls', 'undefined') | list | length }}", ctx), "3");
  EXPECT_EQ(R("{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | reject('equalto', 2) | list }}"),
            "[2, 4] [1, 3]");
  EXPECT_EQ(R("{{ ['a', 'b'] | map('upper') | join }} {{ ms | map(attribute='nope', default='-') | join }}", ctx),
            "AB ----");
  EXPECT_ERROR("{{ [1] | select('nosuchtest') | list }}", ordered_json::object(), "unknown test 'nosuchtest'");
}

TEST(JinjaFilters, ToJson) {
  const ordered_json ctx = ordered_json::parse(
      R"({"t": {"name": "f", "b": [1, 2.5, true, null], "u": "é\"\\\n\u0001</s>", "e": {}, "l": []}})");
  // json.dumps(ensure_ascii=False): ", " and ": " separators, key order kept, non-ASCII raw.
  EXPECT_EQ(R("{{ t | tojson }}", ctx),
            R"({"name": "f", "b": [1, 2.5, true, null], "u": "é\"\\\n\u0001</s>", "e": {}, "l": []})");
  EXPECT_EQ(R("{{ t.b | tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(R("{{ {'a': {'b': 1}} | tojson(indent=4) }}"), "{\n    \"a\": {\n        \"b\": 1\n    }\n}");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true, ensure_ascii=true) }}"), R"({"a": "\u00e9", "b": 1})");
  EXPECT_EQ(R("{{ {'a': {'b': [1]}} }}"), "{'a': {'b': [1]}}");  // `}}` inside open brackets is not the end
  EXPECT_EQ(R("{{ [1, 2] | tojson(separators=[',', ':']) }} {{ 1.0 | tojson }} {{ 'x' | tojson }}"), "[1,2] 1.0 \"x\"");
  EXPECT_EQ(R("{{ '\U0001F642' | tojson(ensure_ascii=true) }}"), R"("\ud83d\ude42")");
  EXPECT_ERROR("{{ u | tojson }}", ordered_json::object(), "not JSON serializable");
}

// ---- methods and globals

TEST(JinjaMethods, Str) {
  EXPECT_EQ(R("[{{ ' a '.strip() }}][{{ ' a '.lstrip() }}][{{ ' a '.rstrip() }}][{{ '\n\na\n'.strip('\n') }}]"),
            "[a][a ][ a][a]");
  EXPECT_EQ(R("{{ 'abcxn'.rstrip('nx') }}"), "abc");  // a set of characters, as Python
  EXPECT_EQ(R("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c']");
  EXPECT_EQ(R("{{ 'x</think>y'.split('</think>')[-1] }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }}"),
            "y True True");
  EXPECT_EQ(R("{{ 'aB'.upper() }} {{ 'aB'.lower() }} {{ \"they're bob\".title() }} {{ 'aaa'.replace('a', 'b', 2) }}"),
            "AB ab They'Re Bob bba");
  EXPECT_EQ(R("{{ ', '.join(['a', 'b']) }}"), "a, b");
  EXPECT_ERROR("{{ 'a'.nosuch() }}", ordered_json::object(), "'str' object has no method 'nosuch'");
}

TEST(JinjaMethods, Dict) {
  const ordered_json ctx = {{"d", {{"a", 1}, {"b", nullptr}}}};
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dd') }} {{ d.get('b', 'x') }}", ctx), "1 None dd None");
  EXPECT_EQ(R("{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", ctx),
            "['a', 'b'] [1, None] [['a', 1], ['b', None]]");
}

TEST(JinjaGlobals, RaiseException) {
  const std::string msg = E("line one\n{{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(msg, "chat template line 2: Roles must alternate");
}

TEST(JinjaGlobals, StrftimeNowRangeNamespaceDict) {
  RenderOptions opt;
  opt.now = 1721952000;  // 2024-07-26 00:00:00 UTC
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(Template::parse("{{ strftime_now('%d %b %Y') }}").render(ordered_json::object(), opt), "26 Jul 2024");
  EXPECT_ERROR("{{ strftime_now('%Q') }}", ordered_json::object(), "unsupported format directive");
  EXPECT_EQ(R("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }}"),
            "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  EXPECT_EQ(R("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {{ dict(x=1) }}"), "12 {'x': 1}");
  // A context variable may shadow a global.
  EXPECT_EQ(R("{{ range }}", {{"range", "mine"}}), "mine");
}

// ---- errors: one line, naming the problem and the line

TEST(JinjaErrors, Syntax) {
  EXPECT_ERROR("{{ 1 +  }}", ordered_json::object(), "chat template line 1: expected an expression, found '}}'");
  EXPECT_ERROR("a\nb\n{% if x %}", ordered_json::object(), "chat template line 3: missing {% endif %}");
  EXPECT_ERROR("{% for x in y %}{% endif %}", ordered_json::object(), "unexpected '{% endif %}'");
  EXPECT_ERROR("{% for x in y %}", ordered_json::object(), "missing {% endfor %}");
  EXPECT_ERROR("{% endfor %}", ordered_json::object(), "unexpected '{% endfor %}'");
  EXPECT_ERROR("{{ 'abc }}", ordered_json::object(), "unterminated string literal");
  EXPECT_ERROR("{{ x ", ordered_json::object(), "unclosed '{{'");
  EXPECT_ERROR("{# x ", ordered_json::object(), "unclosed comment");
  EXPECT_ERROR("\n\n{{ x | nosuchfilter }}", ordered_json::object(), "chat template line 3: unknown filter 'nosuchfilter'");
  EXPECT_ERROR("{{ x is nosuchtest }}", ordered_json::object(), "unknown test 'nosuchtest'");
  EXPECT_ERROR("{% frobnicate %}", ordered_json::object(), "unknown tag 'frobnicate'");
  EXPECT_ERROR("{{ x ? y }}", ordered_json::object(), "unexpected character '?'");
  EXPECT_ERROR("{% break %}", ordered_json::object(), "'break' outside a for loop");
  EXPECT_ERROR("{% for x in y recursive %}{% endfor %}", ordered_json::object(), "recursive for loops are not supported");
}

TEST(JinjaErrors, NoFileAccess) {
  EXPECT_ERROR("{% include 'x.txt' %}", ordered_json::object(), "'{% include %}' is not supported: chat templates get no file access");
  EXPECT_ERROR("{% import 'm' as m %}", ordered_json::object(), "no file access");
  EXPECT_ERROR("{% extends 'base' %}", ordered_json::object(), "no file access");
  EXPECT_ERROR("{% from 'm' import x %}", ordered_json::object(), "no file access");
  // No environment or attribute escape hatches: these are just undefined names / missing keys.
  EXPECT_EQ(R("[{{ env }}{{ os }}{{ self }}{{ config }}]"), "[]");
  EXPECT_ERROR("{{ ''.__class__ }}", ordered_json::object(), "");
  EXPECT_EQ(R("[{{ ''.__class__ }}]"), "[]");
}

TEST(JinjaErrors, RenderErrorsNameTheLine) {
  EXPECT_ERROR("a\n{{ 1 }}\n{{ x.y.z }}", ordered_json::object(), "chat template line 3: 'x' is undefined");
  EXPECT_ERROR("{% set n = 5 %}{% set n.a = 1 %}", ordered_json::object(), "'n' is not a namespace() object");
  EXPECT_ERROR("{{ f() }}", (ordered_json{{"f", 1}}), "is not callable");
  EXPECT_ERROR("{{ 5 | length }}", ordered_json::object(), "has no len()");
  EXPECT_ERROR("{% for x in 5 %}{% endfor %}", ordered_json::object(), "cannot loop over a value of type int");
  EXPECT_ERROR("{% set a, b = [1] %}", ordered_json::object(), "cannot unpack 1 values into 2 names");
  EXPECT_ERROR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", ordered_json::object(), "takes 1 arguments, got 2");
  EXPECT_ERROR("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", ordered_json::object(), "has no argument 'b'");
  EXPECT_ERROR("{% set ns = namespace() %}{% set ns.me = ns %}", ordered_json::object(),
               "a namespace attribute cannot hold a namespace");
  // A raise_exception message with a newline still gives one line.
  EXPECT_ERROR("{{ raise_exception('a\\nb') }}", ordered_json::object(), "a\\nb");
  EXPECT_ERROR("{{ [1] | select('x\\ny') | list }}", ordered_json::object(), "unknown test 'x\\ny'");
}

// ---- limits

TEST(JinjaLimits, TemplateSize) {
  Limits lim;
  lim.max_template_bytes = 10;
  EXPECT_NO_THROW(Template::parse("0123456789", lim));
  try {
    Template::parse("0123456789x", lim);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("template is 11 bytes, more than the limit of 10"), std::string::npos);
  }
}

TEST(JinjaLimits, ParseDepth) {
  std::string deep = "{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}";
  EXPECT_ERROR(deep, ordered_json::object(), "nesting deeper than 100 levels");
  std::string blocks;
  for (int i = 0; i < 150; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 150; ++i) blocks += "{% endif %}";
  EXPECT_ERROR(blocks, ordered_json::object(), "nesting deeper than 100 levels");
  EXPECT_ERROR("{{ " + std::string(300, '-') + "1 }}", ordered_json::object(), "nesting deeper than");
  EXPECT_ERROR("{{ " + [] {
    std::string s;
    for (int i = 0; i < 300; ++i) s += "not ";
    return s;
  }() + "1 }}", ordered_json::object(), "nesting deeper than");
  EXPECT_EQ(R("{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " }}"), "1");
}

TEST(JinjaLimits, LoopIterations) {
  // Loop iterations and the items range() makes count together: 10 + 10 * 9 of each is 200.
  Limits lim;
  lim.max_loop_iterations = 200;
  EXPECT_EQ(R("{% for i in range(10) %}{% for j in range(9) %}{% endfor %}{% endfor %}x", ordered_json::object(), lim),
            "x");
  try {
    R("{% for i in range(10) %}{% for j in range(10) %}{% endfor %}{% endfor %}", ordered_json::object(), lim);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iterations"), std::string::npos) << e.what();
  }
  EXPECT_ERROR("{{ range(100000000000) | length }}", ordered_json::object(), "loop iterations over the limit");
}

TEST(JinjaLimits, OutputAndValueSize) {
  Limits lim;
  lim.max_output_bytes = 1000;
  EXPECT_NO_THROW(R("{{ 'x' * 1000 }}", ordered_json::object(), lim));
  const auto err = [&](const std::string& t) {
    try {
      R(t, ordered_json::object(), lim);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("{{ 'x' * 1001 }}").find("more than the limit of 1000"), std::string::npos);
  EXPECT_NE(err("{% for i in range(20) %}{{ 'y' * 100 }}{% endfor %}").find("output over the limit of 1000 bytes"),
            std::string::npos);
  // Doubling a string in a loop stops at the limit, long before memory runs out.
  EXPECT_NE(err("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("more than the limit"),
            std::string::npos);
  EXPECT_NE(err("{{ 'ab' * 9223372036854775807 }}").find("more than the limit"), std::string::npos);
  EXPECT_NE(err("{{ ('x' * 600) | replace('x', 'yy') }}").find("more than the limit"), std::string::npos);
  EXPECT_NE(err("{{ range(100) | tojson(indent=900) }}").find("limit"), std::string::npos);
}

TEST(JinjaLimits, ValueNesting) {
  EXPECT_ERROR("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
               ordered_json::object(), "nested deeper than 512 levels");
}

// ---- real templates (the byte-for-byte check against @huggingface/jinja is compare.mjs)

TEST(JinjaRealTemplates, Llama3) {
  const Template t = Template::parse(read_data("chat_templates/llama3.jinja"));
  const ordered_json ctx = {{"messages", {{{"role", "system"}, {"content", " Be brief. "}}, {{"role", "user"}, {"content", "Hi"}}}},
                            {"bos_token", "<|begin_of_text|>"},
                            {"add_generation_prompt", true}};
  EXPECT_EQ(t.render(ctx),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(JinjaRealTemplates, Qwen3ThinkingAndTools) {
  const Template t = Template::parse(read_data("chat_templates/qwen3.jinja"));
  ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "2+2?"}}}}, {"add_generation_prompt", true},
                      {"enable_thinking", false}};
  EXPECT_EQ(t.render(ctx), "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  ctx["messages"].push_back({{"role", "assistant"}, {"content", "<think>\nadd\n</think>\n\n4"}});
  ctx["messages"].push_back({{"role", "user"}, {"content", "3+3?"}});
  ctx.erase("enable_thinking");
  // Reasoning of turns before the last user message is dropped.
  EXPECT_EQ(t.render(ctx),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  ctx["tools"] = ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  EXPECT_NE(t.render(ctx).find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}\n</tools>"),
            std::string::npos);
}

TEST(JinjaRealTemplates, MistralRaisesOnBadRoles) {
  const Template t = Template::parse(read_data("chat_templates/mistral-7b-instruct-v0.1.jinja"));
  const ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}},
                            {"bos_token", "<s>"},
                            {"eos_token", "</s>"}};
  try {
    t.render(ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "chat template line 1: Conversation roles must alternate user/assistant/user/assistant/...");
  }
}

// ---- fallback

TEST(ChatFallback, Format) {
  const nlohmann::json msgs = nlohmann::json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}, {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "content": "42"}
  ])");
  EXPECT_EQ(render_fallback(msgs),
            "System: Be brief.\nUser: Hi\nthere\nAssistant: \nTool call: {\"name\":\"f\",\"arguments\":\"{}\"}\n"
            "Tool: 42\nAssistant:");
  EXPECT_EQ(render_fallback(nlohmann::json::parse(R"([{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": " Hello there \n"}])"), false), "User: Hi\nAssistant: Hello there\n");
  EXPECT_EQ(render_fallback(nlohmann::json::array(), false), "");
  EXPECT_THROW(render_fallback(nlohmann::json::parse(R"([{"content": "x"}])")), Error);
  EXPECT_THROW(render_fallback(nlohmann::json::object()), Error);
}

}  // namespace
}  // namespace hybridlm::chat
