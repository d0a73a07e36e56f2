#pragma once
// The training corpus: text documents (files) read in a deterministic order, split into train and
// held-out documents, tokenized and packed back to back into one token stream with a parallel
// document-id stream. A training example is a window of seq_len tokens; its targets are the next
// tokens, with -100 (ignored) where the next token belongs to another document.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "tokenizer.h"

namespace kiln::train {

struct Document {
  std::string name;
  std::string text;
};

// The default corpus: the Python standard library's top-level .py files (python3's stdlib folder,
// else /usr/lib/python3.*). Throws when none is found.
std::string default_corpus_path();
// A file, or every regular file under a folder (recursively; only .py/.txt/.md/.c/.h/.rst... when
// `text_only`, else all), sorted by path. Files that are not valid-looking text are skipped.
std::vector<Document> load_documents(const std::string& path, int64_t max_bytes = 0);

// Every `heldout_every`-th document (by sorted position, starting at heldout_every / 2) is held out.
void split_documents(const std::vector<Document>& docs, int64_t heldout_every, std::vector<Document>& train,
                     std::vector<Document>& heldout);

struct TokenStream {
  std::vector<int32_t> tokens;  // documents back to back, each followed by <|endoftext|>
  std::vector<int32_t> doc;     // document index of each token
};
TokenStream pack(const std::vector<Document>& docs, const Tokenizer& tok);
// Benchmark data: n_tokens random tokens in [0, vocab) in documents of random lengths (uniform in
// [1, 2 * mean_doc_len - 1]), deterministic in `seed`. No tokenizer needed.
TokenStream synthetic_stream(int64_t n_tokens, int64_t vocab, int64_t mean_doc_len, uint64_t seed);

struct Batch {
  Tensor input;    // [B, T] int64
  Tensor target;   // [B, T] int64, -100 across document boundaries
  Tensor doc_ids;  // [B, T] int32 (per row, renumbered from 0)
  int64_t tokens = 0;  // non-ignored targets
};

// Windows of seq_len tokens over a stream, visited in a shuffled order per epoch. The order for
// epoch e is a permutation drawn from a generator seeded by (seed, e), so the position
// (epoch, cursor) is the whole state needed to resume.
class Loader {
 public:
  Loader(const TokenStream& stream, int64_t seq_len, uint64_t seed, bool shuffle);
  int64_t num_windows() const { return num_windows_; }
  Batch next(int64_t batch_size);
  Batch window_batch(const std::vector<int64_t>& windows) const;  // specific windows, no state change
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  void set_position(int64_t epoch, int64_t cursor);

 private:
  void reshuffle();
  const TokenStream* stream_;
  int64_t seq_len_, num_windows_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace kiln::train
