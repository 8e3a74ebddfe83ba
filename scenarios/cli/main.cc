// dsv41: the command-line tool. Parses with CLI11 and dispatches to one verb (scenarios/cli/cli.h);
// the only place that turns errors into exit codes (docs/cli.md).
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/data_dir.h"
#include "base/error.h"
#include "base/terminal_text.h"
#include "scenarios/cli/cli.h"

namespace {

std::string version_text() {
  std::string data;
  try {
    data = dsv41::data::root();
  } catch (const dsv41::Error&) {
    data = "not found (set DSV41_DATA_DIR; docs/install.md)";
  }
  return std::string("dsv41 ") + DSV41_VERSION + " (git " + DSV41_GIT_COMMIT + ")\nbuilt-in data: " + data;
}

// Names the first word that should be a verb (of dsv41, or of a verb with sub-verbs such as
// `report`) but is none, with the verbs it could be; empty when every such word is a verb.
// CLI11 alone would say only "A subcommand is required".
std::string unknown_verb(const CLI::App& root, int argc, char** argv) {
  const CLI::App* app = &root;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return {};
    if (!word.empty() && word[0] == '-') continue;  // the options here are all flags
    const std::vector<const CLI::App*> subs = app->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return {};
    std::string names;
    for (const CLI::App* sub : subs) {
      if (sub->check_name(word)) {
        app = sub;
        names.clear();
        break;
      }
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!names.empty()) {
      const std::string of = app == &root ? "" : " of '" + app->get_name() + "'";
      return "unknown verb '" + word + "'" + of + "; verbs: " + names;
    }
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dsv41::scenarios;
  CLI::App app{"dsv41: bit-exact reference and conformance simulator for DeepSeek-V4.1-Flash",
               "dsv41"};
  // Set before the verbs are added: subcommands copy the parent's failure message.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "dsv41: error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  app.set_version_flag("--version", version_text(), "print the version and git commit, then exit");
  bool debug = false;
  app.add_flag("--debug", debug,
               "on an error, also print where it was detected (source file, line and check)");
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // every verb's --help shows its options' defaults
  const std::vector<dsv41::scenarios::cli::Verb> verbs = {dsv41::scenarios::cli::add_bytes_verb(app), dsv41::scenarios::cli::add_selfcheck_verb(app),
                                   dsv41::scenarios::cli::add_forward_verb(app), dsv41::scenarios::cli::add_weights_verb(app),
                                   dsv41::scenarios::cli::add_replay_study_verb(app), dsv41::scenarios::cli::add_run_verb(app),
                                   dsv41::scenarios::cli::add_report_verb(app), dsv41::scenarios::cli::add_agree_verb(app),
                                   dsv41::scenarios::cli::add_conform_verb(app), dsv41::scenarios::cli::add_selftest_verb(app),
                                   dsv41::scenarios::cli::add_exact_verb(app), dsv41::scenarios::cli::add_vectors_verb(app),
                                   dsv41::scenarios::cli::add_sweep_verb(app), dsv41::scenarios::cli::add_layer_config_verb(app),
                                   dsv41::scenarios::cli::add_import_official_verb(app)};

  dsv41::scenarios::cli::add_help_footers(app);
  if (const std::string unknown = unknown_verb(app, argc, argv); !unknown.empty()) {
    std::cerr << "dsv41: error: " << unknown << "\nRun with --help for more information.\n";
    return dsv41::scenarios::runner::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0; app.exit prints them.
    return app.exit(e) == 0 ? dsv41::scenarios::runner::kExitOk : dsv41::scenarios::runner::kExitBadInput;
  }
  try {
    for (const dsv41::scenarios::cli::Verb& v : verbs) {
      if (v.app->parsed()) return v.run();
    }
  } catch (const dsv41::Error& e) {
    std::cerr << "dsv41: error: " << dsv41::terminal_safe(e.what()) << "\n";  // names are anyone's
    if (debug) {
      const std::string& origin = e.origin().empty() ? dsv41::Error::last_origin() : e.origin();
      std::cerr << "dsv41: debug: " << (origin.empty() ? "raised with DSV41_FAIL (no check)" : origin) << "\n";
    }
    return dsv41::scenarios::runner::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "dsv41: error: unexpected failure: " << dsv41::terminal_safe(e.what()) << "\n";
    return dsv41::scenarios::runner::kExitBadInput;
  }
  return dsv41::scenarios::runner::kExitBadInput;  // unreachable: require_subcommand(1)
}
