// The BPE model of tokenizer.json.
//
// A word starts as one symbol per character (a character missing from the
// vocab becomes its <0xNN> byte pieces with byte_fallback, else the unk token,
// fused with a neighbouring unk when fuse_unk). Merges then apply lowest rank
// first, leftmost first among equal ranks, through a priority queue of
// candidate pairs; stale candidates (a side already merged away) are skipped
// when popped. This is `tokenizers`' Word::merge_all, which for ranked merges
// gives the same result as "repeatedly merge the best-ranked adjacent pair".
#include <queue>

#include "io/tokenizer_impl.h"
#include "nibble/error.h"

namespace nibble::io::tok {

BpeModel::BpeModel(const json& m, const std::string& where) {
  NIBBLE_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab should be an object of token -> id", where);
  vocab_.reserve(m["vocab"].size());
  for (const auto& [token, id] : m["vocab"].items()) {
    NIBBLE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
                 "{}: model.vocab[{}] should be a non-negative id, found {}", where, json(token).dump(), id.dump());
    vocab_.emplace(token, id.get<int32_t>());
  }
  auto optional_string = [&](const char* key) -> std::string {
    if (!m.contains(key) || m[key].is_null()) return {};
    return json_string(m, key, where + ": model");
  };
  if (std::string unk = optional_string("unk_token"); !unk.empty()) {
    unk_token_ = unk;
    if (auto it = vocab_.find(unk); it != vocab_.end()) unk_id_ = it->second;
  }
  byte_fallback_ = json_bool(m, "byte_fallback", false, where + ": model");
  fuse_unk_ = json_bool(m, "fuse_unk", false, where + ": model");
  ignore_merges_ = json_bool(m, "ignore_merges", false, where + ": model");
  continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  end_of_word_suffix_ = optional_string("end_of_word_suffix");
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    NIBBLE_CHECK(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0,
                 "{}: BPE dropout {} is not supported (encoding would be random); only null or 0", where,
                 m["dropout"].dump());
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  NIBBLE_CHECK(m.contains("merges") && m["merges"].is_array(), "{}: model.merges should be an array", where);
  const json& merges = m["merges"];
  merges_.reserve(merges.size());
  auto id_of = [&](const std::string& token, size_t index, const json& merge) {
    auto it = vocab_.find(token);
    NIBBLE_CHECK(it != vocab_.end(), "{}: model.merges[{}] {}: token {} is not in the vocab", where, index,
                 merge.dump(), json(token).dump());
    return it->second;
  };
  int32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {  // "a b" (tokens never contain ' ': it is Ġ or ▁ in these vocabs)
      const std::string& s = e.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;
      const size_t sp = s.find(' ');
      NIBBLE_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                   "{}: model.merges[{}] should be \"left right\" with one space, found {}", where, i, e.dump());
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      NIBBLE_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                   "{}: model.merges[{}] should be \"a b\" or [\"a\", \"b\"], found {}", where, i, e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    const int32_t left = id_of(a, i, e), right = id_of(b, i, e);
    std::string_view tail = b;
    if (!continuing_subword_prefix_.empty() && tail.substr(0, continuing_subword_prefix_.size()) == continuing_subword_prefix_)
      tail.remove_prefix(continuing_subword_prefix_.size());
    const int32_t merged = id_of(a + std::string(tail), i, e);
    merges_[pair_key(left, right)] = Merge{rank++, merged};  // a repeated pair keeps the later rank, as a HashMap collect does
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // Llama 3: a word that is a whole vocab entry is taken as is
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  merge_word(word, out);
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the linked list, -1 at the ends
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[static_cast<size_t>(n - 1)].next = n;
  };

  int32_t pending_unk = -1;  // an unk not yet added (fuse_unk extends it), -1: none
  std::string affixed;
  for (size_t i = 0; i < w.size();) {
    const size_t len = utf8_char_len(static_cast<unsigned char>(w[i]));
    const bool is_first = i == 0, is_last = i + len >= w.size();
    std::string_view s = w.substr(i, len);
    if ((!is_first && !continuing_subword_prefix_.empty()) || (is_last && !end_of_word_suffix_.empty())) {
      affixed.clear();
      if (!is_first) affixed += continuing_subword_prefix_;
      affixed += s;
      if (is_last) affixed += end_of_word_suffix_;
      s = affixed;
    }
    i += len;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        // As in `tokenizers`, a pending unk is not flushed first (it cannot
        // be pending when every byte piece exists, which is the real case).
        for (unsigned char c : s) add(byte_ids_[c]);
        continue;
      }
    }
    if (!unk_token_.empty()) {
      NIBBLE_CHECK(unk_id_.has_value(), "tokenizer: unk_token {} is needed for {} but is not in the vocab",
                   json(unk_token_).dump(), json(std::string(s)).dump());
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // No unk token: the character is dropped, as `tokenizers` does.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // priority_queue pops the largest: make it the lowest rank, then pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto push_pair = [&](int32_t left_pos) {
    const Symbol& l = symbols[static_cast<size_t>(left_pos)];
    if (l.next < 0) return;
    auto it = merges_.find(pair_key(l.id, symbols[static_cast<size_t>(l.next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left_pos, it->second.new_id});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(symbols.size()); ++p) push_pair(p);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale: a side changed since it was queued
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace nibble::io::tok
