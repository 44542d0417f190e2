// hybridlm: one binary, one subcommand per job, each in its own file (tools/hybridlm/cli.h).
// Exit codes: 0 success, 1 a user error (one line on stderr naming the file, tensor, key or value
// at fault), 2 a usage error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

// Edits (insert, delete, substitute) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `word`, or "" when none is close (more than a third of it differs).
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates)
    if (const size_t d = edit_distance(word, c); d < best_d) {
      best_d = d;
      best = c;
    }
  return best;
}

// Every spelling of every flag of `app` ("-m", "--model", ...).
std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  for (const CLI::App* g : app.get_subcommands([](const CLI::App* a) { return a->get_name().empty(); }))
    for (const std::string& n : flag_names(*g)) names.push_back(n);
  return names;
}

// A command line CLI11 refused: one line naming what was wrong, with the nearest known flag or
// subcommand for a misspelled one (`first`: the first argument). Usage errors exit 2.
int usage_error(CLI::App& app, const CLI::ParseError& e, const char* first) {
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands())
    if (!s->get_name().empty()) sub = s;
  const std::string where = sub ? sub->get_name() : "hybridlm";
  const std::string help = sub ? "hybridlm help " + sub->get_name() : "hybridlm help";
  if (!sub && first && first[0] != '-') {  // `hybridlm generat ...`
    std::vector<std::string> names;
    for (const CLI::App* s : app.get_subcommands({})) names.push_back(s->get_name());
    const std::string near = nearest(first, names);
    std::fprintf(stderr, "error: unknown subcommand %s%s (hybridlm help lists them)\n", first,
                 near.empty() ? "" : ("; did you mean " + near + "?").c_str());
    return 2;
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    const std::vector<std::string> extra = sub ? sub->remaining() : app.remaining();
    if (!extra.empty()) {
      const std::string& arg = extra.front();
      const std::string word = arg.rfind("--", 0) == 0 ? arg.substr(0, arg.find('=')) : arg;  // --flag=value
      const bool flag = word.size() > 1 && word[0] == '-';
      std::string msg = where + ": unknown " + (flag ? "flag " : sub ? "argument " : "subcommand ") + word;
      std::vector<std::string> names;
      if (flag) {
        names = flag_names(sub ? *sub : app);
      } else if (!sub) {
        for (const CLI::App* s : app.get_subcommands({})) names.push_back(s->get_name());
      }
      const std::string near = nearest(word, names);
      if (!near.empty()) msg += "; did you mean " + near + "?";
      std::fprintf(stderr, "error: %s (%s lists them)\n", msg.c_str(), help.c_str());
      return 2;
    }
  }
  std::string what = e.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  std::fprintf(stderr, "error: %s: %s (see %s)\n", where.c_str(), what.c_str(), help.c_str());
  return 2;
}

}  // namespace
}  // namespace hybridlm

int main(int argc, char** argv) {
  using namespace hybridlm;
  CLI::App app{"hybridlm: run hybrid state-space / attention language models on CPU", "hybridlm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridlm 0.1.0");
  const std::vector<Subcommand> subcommands = {add_generate(app), add_score(app),   add_perplexity(app),
                                               add_tokenize(app), add_inspect(app), add_bench(app),
                                               add_plan(app),     add_train_tokenizer(app),
                                               add_prepare_data(app), add_grad(app), add_train(app),
                                               add_serve(app), add_chat(app)};
  // `hybridlm help [SUBCOMMAND]`: the same text as --help.
  std::string help_topic;
  CLI::App* help = app.add_subcommand("help", "print this help, or a subcommand's (hybridlm help generate)");
  help->add_option("subcommand", help_topic, "the subcommand to describe");
  const std::string top_help = app.help();  // before parsing selects a subcommand to describe
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e, argc > 1 ? argv[1] : nullptr);
  }
  if (*help) {
    if (help_topic.empty()) {
      std::cout << top_help;
      return 0;
    }
    for (const Subcommand& s : subcommands)
      if (s.app->get_name() == help_topic) {
        std::cout << s.app->help(app.get_name());
        return 0;
      }
    std::vector<std::string> names;
    for (const Subcommand& s : subcommands) names.push_back(s.app->get_name());
    const std::string near = nearest(help_topic, names);
    std::fprintf(stderr, "error: help: no subcommand %s%s (hybridlm help lists them)\n", help_topic.c_str(),
                 near.empty() ? "" : ("; did you mean " + near + "?").c_str());
    return 2;
  }
  try {
    for (const Subcommand& s : subcommands)
      if (*s.app) {
        const int rc = s.run();
        // Output that did not reach its file (`> /dev/full`, a full disk) is a failed run, for
        // every subcommand: flush now, while the error can still be seen and reported.
        std::cout.flush();
        if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
          std::fprintf(stderr, "error: cannot write to standard output: %s\n", std::strerror(errno));
          return 1;
        }
        return rc;
      }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // filesystem, system errors: still one line, never an abort
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
