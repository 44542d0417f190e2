// Lexer and parser: template source to the tree of jinja_ast.h.
//
// Whitespace follows Jinja2 configured as transformers does (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False):
//  - one trailing "\n" of the source is dropped; "\r\n" and "\r" read as "\n";
//  - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`, `-#}` all after it;
//  - trim_blocks: the first newline after a `%}` or `#}` is dropped (not after `}}`);
//  - lstrip_blocks: spaces and tabs from the start of a line to a `{%` or `{#` are dropped;
//    `{%+` and `+%}` turn these two off for one tag.
// Expression grammar and precedence follow jinja2/parser.py (lowest first): `x if c else y`,
// or, and, not, comparisons (== != < <= > >= in, not in), + -, ~, * / // %, **, unary - +,
// then primary with postfix (.attr, [index], [a:b:c], (call)) and filters / tests (| f, is t).
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "chat/jinja_ast.h"

namespace hybridlm::chat {
namespace {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string s;  // Text, Name, String, Op
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

[[noreturn]] void fail(int line, const std::string& msg) {
  throw Error(one_line("chat template line " + std::to_string(line) + ": " + msg));
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      const int text_line = line_;
      std::string text = src_.substr(pos_, tag == std::string::npos ? std::string::npos : tag - pos_);
      count_lines(pos_, tag == std::string::npos ? src_.size() : tag);
      if (tag == std::string::npos) {
        push_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        size_t n = text.size();
        while (n > 0 && is_space(text[n - 1])) --n;
        text.resize(n);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only spaces and tabs between the line start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k)
            if (text[k] != ' ' && text[k] != '\t') blank = false;
          if (blank) text.resize(l_pos);
        }
      }
      push_text(std::move(text), text_line);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        line_starting = comment();
      } else {
        line_starting = tag_body(kind);
      }
    }
    out_.push_back({Tok::Eof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  void count_lines(size_t a, size_t b) {
    for (size_t k = a; k < b; ++k)
      if (src_[k] == '\n') ++line_;
  }

  void push_text(std::string text, int line) {
    if (!text.empty()) out_.push_back({Tok::Text, std::move(text), 0, 0, line});
  }

  // After a `%}` or `#}` (trim_blocks) or a `-` end marker: consumes the whitespace to drop and
  // returns whether the consumed text ended a line (the next text starts a line).
  bool after_end(bool strip_all, bool trim_one) {
    const size_t start = pos_;
    if (strip_all) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (trim_one && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    count_lines(start, pos_);
    return pos_ > start && src_[pos_ - 1] == '\n';
  }

  bool comment() {
    const int start_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(start_line, "unclosed comment '{#'");
    const bool minus = end > pos_ && src_[end - 1] == '-';
    const bool plus = end > pos_ && src_[end - 1] == '+';
    count_lines(pos_, end);
    pos_ = end + 2;
    return after_end(minus, !plus);
  }

  // Lexes the inside of `{{ ... }}` or `{% ... %}` up to and including its end marker.
  bool tag_body(char kind) {
    const int start_line = line_;
    out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, line_});
    const char close = kind == '{' ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(start_line, kind == '{' ? "unclosed '{{'" : "unclosed '{%'");
      const char c = src_[pos_];
      // End markers: `}}`, `-}}`, `%}`, `-%}`, `+%}`; as in Jinja2, not while a bracket is
      // open (`{{ {'a': {'b': 1}} }}`).
      size_t mark = 0;
      char sign = '\0';
      if (brackets_ > 0) {
      } else if (c == close && at(pos_ + 1) == '}') {
        mark = 2;
      } else if ((c == '-' || (c == '+' && kind == '%')) && at(pos_ + 1) == close && at(pos_ + 2) == '}') {
        mark = 3;
        sign = c;
      }
      if (mark) {
        brackets_ = 0;
        out_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, line_});
        pos_ += mark;
        return after_end(sign == '-', kind == '%' && sign != '+');
      }
      lex_token();
    }
  }

  char at(size_t p) const { return p < src_.size() ? src_[p] : '\0'; }

  void lex_token() {
    const char c = src_[pos_];
    const int line = line_;
    if (is_name_start(c)) {
      size_t e = pos_;
      while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
      out_.push_back({Tok::Name, src_.substr(pos_, e - pos_), 0, 0, line});
      pos_ = e;
      return;
    }
    if (is_digit(c)) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two) {
      if (c == op[0] && at(pos_ + 1) == op[1]) {
        out_.push_back({Tok::Op, op, 0, 0, line});
        pos_ += 2;
        return;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) && c != '\0') {
      if (c == '(' || c == '[' || c == '{') ++brackets_;
      if ((c == ')' || c == ']' || c == '}') && brackets_ > 0) --brackets_;
      out_.push_back({Tok::Op, std::string(1, c), 0, 0, line});
      ++pos_;
      return;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    char buf[32];
    if (u >= 0x20 && u < 0x7f) {
      std::snprintf(buf, sizeof buf, "'%c'", c);
    } else {
      std::snprintf(buf, sizeof buf, "byte 0x%02x", u);
    }
    fail(line, std::string("unexpected character ") + buf);
  }

  void lex_number() {
    const int line = line_;
    std::string digits;
    auto take_digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && is_digit(at(pos_ + 1))))) {
        if (src_[pos_] != '_') digits += src_[pos_];
        ++pos_;
      }
    };
    take_digits();
    bool is_float = false;
    if (at(pos_) == '.' && is_digit(at(pos_ + 1))) {
      is_float = true;
      digits += '.';
      ++pos_;
      take_digits();
    }
    if ((at(pos_) == 'e' || at(pos_) == 'E') &&
        (is_digit(at(pos_ + 1)) || ((at(pos_ + 1) == '+' || at(pos_ + 1) == '-') && is_digit(at(pos_ + 2))))) {
      is_float = true;
      digits += 'e';
      ++pos_;
      if (src_[pos_] == '+' || src_[pos_] == '-') digits += src_[pos_++];
      take_digits();
    }
    Token t{is_float ? Tok::Float : Tok::Int, digits, 0, 0, line};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) fail(line, "integer literal too large");
      t.i = static_cast<int64_t>(v);
    }
    out_.push_back(std::move(t));
  }

  // A quoted string with Python's escapes (\n \t \r \\ \' \" \xNN \uNNNN \UNNNNNNNN ...);
  // an unknown escape keeps its backslash, as Python does.
  void lex_string(char quote) {
    const int line = line_;
    ++pos_;
    std::string s;
    while (true) {
      if (pos_ >= src_.size()) fail(line, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos_ >= src_.size()) fail(line, "unterminated string literal");
      const char e = src_[pos_++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'v': s += '\v'; break;
        case 'a': s += '\a'; break;
        case '0': s += '\0'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = at(pos_ + k);
            const int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) fail(line, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail(line, "invalid code point escape in string literal");
          pos_ += n;
          append_utf8(s, cp);
          break;
        }
        default:
          s += '\\';
          s += e;
      }
    }
    out_.push_back({Tok::String, std::move(s), 0, 0, line});
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  int brackets_ = 0;  // brackets open in the current tag
  std::vector<Token> out_;
};

// Filters/tests/tags that Jinja has but this engine refuses, with the reason.
const char* refused_tag(const std::string& name) {
  if (name == "include" || name == "import" || name == "from" || name == "extends" || name == "block")
    return "is not supported: chat templates get no file access";
  if (name == "call" || name == "filter" || name == "with" || name == "autoescape" || name == "raw" ||
      name == "do")
    return "is not supported by this chat-template engine (docs/chat-templates.md)";
  return nullptr;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, const Limits& limits) : t_(std::move(toks)), limits_(limits) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end, 0);
    return body;
  }

 private:
  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > p.limits_.max_parse_depth)
        fail(line, "nesting deeper than " + std::to_string(p.limits_.max_parse_depth) + " levels");
    }
    ~Depth() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().s == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().s == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::Name: return "'" + t.s + "'";
      case Tok::String: return "a string";
      case Tok::Int:
      case Tok::Float: return "a number";
      case Tok::Op: return "'" + t.s + "'";
      case Tok::Eof: return "the end of the template";
    }
    return "?";
  }
  [[noreturn]] void unexpected(const char* wanted) const {
    fail(cur().line, std::string("expected ") + wanted + ", found " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected((std::string("'") + op + "'").c_str());
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    std::string s = cur().s;
    advance();
    return s;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("'%}'");
    advance();
  }

  // Statements up to one of `ends` (its name is stored in *end, the `{%` and name consumed).
  Body parse_body(const std::vector<const char*>& ends, std::string* end, int open_line) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.empty()) return body;
        fail(open_line, std::string("missing {% ") + ends.back() + " %} for the block opened here");
      }
      if (t.type == Tok::Text) {
        auto s = make_stmt(StmtKind::Text, t.line);
        s->text = t.s;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == Tok::VarBegin) {
        const int line = t.line;
        advance();
        auto s = make_stmt(StmtKind::Output, line);
        s->expr = parse_expression();
        if (cur().type != Tok::VarEnd) unexpected("'}}'");
        advance();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& name = peek();
        if (name.type != Tok::Name) {
          advance();
          unexpected("a tag name");
        }
        for (const char* e : ends) {
          if (name.s == e) {
            advance();
            advance();
            *end = e;
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        unexpected("text, '{{' or '{%'");
      }
    }
  }

  static StmtPtr make_stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    advance();  // {%
    const int line = cur().line;
    Depth depth(*this, line);
    const std::string tag = cur().s;
    advance();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "generation") {
      expect_block_end();
      auto s = make_stmt(StmtKind::Generation, line);
      std::string end;
      s->body = parse_body({"endgeneration"}, &end, line);
      expect_block_end();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(line, "'" + tag + "' outside a for loop");
      expect_block_end();
      return make_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    if (const char* why = refused_tag(tag)) fail(line, "'{% " + tag + " %}' " + why);
    if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif")
      fail(line, "unexpected '{% " + tag + " %}' (no open block it could close)");
    fail(line, "unknown tag '" + tag + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(StmtKind::If, line);
    ExprPtr cond = parse_expression();
    expect_block_end();
    while (true) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, &end, line);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_expression();
        expect_block_end();
        continue;
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end, line);
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().type != Tok::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(StmtKind::For, line);
    s->targets = parse_targets();
    if (!skip_name("in")) unexpected("'in'");
    s->expr = parse_or_tuple();
    if (skip_name("if")) s->filter = parse_expression();
    if (is_name("recursive")) fail(line, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end, line);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &end, line);
    }
    expect_block_end();
    return s;
  }

  // The iterable of a for: an expression without the ternary (its `if` is the loop filter),
  // or a tuple `a, b`.
  ExprPtr parse_or_tuple() {
    ExprPtr first = parse_or();
    if (!is_op(",")) return first;
    auto list = std::make_unique<Expr>();
    list->kind = ExprKind::List;
    list->line = first->line;
    list->kids.push_back(std::move(first));
    while (skip_op(",")) {
      if (is_name("if") || cur().type == Tok::BlockEnd) break;
      list->kids.push_back(parse_or());
    }
    return list;
  }

  StmtPtr parse_set(int line) {
    auto s = make_stmt(StmtKind::Set, line);
    s->targets = parse_targets();
    if (s->targets.size() == 1 && skip_op(".")) s->attr = expect_name();
    if (skip_op("=")) {
      s->expr = parse_expression();
      if (is_op(",")) {
        auto list = std::make_unique<Expr>();
        list->kind = ExprKind::List;
        list->line = s->expr->line;
        list->kids.push_back(std::move(s->expr));
        while (skip_op(",")) {
          if (cur().type == Tok::BlockEnd) break;
          list->kids.push_back(parse_expression());
        }
        s->expr = std::move(list);
      }
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1 || !s->attr.empty()) unexpected("'='");
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, &end, line);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(StmtKind::Macro, line);
    auto m = std::make_unique<MacroNode>();
    m->line = line;
    m->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      m->params.push_back(expect_name());
      m->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
      if (!skip_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    m->body = parse_body({"endmacro"}, &end, line);
    loop_depth_ = saved_loops;
    expect_block_end();
    s->macro = std::move(m);
    return s;
  }

  // ---- expressions

  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  ExprPtr parse_expression() {
    Depth depth(*this, cur().line);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto c = node(ExprKind::Cond, line);
      c->kids.push_back(parse_or());
      c->kids.push_back(std::move(e));
      c->kids.push_back(skip_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto n = node(ExprKind::Or, cur().line);
      advance();
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto n = node(ExprKind::And, cur().line);
      advance();
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth depth(*this, cur().line);
      auto n = node(ExprKind::Not, cur().line);
      advance();
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == "<=" || cur().s == ">" || cur().s == ">=")) {
        op = cur().s;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == Tok::Name && peek().s == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::Compare, first->line);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r, int line) {
    auto n = node(ExprKind::Binary, line);
    n->name = op;
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().s;
      const int line = cur().line;
      advance();
      e = binary(std::move(e), op, parse_concat(), line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      advance();
      e = binary(std::move(e), "~", parse_math2(), line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().s;
      const int line = cur().line;
      advance();
      e = binary(std::move(e), op, parse_pow(), line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      e = binary(std::move(e), "**", parse_unary(true), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Depth depth(*this, cur().line);
      e = node(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur().line);
      advance();
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case Tok::Name: {
        auto e = node(ExprKind::Literal, line);
        if (t.s == "true" || t.s == "True") {
          e->value = Value(true);
        } else if (t.s == "false" || t.s == "False") {
          e->value = Value(false);
        } else if (t.s == "none" || t.s == "None") {
          e->value = Value::none();
        } else {
          e->kind = ExprKind::Name;
          e->name = t.s;
        }
        advance();
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) {
          s += cur().s;
          advance();
        }
        auto e = node(ExprKind::Literal, line);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::Int: {
        auto e = node(ExprKind::Literal, line);
        e->value = Value(t.i);
        advance();
        return e;
      }
      case Tok::Float: {
        auto e = node(ExprKind::Literal, line);
        e->value = Value(t.f);
        advance();
        return e;
      }
      case Tok::Op:
        if (t.s == "(") {
          advance();
          if (skip_op(")")) return node(ExprKind::List, line);
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto list = node(ExprKind::List, line);
            list->kids.push_back(std::move(e));
            while (skip_op(",")) {
              if (is_op(")")) break;
              list->kids.push_back(parse_expression());
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          advance();
          auto list = node(ExprKind::List, line);
          while (!is_op("]")) {
            list->kids.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return list;
        }
        if (t.s == "{") {
          advance();
          auto dict = node(ExprKind::Dict, line);
          while (!is_op("}")) {
            dict->kids.push_back(parse_expression());
            expect_op(":");
            dict->kids.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return dict;
        }
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (is_op(".")) {
        advance();
        if (cur().type == Tok::Int) {
          auto n = node(ExprKind::Index, line);
          n->kids.push_back(std::move(e));
          auto k = node(ExprKind::Literal, line);
          k->value = Value(cur().i);
          advance();
          n->kids.push_back(std::move(k));
          e = std::move(n);
          continue;
        }
        auto n = node(ExprKind::Attr, line);
        n->name = expect_name();
        n->kids.push_back(std::move(e));
        e = std::move(n);
      } else if (is_op("[")) {
        advance();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), ExprKind::Call, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    Depth depth(*this, line);
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (colons < 2 && skip_op(":")) {
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      auto n = node(ExprKind::Index, line);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    auto n = node(ExprKind::Slice, line);
    n->kids.push_back(std::move(obj));
    for (auto& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  // `(args)` after callee (Call) or after a filter / test name: positional, then name=value
  // keyword arguments; `*x` spreads a list into the positional arguments (Call only).
  ExprPtr parse_call(ExprPtr callee, ExprKind kind, const std::string& name) {
    const int line = cur().line;
    auto n = node(kind, line);
    n->name = name;
    if (callee) n->kids.push_back(std::move(callee));
    if (is_op("(")) {
      Depth depth(*this, line);
      advance();
      while (!is_op(")")) {
        if (cur().type == Tok::Name && peek().type == Tok::Op && peek().s == "=") {
          n->kw_names.push_back(cur().s);
          advance();
          advance();
          n->kids.push_back(parse_expression());
        } else {
          if (!n->kw_names.empty()) fail(cur().line, "positional argument after keyword argument");
          if (kind == ExprKind::Call && is_op("*")) {
            advance();
            n->kids.push_back(parse_expression());
            n->star = true;
            if (!is_op(")")) unexpected("')' after *args");
            break;
          }
          n->kids.push_back(parse_expression());
        }
        if (!skip_op(",")) break;
      }
      expect_op(")");
    }
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        advance();
        const int line = cur().line;
        std::string name = expect_name();
        if (!is_known_filter(name)) fail(line, "unknown filter '" + name + "'");
        e = parse_call(std::move(e), ExprKind::Filter, name);
      } else if (is_name("is")) {
        advance();
        const bool negate = skip_name("not");
        const int line = cur().line;
        std::string name = expect_name();
        if (!is_known_test(name)) fail(line, "unknown test '" + name + "'");
        if (is_op("(")) {
          e = parse_call(std::move(e), ExprKind::Test, name);
        } else {
          auto n = node(ExprKind::Test, line);
          n->name = name;
          n->kids.push_back(std::move(e));
          // One argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
          const Token& t = cur();
          const bool keyword = t.type == Tok::Name && (t.s == "else" || t.s == "or" || t.s == "and" || t.s == "if" ||
                                                       t.s == "in" || t.s == "is" || t.s == "not");
          if (!keyword && (t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Int ||
                           t.type == Tok::Float || (t.type == Tok::Op && (t.s == "[" || t.s == "{")))) {
            Depth depth(*this, t.line);
            n->kids.push_back(parse_postfix(parse_primary()));
          }
          e = std::move(n);
        }
        e->negate = negate;
      } else if (is_op("(")) {
        e = parse_call(std::move(e), ExprKind::Call, "");
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const Limits& limits_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::shared_ptr<const Program> parse_program(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_template_bytes)
    throw Error("chat template line 1: template is " + std::to_string(source.size()) + " bytes, more than the limit of " +
                std::to_string(limits.max_template_bytes));
  // Newlines as Jinja2 reads them (str.splitlines() joined by "\n"): "\r\n" and "\r" are "\n",
  // and keep_trailing_newline=False drops one final newline.
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  auto program = std::make_shared<Program>();
  program->limits = limits;
  Parser parser(Lexer(std::move(src)).run(), limits);
  program->body = parser.parse_template();
  return program;
}

}  // namespace hybridlm::chat
