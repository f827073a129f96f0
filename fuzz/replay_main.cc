// A plain main() for the fuzz targets, so they run under any compiler (the project's g++ build,
// CI without clang): it feeds LLVMFuzzerTestOneInput every file of a seed corpus, then a fixed
// number of inputs mutated from those seeds by a seeded PRNG (bit flips, interesting bytes and
// 32-bit lengths, inserts, erases, copies, splices, dictionary tokens), so every run is the
// same run. A crash or a failed property aborts; the input is then saved to
// "<program>.crash-input" in the working directory for replay under libFuzzer or a debugger.
//
//   protocol_fuzz_replay [--runs N] [--seed S] [--max-len L] [--dict FILE] CORPUS_DIR|FILE...
//   WEIGHTCAST_FUZZ_RUNS=N overrides --runs (to run longer without editing the test).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::string;

// The input being run, for the crash handler (which may only call async-signal-safe functions).
const Bytes* g_current = nullptr;
char g_crash_path[4096] = "fuzz.crash-input";

void on_crash(int sig) {
  if (g_current != nullptr) {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, g_current->data(), g_current->size());
      (void)ignored;
      ::close(fd);
    }
    static const char note[] = "fuzz replay: crashing input saved to ";
    ssize_t ignored = ::write(2, note, sizeof(note) - 1);
    ignored = ::write(2, g_crash_path, std::char_traits<char>::length(g_crash_path));
    ignored = ::write(2, "\n", 1);
    (void)ignored;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// libFuzzer dictionary lines: [name=]"text" with \\, \" and \xNN escapes; '#' starts a comment.
std::vector<Bytes> read_dict(const std::string& path) {
  std::vector<Bytes> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto open = line.find('"');
    const auto close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    Bytes token;
    for (std::size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        if (line[i + 1] == 'x' && i + 3 < close) {
          token.push_back(static_cast<char>(std::stoi(line.substr(i + 2, 2), nullptr, 16)));
          i += 3;
        } else {
          token.push_back(line[++i]);
        }
      } else {
        token.push_back(line[i]);
      }
    }
    out.push_back(token);
  }
  return out;
}

class Mutator {
 public:
  Mutator(std::uint64_t seed, const std::vector<Bytes>& seeds, const std::vector<Bytes>& dict)
      : rng_(seed), seeds_(seeds), dict_(dict) {}

  Bytes mutate(Bytes in, std::size_t max_len) {
    const int ops = 1 + static_cast<int>(below(6));
    for (int i = 0; i < ops; ++i) step(in);
    if (in.size() > max_len) in.resize(max_len);
    return in;
  }

 private:
  std::size_t below(std::size_t n) { return n == 0 ? 0 : rng_() % n; }

  void step(Bytes& b) {
    static const unsigned char kBytes[] = {0x00, 0xff, 0x7f, 0x80, '"', '{', '}',  '[',  ']', '\\',
                                           ',',  ':',  '-',  '0',  '9', 'e', 0xc3, 0xed, 0xf4};
    static const std::uint32_t kU32[] = {0,           1,           4,    0x7fffffffu, 0x80000000u,
                                         0xffffffffu, 0x40000000u, 4096, 1025};
    const std::size_t pos = below(b.size() + 1);
    switch (below(9)) {
      case 0:
        if (!b.empty()) b[pos % b.size()] ^= static_cast<char>(1u << below(8));
        break;
      case 1:
        if (!b.empty()) b[pos % b.size()] = static_cast<char>(rng_());
        break;
      case 2:
        if (!b.empty()) b[pos % b.size()] = static_cast<char>(kBytes[below(sizeof(kBytes))]);
        break;
      case 3:
        for (std::size_t n = 1 + below(8); n > 0; --n)
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<char>(rng_()));
        break;
      case 4:
        if (!b.empty()) b.erase(pos % b.size(), 1 + below(16));
        break;
      case 5:
        if (!b.empty()) {
          const std::size_t from = below(b.size());
          b.insert(pos, b.substr(from, 1 + below(32)));
        }
        break;
      case 6: {
        const std::uint32_t v = kU32[below(std::size(kU32))];
        Bytes le(4, '\0');
        for (int i = 0; i < 4; ++i) le[i] = static_cast<char>((v >> (8 * i)) & 0xffu);
        if (b.size() >= 4 && below(2)) {
          b.replace(pos % (b.size() - 3), 4, le);
        } else {
          b.insert(pos, le);
        }
        break;
      }
      case 7:
        if (!dict_.empty()) b.insert(pos, dict_[below(dict_.size())]);
        break;
      default:
        if (!seeds_.empty()) {
          const Bytes& other = seeds_[below(seeds_.size())];
          b = b.substr(0, pos) + other.substr(below(other.size() + 1));
        }
        break;
    }
  }

  std::mt19937_64 rng_;
  const std::vector<Bytes>& seeds_;
  const std::vector<Bytes>& dict_;
};

void run_one(const Bytes& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  g_current = nullptr;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--runs N] [--seed S] [--max-len L] [--dict FILE] CORPUS_DIR|FILE...\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t runs = 10000;
  std::uint64_t seed = 1;
  std::size_t max_len = 4096;
  std::vector<Bytes> dict;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--runs" && has_value) {
      runs = std::stoull(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      seed = std::stoull(argv[++i]);
    } else if (arg == "--max-len" && has_value) {
      max_len = std::stoull(argv[++i]);
    } else if (arg == "--dict" && has_value) {
      dict = read_dict(argv[++i]);
    } else if (!arg.empty() && arg[0] == '-') {
      return usage(argv[0]);
    } else {
      paths.emplace_back(arg);
    }
  }
  if (const char* env = std::getenv("WEIGHTCAST_FUZZ_RUNS")) runs = std::stoull(env);
  if (paths.empty()) return usage(argv[0]);

  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s.crash-input",
                std::filesystem::path(argv[0]).filename().c_str());
  for (int sig : {SIGABRT, SIGSEGV, SIGFPE, SIGILL, SIGBUS}) std::signal(sig, on_crash);

  std::vector<std::filesystem::path> files;
  for (const auto& p : paths) {
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());  // directory order differs between machines
  std::vector<Bytes> seeds;
  for (const auto& f : files) seeds.push_back(read_file(f));
  if (seeds.empty()) {
    std::fprintf(stderr, "fuzz replay: no seed files found\n");
    return 1;
  }

  std::size_t largest = 0;
  for (const Bytes& s : seeds) {
    run_one(s);
    largest = std::max(largest, s.size());
  }
  Mutator mutator(seed, seeds, dict);
  Bytes input;
  for (std::uint64_t i = 0; i < runs; ++i) {
    // Mutations stack for a few rounds, then start again from the next seed, so inputs drift
    // far from the seeds without losing their structure altogether.
    input = mutator.mutate(i % 8 == 0 ? seeds[(i / 8) % seeds.size()] : input, max_len);
    largest = std::max(largest, input.size());
    run_one(input);
  }
  std::printf("fuzz replay: %zu seeds, %llu mutated inputs (seed %llu), largest %zu bytes: ok\n",
              seeds.size(), static_cast<unsigned long long>(runs),
              static_cast<unsigned long long>(seed), largest);
  return 0;
}
