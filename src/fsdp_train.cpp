// fsdp_train: the training executable.
//
//   mpirun -np N fsdp_train CONFIG.toml [--set section.key=value ...] [--resume[=auto|=STEP]]
//       [--dry-run]
//   fsdp_train CONFIG.toml --dry-run --world-size N --set mesh.shard_size=S
//   mpirun -np N fsdp_train CONFIG.toml --profile FIRST:LAST
//
// --world-size plans the per-rank memory of an N-rank job from one process (or any number):
// the plan drives the engine on counting communicators, so no N ranks are needed.
// --profile FIRST:LAST is train.profile_steps = [FIRST, LAST] (in command-line order among the --set):
// steps FIRST..LAST are traced into run_dir/profile/rank_N.trace.json (fsdp/core/profiler.hpp).
// The Runtime bootstraps the ranks (MPI_Init_thread). Every rank parses the command line
// and the config; failures are agreed across ranks (collective_guard) so bad input prints
// one line and exits with code 2 on every rank instead of hanging. SIGTERM, SIGINT or
// SIGUSR1 on any rank saves a checkpoint at the next step boundary and exits with code 3
// (docs/checkpoint.md "Signals"); a second SIGTERM / SIGINT ends the process at once.
#include <boost/program_options.hpp>
#include <charconv>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/checkpoint/init_from.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/build_info.hpp"
#include "fsdp/model/model.hpp"  // load_config over the registered families
#include "fsdp/core/error.hpp"
#include "fsdp/train/collective_guard.hpp"
#include "fsdp/train/runtime.hpp"
#include "fsdp/train/signals.hpp"
#include "fsdp/train/trainer.hpp"

namespace po = boost::program_options;

namespace {

struct Cli {
  std::string config_path;
  std::vector<std::string> overrides;
  bool resume_must = false;  // --resume
  bool resume_auto = false;  // --resume=auto or --resume auto
  std::string resume_from;   // --resume=STEP: a step number or step directory ("" = latest)
  bool dry_run = false, help = false, version = false, list_keys = false;
  std::string model_from;  // --model-from DIR ("" = not given)
  int world_size = 0;  // --world-size: 0 = the ranks running
  std::string profile;  // --profile FIRST:LAST ("" = not given)
  std::string usage;
};

// Whether the command line holds OPTION, alone or as OPTION=VALUE.
bool argv_has(int argc, char** argv, const std::string& option) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == option || a.rfind(option + "=", 0) == 0) return true;
  }
  return false;
}

// --profile FIRST:LAST as the override "train.profile_steps=[FIRST, LAST]"; InputError naming
// --profile unless both are integers with 1 <= FIRST <= LAST.
std::string profile_override(const std::string& text) {
  const auto colon = text.find(':');
  auto number = [&](const std::string& s, int64_t* out) {
    const char* end = s.data() + s.size();
    const auto [ptr, ec] = std::from_chars(s.data(), end, *out);
    return !s.empty() && ec == std::errc() && ptr == end;
  };
  int64_t first = 0, last = 0;
  if (colon == std::string::npos || !number(text.substr(0, colon), &first) ||
      !number(text.substr(colon + 1), &last)) {
    throw fsdp::InputError("--profile " + (text.empty() ? "\"\"" : text) +
                           ": expected FIRST:LAST, two step numbers (e.g. 10:12)");
  }
  if (const std::string why = fsdp::profile_steps_error(first, last); !why.empty()) {
    throw fsdp::InputError("--profile " + text + ": " + why);
  }
  return "train.profile_steps=[" + std::to_string(first) + ", " + std::to_string(last) + "]";
}

// The command line; InputError (one line naming the option) on bad usage.
Cli parse_cli(int argc, char** argv) {
  Cli cli;
  po::options_description visible(
      "Usage: mpirun -np N fsdp_train CONFIG.toml [options]\n"
      "Trains a transformer with Fully Sharded Data Parallel. Keys: docs/config.md.\nOptions");
  visible.add_options()
      ("help,h", po::bool_switch(&cli.help), "print this help and exit")
      ("version", po::bool_switch(&cli.version), "print the version and exit")
      ("list-keys", po::bool_switch(&cli.list_keys),
       "print every config key (type, default, PyTorch/HF name, one line of doc) and exit")
      ("model-from", po::value(&cli.model_from)->value_name("DIR"),
       "print the [model] section that fine-tunes from the Hugging Face model directory DIR "
       "(its config.json as fsdp_train's keys, init_from = DIR) and exit")
      ("set,s", po::value(&cli.overrides)->composing(),
       "override a config key: --set section.key=value (repeatable)")
      ("resume", po::bool_switch(&cli.resume_must),
       "continue from train.run_dir/checkpoints/latest (a checkpoint must exist); "
       "--resume=auto (or --resume auto): resume if there is a checkpoint, else start fresh "
       "(one command line for a job's first run and its requeues); --resume=STEP: continue "
       "from an earlier checkpoint of the run, a step number or step directory (latest then "
       "names it)")
      ("dry-run", po::bool_switch(&cli.dry_run),
       "validate, build the mesh and FSDP units, print the per-rank memory plan, and exit")
      ("profile", po::value(&cli.profile)->value_name("FIRST:LAST"),
       "trace steps FIRST..LAST (1-based, inclusive) into train.run_dir/profile/"
       "rank_N.trace.json (Chrome trace: Perfetto, chrome://tracing; tools/profile_summary.py); "
       "the same as --set train.profile_steps=[FIRST,LAST]")
      ("world-size", po::value(&cli.world_size)->value_name("N"),
       "with --dry-run: plan for N ranks instead of the ranks running (needs mesh.shard_size "
       "> 0, the ranks per node, dividing N)");
  po::options_description hidden;
  hidden.add_options()("config", po::value(&cli.config_path), "config file")
      ("resume-auto", po::bool_switch(&cli.resume_auto), "--resume=auto");
  // --resume=auto and `--resume auto` become the hidden switch --resume-auto (an option with an
  // implicit value would take a following CONFIG.toml as its value); --resume=OTHER is an error.
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume=auto" || (a == "--resume" && i + 1 < argc && std::string(argv[i + 1]) == "auto")) {
      args.push_back("--resume-auto");
      if (a == "--resume") ++i;
    } else if (a.rfind("--resume=", 0) == 0) {  // --resume=STEP
      cli.resume_from = a.substr(std::string("--resume=").size());
      if (cli.resume_from.empty()) {
        throw fsdp::InputError("command line: --resume=: expected auto, a step number or a step "
                               "directory (see --help)");
      }
      args.push_back("--resume");
    } else {
      args.push_back(a);
    }
  }
  po::options_description all;
  all.add(visible).add(hidden);
  po::positional_options_description pos;
  pos.add("config", 1);
  std::ostringstream usage;
  usage << visible;
  cli.usage = usage.str();
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw fsdp::InputError(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (cli.resume_must && cli.resume_auto) {
    throw fsdp::InputError("command line: --resume and --resume=auto are exclusive (see --help)");
  }
  if (argv_has(argc, argv, "--model-from") && cli.model_from.empty()) {
    throw fsdp::InputError("--model-from: expected a Hugging Face model directory (see --help)");
  }
  if (!cli.help && !cli.version && !cli.list_keys && cli.model_from.empty() &&
      cli.config_path.empty()) {
    throw fsdp::InputError("command line: missing CONFIG.toml (see --help)");
  }
  if (cli.world_size < 0 || (cli.world_size == 0 && argv_has(argc, argv, "--world-size"))) {
    throw fsdp::InputError("--world-size: " + std::to_string(cli.world_size) +
                           " (expected >= 1)");
  }
  if (!cli.profile.empty() || argv_has(argc, argv, "--profile")) {
    // --profile takes its place among the --set overrides by command-line order, so the later
    // of `--profile F:L` and `--set train.profile_steps=...` wins, as between two --set.
    std::size_t sets_before = 0, sets = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--set" || a == "-s" || a.rfind("--set=", 0) == 0 ||
          (a.rfind("-s", 0) == 0 && a.size() > 2 && a[1] != '-')) {
        ++sets;
      } else if (a == "--profile" || a.rfind("--profile=", 0) == 0) {
        sets_before = sets;
      }
    }
    sets_before = std::min(sets_before, cli.overrides.size());
    cli.overrides.insert(cli.overrides.begin() + static_cast<std::ptrdiff_t>(sets_before),
                         profile_override(cli.profile));
  }
  return cli;
}

// --list-keys: the key table (fsdp::describe_keys) for every model family, the sections
// outside [model] once.
std::string key_list() {
  std::ostringstream os;
  auto print = [&](const fsdp::KeyDescription& k) {
    os << k.key << " = " << k.default_value << "  (" << k.type
       << (k.resume_may_change ? "; --resume may change it" : "") << ")\n    " << k.doc;
    if (!k.peer.empty()) os << "  [" << k.peer << "]";
    os << "\n";
  };
  const fsdp::ModelSchemas& families = fsdp::model_schemas();
  for (const fsdp::ModelSchema* family : families) {
    const bool first = family == families.front();
    os << (first ? "" : "\n") << "# model.type = \"" << family->type() << "\" ("
       << family->hf_config_class() << ")" << (first ? "" : ": its [model] keys") << "\n";
    for (const fsdp::KeyDescription& k : fsdp::describe_keys(*family)) {
      if (first || k.family_key) print(k);
    }
  }
  return os.str();
}

// --model-from DIR: the [model] section of a config for DIR's Hugging Face model
// (fsdp::ckpt::hf_model_config), as to_toml prints it, under a comment naming its source.
std::string model_section(const std::string& dir) {
  fsdp::Config c;
  c.model = fsdp::ckpt::hf_model_config(dir);
  const std::string toml = fsdp::to_toml(c);
  const std::size_t begin = toml.find("[model]\n");
  const std::size_t end = toml.find("\n[", begin);
  return "# " + dir + "/config.json (fsdp_train --model-from); the other sections: docs/config.md\n" +
         toml.substr(begin, end == std::string::npos ? end : end + 1 - begin);
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<fsdp::Runtime> runtime;
  try {
    runtime = std::make_unique<fsdp::Runtime>(&argc, &argv);
  } catch (const std::exception& e) {
    fsdp::write_line(2, std::string("fsdp_train: ") + e.what());
    return fsdp::kExitRuntimeError;
  }
  const int rank = runtime->rank();
  int code = 0;
  // SIGTERM / SIGINT / SIGUSR1: checkpoint at the next step boundary, exit with code 3.
  std::optional<fsdp::SignalGuard> signals;
  try {
    signals.emplace();
  } catch (const std::exception& e) {
    fsdp::write_line(2, "fsdp_train: rank " + std::to_string(rank) + ": " + e.what());
    runtime->abort(fsdp::kExitRuntimeError);
  }
  try {
    fsdp::Communicator& world = runtime->world();
    Cli cli;
    fsdp::Config config;
    std::string model_text;  // --model-from's output
    fsdp::collective_guard(world, [&] {
      cli = parse_cli(argc, argv);
      if (!cli.model_from.empty()) {
        model_text = model_section(cli.model_from);
      } else if (!cli.help && !cli.version && !cli.list_keys) {
        config = fsdp::load_config(cli.config_path, cli.overrides);
      }
    });
    if (cli.help || cli.version || cli.list_keys || !cli.model_from.empty()) {
      if (rank == 0) {
        std::cout << (cli.help                 ? cli.usage
                      : cli.version            ? std::string("fsdp_train ") + fsdp::build_id() + "\n"
                      : !cli.model_from.empty() ? model_text
                                               : key_list());
      }
    } else {
      fsdp::TrainOptions options;
      options.resume = cli.resume_must;
      options.resume_from = cli.resume_from;
      options.resume_auto = cli.resume_auto;
      options.dry_run = cli.dry_run;
      options.plan_world_size = cli.world_size;
      const fsdp::TrainResult result = fsdp::train(config, *runtime, world, options, std::cout);
      if (result.stop_signal != 0) {
        // The signalled rank's one line (the other ranks' stop_message is empty).
        if (!result.stop_message.empty()) {
          fsdp::write_line(2, "fsdp_train: " + result.stop_message);
        }
        code = fsdp::kExitInterrupted;
      }
    }
  } catch (const fsdp::PeerFailed& e) {
    code = e.exit_code();
  } catch (const fsdp::AgreedFailure& e) {
    fsdp::write_line(2, std::string("fsdp_train: ") + e.what());
    code = e.exit_code();
  } catch (const std::exception& e) {
    // Not agreed with the other ranks: they may wait in a collective, so abort them all.
    const auto* fe = dynamic_cast<const fsdp::Error*>(&e);
    fsdp::write_line(2, "fsdp_train: rank " + std::to_string(rank) + ": " + e.what());
    runtime->abort(fe ? fe->exit_code() : fsdp::kExitRuntimeError);
  }
  runtime.reset();  // MPI_Finalize
  return code;
}
