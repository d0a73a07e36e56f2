// Byte-level BPE training and encoding. Training counts pairs once, then updates the counts only
// for the words a merge touches (an index pair -> words), so learning ~1k merges on a MB of text
// takes well under a second; the best pair is found by a scan (ties broken by the smaller pair,
// so the result is deterministic).
#include "tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "kiln/io.h"

namespace kiln::train {
namespace {

bool is_word(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_newline(unsigned char c) { return c == '\n' || c == '\r'; }
bool is_blank(unsigned char c) { return c == ' ' || c == '\t'; }
bool is_punct(unsigned char c) { return !is_word(c) && !is_digit(c) && !is_newline(c) && !is_blank(c); }
uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  const size_t n = s.size();
  size_t i = 0;
  auto run = [&](size_t j, bool (*pred)(unsigned char)) {
    while (j < n && pred(static_cast<unsigned char>(s[j]))) ++j;
    return j;
  };
  while (i < n) {
    const size_t start = i;
    size_t j = i;
    unsigned char c = static_cast<unsigned char>(s[j]);
    // One leading space joins the following word / number / punctuation (" return", " =").
    if (c == ' ' && j + 1 < n && !is_blank(static_cast<unsigned char>(s[j + 1])) &&
        !is_newline(static_cast<unsigned char>(s[j + 1]))) {
      ++j;
      c = static_cast<unsigned char>(s[j]);
    }
    if (is_word(c)) {
      j = run(j, [](unsigned char x) { return is_word(x) || is_digit(x); });
    } else if (is_digit(c)) {
      j = run(j, is_digit);
    } else if (is_newline(c)) {
      j = run(j, is_newline);
    } else if (is_blank(c)) {
      j = run(j, is_blank);
      // Leave the last space of an indentation run to the word after it.
      if (j < n && j - start > 1 && s[j - 1] == ' ' && !is_newline(static_cast<unsigned char>(s[j]))) --j;
    } else {
      j = run(j, is_punct);
    }
    out.push_back(s.substr(start, j - start));
    i = j;
  }
  return out;
}

Tokenizer::Tokenizer() {
  pieces_.reserve(257);
  for (int b = 0; b < 256; ++b) pieces_.emplace_back(1, static_cast<char>(b));
  pieces_.emplace_back();  // <|endoftext|>
}

void Tokenizer::add_merge(int32_t a, int32_t b) {
  const int32_t id = static_cast<int32_t>(pieces_.size());
  merges_.emplace_back(a, b);
  rank_[pair_key(a, b)] = id;
  pieces_.push_back(pieces_[a] + pieces_[b]);
}

Tokenizer Tokenizer::train(std::string_view text, int64_t vocab_size) {
  KILN_CHECK(vocab_size >= kFirstMerge, "Tokenizer::train", "vocab_size must be >= ", kFirstMerge, ", got ",
             vocab_size);
  Tokenizer tok;
  // Unique pre-tokens with their counts, in first-seen order (deterministic).
  std::unordered_map<std::string_view, int64_t> index;
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (std::string_view w : pretokenize(text)) {
    auto [it, fresh] = index.emplace(w, static_cast<int64_t>(words.size()));
    if (fresh) {
      words.emplace_back(w.begin(), w.end());
      for (int32_t& v : words.back()) v = static_cast<unsigned char>(v);
      counts.push_back(0);
    }
    ++counts[it->second];
  }
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int64_t>> where;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& ws = words[w];
    for (size_t i = 0; i + 1 < ws.size(); ++i) {
      const uint64_t k = pair_key(ws[i], ws[i + 1]);
      pair_count[k] += counts[w];
      where[k].push_back(static_cast<int64_t>(w));
    }
  }
  std::vector<int64_t> touched;
  while (tok.vocab_size() < vocab_size) {
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [k, c] : pair_count) {
      if (c > best_count || (c == best_count && c > 0 && k < best)) best = k, best_count = c;
    }
    if (best_count < 2) break;  // nothing left worth merging
    const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
    const int32_t id = static_cast<int32_t>(tok.vocab_size());
    tok.add_merge(a, b);
    touched = std::move(where[best]);
    where.erase(best);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int64_t w : touched) {
      auto& ws = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < ws.size(); ++i) has = has || (ws[i] == a && ws[i + 1] == b);
      if (!has) continue;  // a stale entry
      for (size_t i = 0; i + 1 < ws.size(); ++i) pair_count[pair_key(ws[i], ws[i + 1])] -= counts[w];
      std::vector<int32_t> merged;
      merged.reserve(ws.size());
      for (size_t i = 0; i < ws.size(); ++i) {
        if (i + 1 < ws.size() && ws[i] == a && ws[i + 1] == b) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(ws[i]);
        }
      }
      ws = std::move(merged);
      for (size_t i = 0; i + 1 < ws.size(); ++i) {
        const uint64_t k = pair_key(ws[i], ws[i + 1]);
        pair_count[k] += counts[w];
        if (ws[i] == id || ws[i + 1] == id) where[k].push_back(w);
      }
    }
    pair_count.erase(best);
  }
  return tok;
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  auto hit = cache_.find(std::string(word));
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> ids(word.begin(), word.end());
  for (int32_t& v : ids) v = static_cast<unsigned char>(v);
  // Apply the earliest-learned merge present until none applies (the order training saw them).
  while (ids.size() > 1) {
    int32_t best_id = -1;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = rank_.find(pair_key(ids[i], ids[i + 1]));
      if (it != rank_.end() && (best_id < 0 || it->second < best_id)) best_id = it->second, best_i = i;
    }
    if (best_id < 0) break;
    const auto [a, b] = merges_[best_id - kFirstMerge];
    std::vector<int32_t> next;
    next.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i >= best_i && i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
        next.push_back(best_id);
        ++i;
      } else {
        next.push_back(ids[i]);
      }
    }
    ids = std::move(next);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() < (1u << 20)) cache_.emplace(std::string(word), std::move(ids));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  for (std::string_view w : pretokenize(text)) encode_word(w, out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), "Tokenizer", "token id ", id, " out of range [0, ", vocab_size(), ")");
  return pieces_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) s += token_bytes(id);
  return s;
}

std::string Tokenizer::to_json() const {
  nlohmann::json j;
  j["type"] = "kiln-byte-bpe";
  j["version"] = 1;
  j["vocab_size"] = vocab_size();
  j["eot_id"] = kEot;
  j["first_merge_id"] = kFirstMerge;
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges_) m.push_back({a, b});
  j["merges"] = std::move(m);
  return j.dump();
}

Tokenizer Tokenizer::from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  KILN_CHECK(!j.is_discarded() && j.is_object() && j.contains("type") && j["type"] == "kiln-byte-bpe", "Tokenizer",
             "not a kiln byte-BPE tokenizer file");
  KILN_CHECK(j.contains("merges") && j["merges"].is_array() && j.contains("vocab_size") &&
                 j["vocab_size"].is_number_integer(),
             "Tokenizer", "a tokenizer file needs \"merges\" (an array) and \"vocab_size\" (an integer)");
  Tokenizer tok;
  for (const auto& m : j.at("merges")) {
    KILN_CHECK(m.is_array() && m.size() == 2 && m[0].is_number_integer() && m[1].is_number_integer() &&
                   m[0].get<int64_t>() < tok.vocab_size() && m[1].get<int64_t>() < tok.vocab_size(),
               "Tokenizer", "merge ", m.dump(), " is not a pair of known token ids");
    const int32_t a = m.at(0).get<int32_t>(), b = m.at(1).get<int32_t>();
    KILN_CHECK(a >= 0 && b >= 0 && a < tok.vocab_size() && b < tok.vocab_size() && a != kEot && b != kEot,
               "Tokenizer", "merge (", a, ", ", b, ") refers to an unknown token");
    tok.add_merge(a, b);
  }
  KILN_CHECK(tok.vocab_size() == j.at("vocab_size").get<int64_t>(), "Tokenizer", "vocab_size ",
             j.at("vocab_size").get<int64_t>(), " does not match ", tok.vocab_size(), " tokens");
  return tok;
}

void Tokenizer::save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "Tokenizer", "cannot write ", path);
  f << to_json();
  KILN_CHECK(f.good(), "Tokenizer", "write failed: ", path);
}

Tokenizer Tokenizer::load(const std::string& path) {
  return from_json(io::read_small_file(path, size_t{256} << 20));
}

}  // namespace kiln::train
