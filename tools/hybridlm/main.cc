// hybridlm: one binary, one subcommand per job, each in its own file (tools/hybridlm/cli.h).
// Exit codes: 0 success, 1 a user error (one line on stderr naming the file, tensor, key or value
// at fault), 2 a usage error.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <vector>

#include "base/error.h"
#include "tools/hybridlm/cli.h"

int main(int argc, char** argv) {
  using namespace hybridlm;
  CLI::App app{"hybridlm: run hybrid state-space / attention language models on CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridlm 0.1.0");
  const std::vector<Subcommand> subcommands = {add_generate(app), add_score(app),   add_perplexity(app),
                                               add_tokenize(app), add_inspect(app), add_bench(app),
                                               add_plan(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
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
