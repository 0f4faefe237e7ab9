// nibble: quantize LLM checkpoints, measure what was lost, run the result.
#include <cstdio>
#include <filesystem>
#include <string>

#include "commands.h"
#include "nibble/error.h"
#include "nibble/util.h"

namespace nibble::cli {

void require_output_dir(const char* flag, const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  NIBBLE_CHECK(dir.empty() || std::filesystem::is_directory(dir), "{} {}: directory {} does not exist", flag, path,
               dir.string());
}

namespace {
CLI::Validator number_above(bool strict, const char* name) {
  return CLI::Validator(
      [strict](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "must be a number, found " + s;
        if (strict ? v > 0 : v >= 0) return {};
        return std::string(strict ? "must be > 0" : "must be >= 0") + ", found " + s;
      },
      name);
}
}  // namespace

CLI::Validator nonnegative() { return number_above(false, "NONNEGATIVE"); }
CLI::Validator positive() { return number_above(true, "POSITIVE"); }

}  // namespace nibble::cli

int main(int argc, char** argv) {
  nibble::select_blas_kernels(argv);
  using namespace nibble::cli;
  CLI::App app{"nibble " NIBBLE_VERSION ": LLM weight quantization (int4 g128 and friends), measured.\n"};
  app.set_version_flag("--version", std::string("nibble ") + NIBBLE_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // global flags such as --quiet may follow the verb
  GlobalOptions global;
  for (int i = 0; i < argc; ++i) {
    std::string a = i == 0 ? "nibble" : argv[i];
    if (a.empty() || a.find_first_of(" \t'\"$*?[]()|&;<>\\") != std::string::npos) {
      std::string q = "'";
      for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      a = q + "'";
    }
    global.command_line += (i ? " " : "") + a;
  }
  app.add_flag("-q,--quiet", global.quiet, "No progress bars or info lines on stderr");

  for (Registrar r : {register_quantize, register_inspect, register_dequantize, register_run, register_ppl,
                      register_layer, register_probe, register_synth, register_eval,
                      register_gsm8k, register_flips}) r(app, global);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const nibble::Error& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
