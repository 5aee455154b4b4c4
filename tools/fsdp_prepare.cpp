// fsdp_prepare: turns text files into an HDF5 token file for fsdp_train (docs/data.md).
//
//   fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...
//
// INPUTs are files or folders (searched recursively; symlinks and *.dat skipped). Their
// bytes, concatenated in sorted path order, are the tokens (vocab 256, tokenizer "bytes");
// the last F (default 0.05) of them are the validation split. Exit code 2 on bad input.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/data/prepare.hpp"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  std::string out;
  double val_fraction = 0.05;
  std::vector<std::string> inputs;
  po::options_description opts("fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...\noptions");
  opts.add_options()
      ("help,h", "print this help")
      ("output,o", po::value(&out), "output HDF5 token file (written atomically via OUT.tmp)")
      ("val-fraction", po::value(&val_fraction)->default_value(0.05),
       "fraction of the bytes (taken from the end) used for /val/tokens, in (0, 1)");
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
      std::cout << opts << "\nINPUT: files or folders (recursive); symlinks and *.dat are skipped.\n";
      return 0;
    }
    po::notify(vm);
    if (out.empty()) throw fsdp::InputError("-o/--output: missing (expected the output .h5 path)");
    if (inputs.empty()) throw fsdp::InputError("INPUT: none given (expected files or folders of text)");
    const auto s = fsdp::data::prepare_byte_dataset(inputs, out, val_fraction);
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
