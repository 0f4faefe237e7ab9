#include "nibble/util.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <vector>

#include <openssl/evp.h>

#include "nibble/error.h"

namespace nibble {

namespace {
std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}
}  // namespace

Progress::Progress(std::string label, int64_t total, bool enabled, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      enabled_(enabled && isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {
  if (enabled_) draw(false);
}

Progress::~Progress() { finish(); }

void Progress::advance(int64_t n) {
  done_ += n;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= std::chrono::milliseconds(100) || done_ >= total_) draw(false);
}

void Progress::set_note(std::string note) { note_ = std::move(note); }

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void Progress::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  constexpr int kWidth = 28;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : NAN;
  std::string line = fmt::format("\r{} [{}] {:>3.0f}% {}/{}{} {} {}", label_, bar, 100 * frac, done_, total_,
                                 unit_.empty() ? "" : " " + unit_,
                                 final ? "in " + format_duration(elapsed) : "ETA " + format_duration(eta), note_);
  if (line.size() > 120) line.resize(120);
  std::fprintf(stderr, "%s\033[K%s", line.c_str(), final ? "\n" : "");
  std::fflush(stderr);
}

namespace {
std::string hex_of(const unsigned char* d, unsigned len) {
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", d[i]);
  return hex;
}
}  // namespace

std::string sha256_hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr);
  return hex_of(digest, len);
}

std::string sha256_file(const std::filesystem::path& path, const std::atomic<bool>* cancel) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  NIBBLE_CHECK(f, "{}: cannot open for hashing ({})", path.string(), std::strerror(errno));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((!cancel || !cancel->load(std::memory_order_relaxed)) && (n = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    EVP_DigestUpdate(ctx, buf.data(), n);
  const bool read_error = std::ferror(f);
  std::fclose(f);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  NIBBLE_CHECK(!read_error, "{}: read error while hashing", path.string());
  return hex_of(digest, len);
}

void write_file_atomic(const std::filesystem::path& path, const std::string& content) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NIBBLE_CHECK(f.good(), "{}: cannot open for writing ({})", tmp.string(), std::strerror(errno));
    f << content;
    f.flush();
    NIBBLE_CHECK(f.good(), "{}: write failed ({})", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  NIBBLE_CHECK(!ec, "{}: cannot rename from {} ({})", path.string(), tmp.string(), ec.message());
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string utc_now_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace nibble
