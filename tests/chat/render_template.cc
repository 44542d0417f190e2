// render_template: renders chat templates with our engine for the cross-check against
// @huggingface/jinja (compare.mjs).
//
// usage: render_template <cases.json>
//   cases.json: [{"template": "<path>", "context": {...}}, ...]
// output: one JSON array on stdout, per case {"output": "..."} or {"error": "..."}.
// strftime_now sees a fixed clock (2024-07-26 00:00:00 UTC, run with TZ=UTC).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "chat/jinja.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw hybridlm::Error(path + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <cases.json>\n", argv[0]);
    return 2;
  }
  try {
    // ordered_json: dicts keep their key order, as the JavaScript reference and transformers do.
    const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(read_file(argv[1]));
    std::map<std::string, hybridlm::chat::Template> templates;
    hybridlm::chat::RenderOptions options;
    options.now = 1721952000;  // 2024-07-26T00:00:00Z
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& c : cases) {
      const std::string path = c.at("template").get<std::string>();
      try {
        auto it = templates.find(path);
        if (it == templates.end())
          it = templates.emplace(path, hybridlm::chat::Template::parse(read_file(path))).first;
        out.push_back({{"output", it->second.render(c.at("context"), options)}});
      } catch (const hybridlm::Error& e) {
        out.push_back({{"error", e.what()}});
      }
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "render_template: %s\n", e.what());
    return 1;
  }
  return 0;
}
