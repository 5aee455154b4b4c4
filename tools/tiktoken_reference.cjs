#!/usr/bin/env node
// tools/tiktoken_reference.cjs: OpenAI's tiktoken vocabularies (the npm package js-tiktoken,
// a port of tiktoken with its rank files) as a reference for fsdp_prepare's tokenizer.json
// reader (src/data/bpe_tokenizer.cpp). tests/cli/tokenizers.sh hf_bpe_* uses it.
//
//   node tools/tiktoken_reference.cjs tokenizer ENCODING LAYOUT OUT_DIR
//       Writes OUT_DIR/tokenizer.json: the vocabulary of ENCODING (gpt2 | cl100k_base |
//       o200k_base) in
//       Hugging Face's byte-level BPE form, its merges recovered from the ranks, with
//       LAYOUT's pre-tokenizer and options:
//         gpt2:   ByteLevel(use_regex) with GPT-2's pattern, merges as "a b" strings, and a
//                 tokenizer_config.json naming <|endoftext|> BOS and EOS (GPT-2's files);
//         llama3: Split(Llama 3's pattern, Isolated) + ByteLevel(no regex), merges as
//                 ["a", "b"], ignore_merges, added tokens <|begin_of_text|> and
//                 <|end_of_text|> after the specials, and a TemplateProcessing that puts
//                 <|begin_of_text|> first (Meta-Llama-3's tokenizer.json layout); no config;
//         o200k:  Split(o200k's pattern as Hugging Face files spell it, with (?i:...) where
//                 tiktoken's pat_str lists the cases, Isolated) + ByteLevel(no regex), merges
//                 as ["a", "b"], no post-processor template, and a tokenizer_config.json with
//                 no BOS and EOS <|endoftext|> (the layout of openai/gpt-oss's tokenizer.json,
//                 whose o200k_harmony adds chat tokens to o200k_base; Llama 4's pattern is
//                 this one too).
//   node tools/tiktoken_reference.cjs time ENCODING FILE...
//       Prints "SECONDS TOKENS": js-tiktoken's time to encode the files' texts (read first,
//       ranks loaded first; one thread), for tools/bench_prepare.sh.
//   node tools/tiktoken_reference.cjs encode ENCODING OUT.json FILE...
//       Writes [[ids of FILE 1], ...]: each file's text (UTF-8) encoded by js-tiktoken as
//       ordinary text (no special tokens), the ids tiktoken's encode_ordinary gives.
//
// js-tiktoken is found in $JS_TIKTOKEN_DIR, default .deps/node/node_modules/js-tiktoken under
// the repository (tools/install_deps.sh installs it there with npm). Exit 77 if it is missing.
//
// Merges from ranks: a token of rank r is split by running tiktoken's own BPE on its bytes with
// only the ranks below r allowed; that ends in two parts, and (part 1, part 2) is its merge, at
// position r. Applying the merges in that order gives tiktoken's result (the conversion
// transformers' convert_slow_tokenizer.py does for tiktoken files).
"use strict";
const fs = require("fs");
const path = require("path");

const repo = path.resolve(__dirname, "..");
const pkg = process.env.JS_TIKTOKEN_DIR || path.join(repo, ".deps/node/node_modules/js-tiktoken");
if (!fs.existsSync(path.join(pkg, "package.json"))) {
  console.log(
    `js-tiktoken not found in ${pkg} (tools/install_deps.sh installs it with npm): skipped`,
  );
  process.exit(77);
}
const { Tiktoken } = require(path.join(pkg, "dist/index.cjs"));
const loadRanks = (name) => {
  const m = require(path.join(pkg, "dist/ranks", name + ".cjs"));
  return m.default || m;
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 take
// code points 256, 257, ... in byte order.
function byteChars() {
  const out = [];
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    out.push(String.fromCodePoint(printable ? b : next++));
  }
  return out;
}

// js-tiktoken's compressed rank table: lines "! OFFSET tok tok ..." (base64 tokens, ranks
// OFFSET, OFFSET + 1, ...). Returns Map(latin1 string of the token's bytes -> rank).
function parseRanks(compressed) {
  const ranks = new Map();
  for (const line of compressed.split("\n")) {
    if (!line) continue;
    const [, offset, ...tokens] = line.split(" ");
    tokens.forEach((t, i) =>
      ranks.set(Buffer.from(t, "base64").toString("latin1"), Number(offset) + i),
    );
  }
  return ranks;
}

// tiktoken's byte-pair merge of `token` (latin1 string) with ranks below maxRank only.
function bpeParts(ranks, token, maxRank) {
  let parts = Array.from(token);
  for (;;) {
    let best = -1,
      bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank && r < maxRank) ((best = i), (bestRank = r));
    }
    if (best < 0) return parts;
    parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
  }
}

const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" +
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// o200k_base's pattern (tiktoken's pat_str) with the case-insensitive contractions written
// (?i:...), as tokenizer.json files carry it.
const O200K_PATTERN =
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" +
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" +
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function writeTokenizer(encoding, layout, outDir) {
  const spec = loadRanks(encoding);
  const ranks = parseRanks(spec.bpe_ranks);
  const chars = byteChars();
  const spell = (latin1) => Array.from(latin1, (c) => chars[c.charCodeAt(0)]).join("");
  const vocab = {};
  const merges = [];
  const byRank = [...ranks.entries()].sort((a, b) => a[1] - b[1]);
  for (const [token, rank] of byRank) {
    vocab[spell(token)] = rank;
    if (token.length === 1) continue;
    const parts = bpeParts(ranks, token, rank);
    if (parts.length !== 2) throw new Error(`rank ${rank}: ${parts.length} parts`);
    merges.push(
      layout === "gpt2"
        ? spell(parts[0]) + " " + spell(parts[1])
        : [spell(parts[0]), spell(parts[1])],
    );
  }
  const specials = Object.entries(spec.special_tokens);
  // (a loop, not Math.max(...): o200k's 200k values overflow the call stack as arguments)
  let next = 0;
  for (const id of [...Object.values(vocab), ...specials.map(([, i]) => i)]) next = Math.max(next, id);
  next += 1;
  if (layout === "llama3")
    specials.push(["<|begin_of_text|>", next++], ["<|end_of_text|>", next++]);
  const added = specials.map(([content, id]) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  for (const [content, id] of specials) vocab[content] = vocab[content] ?? id;
  const byteLevel = (useRegex) => ({
    type: "ByteLevel",
    add_prefix_space: false,
    trim_offsets: true,
    use_regex: useRegex,
  });
  const doc = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer:
      layout === "gpt2"
        ? byteLevel(true)
        : {
            type: "Sequence",
            pretokenizers: [
              {
                type: "Split",
                pattern: { Regex: layout === "o200k" ? O200K_PATTERN : LLAMA3_PATTERN },
                behavior: "Isolated",
                invert: false,
              },
              byteLevel(false),
            ],
          },
    post_processor:
      layout === "gpt2"
        ? byteLevel(true)
        : layout === "o200k"
        ? null
        : {
            type: "TemplateProcessing",
            single: [
              { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
              { Sequence: { id: "A", type_id: 0 } },
            ],
            pair: [],
            special_tokens: {},
          },
    decoder: byteLevel(true),
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: layout === "llama3",
      vocab,
      merges,
    },
  };
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(doc));
  if (layout === "gpt2") {
    const config = {
      bos_token: "<|endoftext|>",
      eos_token: "<|endoftext|>",
      model_max_length: 1024,
    };
    fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(config));
  }
  if (layout === "o200k") {
    const config = { bos_token: null, eos_token: "<|endoftext|>" };
    fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(config));
  }
  console.log(
    `${outDir}/tokenizer.json: ${encoding} as ${layout}, ${Object.keys(vocab).length} vocab entries, ` +
      `${merges.length} merges, ${added.length} added tokens`,
  );
}

function encodeFiles(encoding, out, files) {
  const enc = new Tiktoken(loadRanks(encoding));
  const ids = files.map((f) => enc.encode(fs.readFileSync(f, "utf8"), [], []));
  fs.writeFileSync(out, JSON.stringify(ids));
}

function timeFiles(encoding, files) {
  const enc = new Tiktoken(loadRanks(encoding));
  const texts = files.map((f) => fs.readFileSync(f, "utf8"));
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const t of texts) tokens += enc.encode(t, [], []).length;
  console.log(`${Number(process.hrtime.bigint() - t0) / 1e9} ${tokens}`);
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "tokenizer" && args.length === 3) {
  writeTokenizer(args[0], args[1], args[2]);
} else if (cmd === "time" && args.length >= 2) {
  timeFiles(args[0], args.slice(1));
} else if (cmd === "encode" && args.length >= 3) {
  encodeFiles(args[0], args[1], args.slice(2));
} else {
  console.error(
    "usage: tiktoken_reference.cjs tokenizer ENCODING gpt2|llama3 OUT_DIR | time ENCODING FILE... | " +
      "encode ENCODING OUT.json FILE...",
  );
  process.exit(2);
}
