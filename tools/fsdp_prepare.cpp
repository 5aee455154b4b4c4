// fsdp_prepare: turns text files into an HDF5 token file for fsdp_train (docs/data.md).
//
//   fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...
//   fsdp_prepare --tokenizer MODEL -o OUT.h5 [--add-bos|--no-add-bos] [--add-eos|--no-add-eos]
//                [--bos-token T] [--eos-token T] [--document file|line|jsonl [--text-key K]]
//                [--num-threads N]
//                [--val-fraction F] INPUT...
//   fsdp_prepare --token-file FILE... --vocab-size N -o OUT.h5 [--val-token-file FILE...]
//                [--token-format auto|llm.c|nanogpt] [--val-fraction F]
//   fsdp_prepare --pairs FILE.tsv [-o] OUT.h5 [--val-fraction F]
//   fsdp_prepare --pairs FILE.jsonl --tokenizer MODEL [-o] OUT.h5 [--add-bos|--no-add-bos]
//                [--add-eos|--no-add-eos] [--bos-token T] [--eos-token T] [--val-fraction F]
//
// Text mode: INPUTs are files or folders (searched recursively; symlinks and *.dat skipped;
// FIFOs, sockets and devices inside folders skipped with a warning, named directly refused).
// The output must not be an input nor lie inside an input folder.
// Their bytes, concatenated in sorted path order, are the tokens (vocab 256, tokenizer
// "bytes"); the last F (default 0.05) of them are the validation split.
// Pairs mode (seq2seq): one `input<TAB>target` per line; bytes -> ByT5 ids b + 3, eos 1
// appended to both; the last F of the pairs are the validation split. With --tokenizer:
// {"prompt", "completion"} JSON Lines (TRL's prompt-completion format), the prompt after BOS,
// the completion before EOS, for data.objective = "sft".
// --tokenizer: the same inputs encoded with a SentencePiece model or a Hugging Face byte-level
// BPE tokenizer.json (GPT-2, Llama 3), each document (a file, or with --document line a line)
// between the tokenizer's BOS and EOS where it has them.
// --token-file: ids tokenized by llm.c (header magic 20240520 / 20240801) or nanoGPT (raw
// uint16), imported as they are; --vocab-size is required and every id is checked.
// Exit code 2 on bad input.
// Progress: when stderr is a terminal, one status line on stderr rewritten in place (input
// bytes read of the total, MiB/s, ETA; fsdp/core/progress.hpp), ended before the summary;
// nothing extra when stderr is not a terminal.
#include <boost/program_options.hpp>

#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/progress.hpp"
#include "fsdp/data/prepare.hpp"

namespace po = boost::program_options;

namespace {

// A pair of switches --NAME / --no-NAME: unset if neither was given, an error if both were.
std::optional<bool> switch_pair(const po::variables_map& vm, const std::string& name) {
  const bool on = vm.count(name) > 0, off = vm.count("no-" + name) > 0;
  if (on && off) throw fsdp::InputError("--" + name + " and --no-" + name + ": both given (expected one of them)");
  if (on) return true;
  if (off) return false;
  return std::nullopt;
}

// Refuses the options of other modes: `mode` names the one in use.
void refuse_options(const po::variables_map& vm, const std::string& mode, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (vm.count(n) && !vm[n].defaulted()) {
      throw fsdp::InputError(std::string("--") + n + ": not used " + mode + " (see --help)");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // SIGTERM / SIGINT / SIGHUP: the output's temporaries are removed, the final files kept.
  fsdp::remove_temporaries_on_signal();
  std::string out;
  double val_fraction = 0.05;
  std::string pairs, tokenizer, document = "file", token_format = "auto", bos_token, eos_token;
  std::string text_key = "text";
  std::vector<std::string> inputs, token_files, val_token_files;
  int64_t vocab_size = 0;
  int num_threads = 0;
  po::options_description opts(
      "fsdp_prepare -o OUT.h5 [--val-fraction F] INPUT...                     (bytes)\n"
      "fsdp_prepare --tokenizer MODEL -o OUT.h5 [--add-bos|--no-add-bos] [--add-eos|--no-add-eos]\n"
      "             [--bos-token T] [--eos-token T] [--document file|line|jsonl] [--text-key K]\n"
      "             [--num-threads N]\n"
      "             [--val-fraction F] INPUT...\n"
      "                                           (SentencePiece .model, or byte-level BPE tokenizer.json)\n"
      "fsdp_prepare --token-file FILE... --vocab-size N -o OUT.h5 [--val-token-file FILE...]\n"
      "             [--token-format auto|llm.c|nanogpt] [--val-fraction F]     (llm.c / nanoGPT ids)\n"
      "fsdp_prepare --pairs FILE.tsv [-o] OUT.h5 [--val-fraction F]            (seq2seq, ByT5 ids)\noptions");
  opts.add_options()
      ("help,h", "print this help")
      ("output,o", po::value(&out), "output HDF5 token file (written atomically via OUT.tmp)")
      ("pairs", po::value(&pairs),
       "seq2seq pairs: a TSV of input<TAB>target lines (ByT5 ids, eos appended); with --tokenizer, "
       "JSON Lines of {\"prompt\", \"completion\"} for data.objective = \"sft\" (docs/data.md)")
      ("val-fraction", po::value(&val_fraction)->default_value(0.05, "0.05"),
       "fraction of the tokens (with --pairs: of the pairs), taken from the end, used for validation, in (0, 1)")
      ("tokenizer", po::value(&tokenizer),
       "encode the INPUTs with a SentencePiece model (tokenizer.model of Llama 2, Mistral, T5; or spm_train's), "
       "a Hugging Face byte-level BPE tokenizer.json (GPT-2, Llama 3), or the one in a model folder; "
       "vocab_size = its largest id + 1")
      ("add-bos", "--tokenizer: put the model's BOS before each document (default: if the model has one)")
      ("no-add-bos", "--tokenizer: no BOS")
      ("add-eos", "--tokenizer: put the model's EOS after each document (default: if the model has one and "
                  "it is not the BOS added)")
      ("no-add-eos", "--tokenizer: no EOS")
      ("bos-token", po::value(&bos_token),
       "--tokenizer tokenizer.json: the BOS token's text, e.g. '<|endoftext|>' (default: tokenizer_config.json's "
       "bos_token beside it, else the post_processor's)")
      ("eos-token", po::value(&eos_token), "--tokenizer tokenizer.json: the EOS token's text (default as BOS)")
      ("num-threads", po::value(&num_threads)->default_value(0),
       "--tokenizer: encoding threads (default 0: every CPU this process may run on); the output is "
       "the same for any number")
      ("document", po::value(&document)->default_value("file"),
       "--tokenizer: what one document is: file (a whole input file), line (each line; empty ones skipped) "
       "or jsonl (each line a JSON object: its --text-key string)")
      ("text-key", po::value(&text_key)->default_value("text"),
       "--document jsonl: the field holding each record's text")
      ("token-file", po::value(&token_files)->multitoken()->composing(),
       "token ids from llm.c (header magic 20240520 uint16 / 20240801 uint32) or nanoGPT (raw uint16 .bin), "
       "imported as they are; several files are concatenated in the order given")
      ("val-token-file", po::value(&val_token_files)->multitoken()->composing(),
       "--token-file: files for the validation split (instead of --val-fraction)")
      ("vocab-size", po::value(&vocab_size),
       "--token-file: the tokenizer's vocabulary size (required; every id must be below it), e.g. 50257 (GPT-2), "
       "128256 (Llama 3)")
      ("token-format", po::value(&token_format)->default_value("auto"),
       "--token-file: auto (llm.c if the file starts with its magic, else nanoGPT), llm.c or nanogpt");
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
                           "(FIFOs, sockets, devices) are skipped.\n"
                   "       gzip, zstd and xz files (*.gz, *.jsonl.zst, *.xz; told by their first bytes) are read "
                   "decompressed, also with --pairs.\n";
      return 0;
    }
    po::notify(vm);
    // --pairs with --tokenizer: prompt-completion JSON Lines for data.objective = "sft".
    const bool sft_pairs = vm.count("pairs") && vm.count("tokenizer");
    const int modes = (vm.count("pairs") ? 1 : 0) + (vm.count("tokenizer") ? 1 : 0) +
                      (vm.count("token-file") ? 1 : 0) - (sft_pairs ? 1 : 0);
    if (modes > 1) {
      throw fsdp::InputError("--pairs, --tokenizer and --token-file: more than one given (expected one mode)");
    }
    const auto sp_only = {"add-bos",  "no-add-bos", "add-eos",  "no-add-eos",
                          "document", "bos-token",  "eos-token", "num-threads", "text-key"};
    const auto tf_only = {"val-token-file", "vocab-size", "token-format"};
    if (!vm.count("tokenizer")) refuse_options(vm, "without --tokenizer", sp_only);
    if (!vm.count("token-file")) refuse_options(vm, "without --token-file", tf_only);
    if (vm.count("token-file")) {
      if (!inputs.empty()) {
        throw fsdp::InputError("--token-file: unexpected argument " + fsdp::printable(inputs.front()) +
                               " (expected token files after --token-file, and -o OUT.h5)");
      }
      if (out.empty()) throw fsdp::InputError("-o/--output: missing (expected the output .h5 path)");
      if (!val_token_files.empty() && !vm["val-fraction"].defaulted()) {
        throw fsdp::InputError("--val-fraction: not used with --val-token-file (the validation split is those files)");
      }
      fsdp::data::TokenFileOptions o;
      o.files = token_files;
      o.val_files = val_token_files;
      o.vocab_size = vocab_size;
      o.format = fsdp::data::parse_token_file_format(token_format);
      if (vm.count("vocab-size") && vocab_size == 0) {
        throw fsdp::InputError("--vocab-size: 0 (expected the tokenizer's vocabulary size, 1 .. 2^31-1)");
      }
      auto progress = fsdp::ProgressMeter::on_terminal({.label = "fsdp_prepare"});
      const auto s = fsdp::data::prepare_token_file_dataset(o, out, val_fraction, &progress);
      progress.finish();
      std::string files = std::to_string(s.train_files) + (s.train_files == 1 ? " file" : " files");
      if (s.val_files > 0) files += " + " + std::to_string(s.val_files) + " val" + (s.val_files == 1 ? " file" : " files");
      std::printf("fsdp_prepare: %s: %s, %lld train tokens, %lld val tokens (vocab %lld, %s)\n", out.c_str(),
                  files.c_str(), static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens),
                  static_cast<long long>(s.vocab_size), s.format.c_str());
      return 0;
    }
    if (vm.count("pairs")) {
      // OUT may be given as -o OUT or as the one positional argument.
      const std::string usage =
          sft_pairs ? "--pairs FILE.jsonl --tokenizer MODEL OUT.h5" : "--pairs FILE.tsv OUT.h5";
      if (out.empty() && inputs.size() == 1) {
        out = inputs.front();
        inputs.clear();
      }
      if (out.empty()) throw fsdp::InputError("--pairs: missing output (expected " + usage + ")");
      if (!inputs.empty()) {
        throw fsdp::InputError("--pairs: unexpected argument " + fsdp::printable(inputs.front()) +
                               " (expected " + usage + ", one pairs file)");
      }
    }
    if (sft_pairs) {
      refuse_options(vm, "with --pairs", {"document", "text-key", "num-threads"});
      fsdp::data::TokenizerOptions o;
      o.model = tokenizer;
      o.specials = {bos_token, eos_token};
      o.add_bos = switch_pair(vm, "add-bos");
      o.add_eos = switch_pair(vm, "add-eos");
      const auto s = fsdp::data::prepare_tokenized_pairs(pairs, out, val_fraction, o);
      if (!s.tokenizer_note.empty()) {
        std::fprintf(stderr, "fsdp_prepare: warning: %s\n", s.tokenizer_note.c_str());
      }
      std::string specials;
      if (s.bos_id >= 0) specials = "bos " + std::to_string(s.bos_id) + " before each prompt";
      if (s.eos_id >= 0) {
        specials += (specials.empty() ? "" : ", ") + std::string("eos ") + std::to_string(s.eos_id) +
                    " after each completion";
      }
      if (specials.empty()) specials = "no bos/eos";
      std::printf("fsdp_prepare: %s: %lld pairs (%lld train, %lld val), %lld prompt tokens, %lld completion "
                  "tokens, prompt len max %lld mean %.1f, completion len max %lld mean %.1f (vocab %lld, %s, %s; "
                  "data.objective = \"sft\")\n",
                  out.c_str(), static_cast<long long>(s.pairs.train_examples + s.pairs.val_examples),
                  static_cast<long long>(s.pairs.train_examples), static_cast<long long>(s.pairs.val_examples),
                  static_cast<long long>(s.pairs.input_tokens), static_cast<long long>(s.pairs.target_tokens),
                  static_cast<long long>(s.pairs.max_input_len), s.pairs.mean_input_len,
                  static_cast<long long>(s.pairs.max_target_len), s.pairs.mean_target_len,
                  static_cast<long long>(s.vocab_size), s.kind.c_str(), specials.c_str());
      return 0;
    }
    if (vm.count("pairs")) {
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
    if (vm.count("tokenizer")) {
      fsdp::data::TokenizerOptions o;
      o.model = tokenizer;
      o.specials = {bos_token, eos_token};
      if (num_threads < 0) {
        throw fsdp::InputError("--num-threads: " + std::to_string(num_threads) +
                               " (expected 0, every CPU, or a count >= 1)");
      }
      o.num_threads = num_threads;
      o.add_bos = switch_pair(vm, "add-bos");
      o.add_eos = switch_pair(vm, "add-eos");
      o.document = {fsdp::data::parse_document_unit(document), text_key};
      if (vm.count("text-key") && !vm["text-key"].defaulted() &&
          o.document.unit != fsdp::data::DocumentUnit::jsonl) {
        throw fsdp::InputError("--text-key: only with --document jsonl");
      }
      auto progress = fsdp::ProgressMeter::on_terminal({.label = "fsdp_prepare"});
      const auto s = fsdp::data::prepare_tokenized_dataset(inputs, out, val_fraction, o, &progress);
      progress.finish();
      if (!s.tokenizer_note.empty()) {
        std::fprintf(stderr, "fsdp_prepare: warning: %s\n", s.tokenizer_note.c_str());
      }
      for (const auto& skipped : s.skipped) {
        std::fprintf(stderr, "fsdp_prepare: warning: skipped %s: only regular files are read\n", skipped.c_str());
      }
      std::string specials;
      if (s.bos_id >= 0) specials = "bos " + std::to_string(s.bos_id);
      if (s.eos_id >= 0) specials += (specials.empty() ? "" : " + ") + std::string("eos ") + std::to_string(s.eos_id);
      specials = specials.empty() ? "no bos/eos" : specials + " per document";
      std::printf("fsdp_prepare: %s: %lld files, %lld documents, %lld train tokens, %lld val tokens "
                  "(vocab %lld, %s %s, %s)\n",
                  out.c_str(), static_cast<long long>(s.files), static_cast<long long>(s.documents),
                  static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens),
                  static_cast<long long>(s.vocab_size), s.kind.c_str(), fsdp::printable(tokenizer).c_str(),
                  specials.c_str());
      return 0;
    }
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
