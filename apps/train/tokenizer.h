#pragma once
// Byte-level BPE: every byte is a token (ids 0..255), id 256 is <|endoftext|>, and each learned
// merge (a, b) -> 257 + rank joins two tokens. Text is first split into pre-tokens (identifier
// runs with one leading space, digit runs, punctuation runs, newline runs, space runs) so merges
// never cross those boundaries; the same split is used for training and encoding.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::train {

class Tokenizer {
 public:
  static constexpr int32_t kEot = 256;
  static constexpr int32_t kFirstMerge = 257;

  Tokenizer();  // bytes only (vocab 257)
  // Learns vocab_size - 257 merges from `text` (most frequent pair first; ties -> smallest pair).
  static Tokenizer train(std::string_view text, int64_t vocab_size);

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_bytes(int32_t id) const;
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

  std::string to_json() const;
  static Tokenizer from_json(const std::string& json);
  void save(const std::string& path) const;
  static Tokenizer load(const std::string& path);

 private:
  void add_merge(int32_t a, int32_t b);
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, int32_t> rank_;  // (a << 32 | b) -> merged id
  std::vector<std::string> pieces_;             // id -> bytes ("" for <|endoftext|>)
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// The pre-token split (exposed for tests): concatenating the pieces gives `text` back.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace kiln::train
