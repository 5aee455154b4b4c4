// fsdp_prepare: turns text files into an HDF5 token file for fsdp_train (docs/data.md).
//
//   fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...
//   fsdp_prepare --pairs FILE.tsv [-o] OUT.h5 [--val-fraction F]
//
// Text mode: INPUTs are files or folders (searched recursively; symlinks and *.dat skipped;
// FIFOs, sockets and devices inside folders skipped with a warning, named directly refused).
// The output must not be an input nor lie inside an input folder.
// Their bytes, concatenated in sorted path order, are the tokens (vocab 256, tokenizer
// "bytes"); the last F (default 0.05) of them are the validation split.
// Pairs mode (seq2seq): one `input<TAB>target` per line; bytes -> ByT5 ids b + 3, eos 1
// appended to both; the last F of the pairs are the validation split.
// Exit code 2 on bad input.
// Progress: when stderr is a terminal, one status line on stderr rewritten in place (input
// bytes read of the total, MiB/s, ETA; fsdp/core/progress.hpp), ended before the summary;
// nothing extra when stderr is not a terminal.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/data/prepare.hpp"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  std::string out;
  double val_fraction = 0.05;
  std::string pairs;
  std::vector<std::string> inputs;
  po::options_description opts(
      "fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...\n"
      "fsdp_prepare --pairs FILE.tsv [-o] OUT.h5 [--val-fraction F]\noptions");
  opts.add_options()
      ("help,h", "print this help")
      ("output,o", po::value(&out), "output HDF5 token file (written atomically via OUT.tmp)")
      ("pairs", po::value(&pairs),
       "seq2seq pairs: a TSV of input<TAB>target lines (ByT5 ids, eos appended; docs/data.md)")
      ("val-fraction", po::value(&val_fraction)->default_value(0.05),
       "fraction of the bytes (with --pairs: of the pairs), taken from the end, used for validation, in (0, 1)");
  po::options_description hidden;
  hidden.add_options()("input", po::value(&inputs), "input files or folders");
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("input", -1);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << opts << "\nINPUT: files or folders (recursive); symlinks, *.dat and non-regular files "
                           "(FIFOs, sockets, devices) are skipped.\n";
      return 0;
    }
    po::notify(vm);
    if (vm.count("pairs")) {
      // OUT may be given as -o OUT or as the one positional argument.
      if (out.empty() && inputs.size() == 1) {
        out = inputs.front();
        inputs.clear();
      }
      if (out.empty()) throw fsdp::InputError("--pairs: missing output (expected --pairs FILE.tsv OUT.h5)");
      if (!inputs.empty()) {
        throw fsdp::InputError("--pairs: unexpected argument " + inputs.front() +
                               " (expected --pairs FILE.tsv OUT.h5, one pairs file)");
      }
      auto progress = fsdp::ProgressMeter::on_terminal({.label = "fsdp_prepare"});
      const auto s = fsdp::data::prepare_pairs_dataset(pairs, out, val_fraction, &progress);
      progress.finish();
      std::printf("fsdp_prepare: %s: %lld pairs (%lld train, %lld val), %lld input tokens, %lld target tokens, "
                  "input len max %lld mean %.1f, target len max %lld mean %.1f (ByT5 ids, eos included)\n",
                  out.c_str(), static_cast<long long>(s.train_examples + s.val_examples),
                  static_cast<long long>(s.train_examples), static_cast<long long>(s.val_examples),
                  static_cast<long long>(s.input_tokens), static_cast<long long>(s.target_tokens),
                  static_cast<long long>(s.max_input_len), s.mean_input_len,
                  static_cast<long long>(s.max_target_len), s.mean_target_len);
      return 0;
    }
    if (out.empty()) throw fsdp::InputError("-o/--output: missing (expected the output .h5 path)");
    if (inputs.empty()) throw fsdp::InputError("INPUT: none given (expected files or folders of text)");
    // Declared in the try block: on an error its destructor ends the line before the catch
    // prints the message.
    auto progress = fsdp::ProgressMeter::on_terminal({.label = "fsdp_prepare"});
    const auto s = fsdp::data::prepare_byte_dataset(inputs, out, val_fraction, &progress);
    progress.finish();
    for (const auto& skipped : s.skipped) {
      std::fprintf(stderr, "fsdp_prepare: warning: skipped %s: only regular files are read\n", skipped.c_str());
    }
    std::printf("fsdp_prepare: %s: %lld files, %lld train tokens, %lld val tokens (vocab 256, bytes)\n",
                out.c_str(), static_cast<long long>(s.files), static_cast<long long>(s.train_tokens),
                static_cast<long long>(s.val_tokens));
    return 0;
  } catch (const po::error& e) {
    std::fprintf(stderr, "fsdp_prepare: %s (see --help)\n", e.what());
    return fsdp::kExitInputError;
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "fsdp_prepare: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_prepare: %s\n", e.what());
    return fsdp::kExitRuntimeError;
  }
}
