// Command-word suggestions and precision spellings of the `kiln` command (see command_line.h).
#include "command_line.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace kiln::apps {
namespace {

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b: "trian" -> "train" is 1.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

}  // namespace

std::string closest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(1, word.size() / 3) + 1;
  for (const std::string& n : names) {
    const size_t d = n.rfind(word, 0) == 0 && !word.empty() ? 0 : edit_distance(lower(word), n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

int check_command_words(const CLI::App& app, int argc, const char* const* argv, std::ostream& err) {
  const CLI::App* level = &app;
  std::string path;
  for (int i = 1; i < argc && level->get_require_subcommand_min() > 0; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return -1;  // --help and the like: CLI11's
    const std::vector<std::string> names = subcommand_names(*level);
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const std::string guess = closest_name(word, names);
      err << "kiln: unknown command \"" << path << word << "\"";
      if (!guess.empty()) err << "; did you mean \"" << path << guess << "\"?";
      err << " (commands:";
      for (size_t k = 0; k < names.size(); ++k) err << (k ? ", " : " ") << path << names[k];
      err << "; kiln COMMAND --help lists its flags)\n";
      return 2;
    }
    level = level->get_subcommand(word);
    path += word + " ";
  }
  return -1;
}

CLI::Validator autocast_spelling() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        static const std::map<std::string, std::string> spellings = {
            {"auto", "auto"}, {"bf16", "bf16"}, {"bfloat16", "bf16"}, {"none", "none"}, {"off", "none"},
            {"fp32", "none"}, {"float32", "none"}, {"f32", "none"}, {"float", "none"}};
        const auto it = spellings.find(lower(value));
        if (it == spellings.end())
          return "--autocast: '" + value + "' is not a precision (auto, bf16 / bfloat16, or none / fp32 / float32)";
        value = it->second;
        return {};
      },
      "{auto,bf16,none}");
}

}  // namespace kiln::apps
