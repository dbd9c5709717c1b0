"""Trains small reference tokenizers and writes their encodings for Loom's tests.

Run through make_reference.sh (it creates the virtual environment). Reads the
committed corpus train/data/testdata/tokenizers/corpus.txt and writes, next
to it:

  gpt2_style/tokenizer.json    byte-level BPE, GPT-2 pre-tokenizer (ByteLevel
                               with its regex), <|endoftext|> and <|pad|>
  gpt2_style/vocab.json,       the same model in OpenAI's two-file format
  gpt2_style/merges.txt        (--tokenizer-type GPT2BPETokenizer)
  llama3_style/tokenizer.json  byte-level BPE, Llama 3's Split regex then
                               ByteLevel(use_regex=false), ignore_merges, a
                               TemplateProcessing post-processor adding
                               <|begin_of_text|>, added tokens past the model
                               vocabulary (one normalized, not special)
  llama3_style/tokenizer_config.json  eos_token, as transformers saves it
  spm_bpe.model                SentencePiece BPE with Llama 2's settings
                               (byte_fallback, identity normalization, ...)
  expected.json                every tokenizer's ids and decoded text for
                               each of TEXTS, plus vocabulary sizes, bos/eos
  README.md                    the script and the package versions

Loom's tests (train/data/hf_tokenizer_test.cc,
sentencepiece_tokenizer_test.cc) compare their ids with expected.json exactly.
"""

import json
import os
import platform
import sys
import tempfile

import sentencepiece as spm
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers import processors, trainers

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO, "train", "data", "testdata", "tokenizers")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# The texts every tokenizer encodes: unicode (2-, 3- and 4-byte characters, a
# combining accent), digits, whitespace runs (spaces, tabs, no-break and
# ideographic spaces, U+0085), newlines, contractions in both cases, and the
# special tokens next to text and to each other.
TEXTS = [
    "Hello world! I'm 42 years old, you're not; WE'LL see.\n\n"
    "Caf\u00e9 na\u00efve cafe\u0301 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 "
    "\u043f\u0440\u0438\u0432\u0435\u0442 \U0001F642\U0001F44D\U0001F3FD\n"
    "Numbers: 3.14159 2718281828 1,000,000 0x1F600\n"
    "  two spaces,\ttab\t\ttabs,    four spaces and a trailing run   \n"
    "no\u00a0break\u00a0\u00a0twice, ideographic\u3000space, next\u0085line\r\n"
    "<|endoftext|>After the end.<|endoftext|><|endoftext|><|pad|> padded "
    "<|begin_of_text|>hello world<|end_of_text|>",
    "",
    "   ",
    " leading space and trailing newline\n",
    "<|endoftext|>",
    "x<|pad|>y <|endoftext|> z\n\n\n",
    "DON'T SHOUT. It's 12345678 o'clock; they'd've said so.",
]


def jline(value):
    return json.dumps(value, ensure_ascii=True)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2, sort_keys=False)
        f.write("\n")


def corpus_chunks(corpus):
    # One training sequence per fortune (newlines included).
    return [c for c in corpus.split("\n%\n") if c.strip()]


def train_gpt2_style(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=2,
        show_progress=False,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus_chunks(corpus), trainer)
    return tok


def train_llama3_style(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus_chunks(corpus), trainer)
    # Special tokens after training, past the model's vocabulary (as Llama 3's
    # <|begin_of_text|> = 128000), and one normalized, non-special added token.
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.add_tokens([AddedToken("hello world", normalized=True, special=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)],
        ),
    ])
    # The trainer may rebuild the model: make sure ignore_merges survived.
    spec = json.loads(tok.to_str())
    if not spec["model"].get("ignore_merges"):
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def train_spm(corpus, prefix):
    corpus_file = prefix + ".txt"
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write(corpus)
    spm.SentencePieceTrainer.train(
        input=corpus_file,
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=500,
        # Llama 2's tokenizer settings.
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.99995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def hf_cases(tok):
    cases = []
    for text in TEXTS:
        ids = tok.encode(text).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        cases.append({"ids": ids, "decoded": decoded, "lossless": decoded == text})
    return cases


def main():
    with open(os.path.join(OUT, "corpus.txt"), encoding="utf-8") as f:
        corpus = f.read()

    results = {}

    gpt2 = train_gpt2_style(corpus)
    d = os.path.join(OUT, "gpt2_style")
    os.makedirs(d, exist_ok=True)
    gpt2.save(os.path.join(d, "tokenizer.json"), pretty=True)
    gpt2.model.save(d)  # vocab.json + merges.txt
    gpt2 = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    results["gpt2_style"] = {
        "tokenizer": "gpt2_style/tokenizer.json",
        "vocab_size": gpt2.get_vocab_size(with_added_tokens=True),
        "eod_id": gpt2.token_to_id("<|endoftext|>"),
        "cases": hf_cases(gpt2),
    }

    # The same tokenizer.json with ByteLevel's add_prefix_space on (the test
    # makes the same edit): every stretch of text gets a leading space.
    spec = json.loads(gpt2.to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    prefixed = Tokenizer.from_str(json.dumps(spec))
    results["gpt2_style_add_prefix_space"] = {
        "tokenizer": "gpt2_style/tokenizer.json",
        "edit": "pre_tokenizer.add_prefix_space = true",
        "vocab_size": prefixed.get_vocab_size(with_added_tokens=True),
        "cases": hf_cases(prefixed),
    }

    # OpenAI's format has no added tokens: special tokens are plain text there.
    legacy = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"),
                                            os.path.join(d, "merges.txt")))
    legacy.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    legacy.decoder = decoders.ByteLevel()
    results["gpt2_style_vocab_merges"] = {
        "vocab_file": "gpt2_style/vocab.json",
        "merge_file": "gpt2_style/merges.txt",
        "vocab_size": legacy.get_vocab_size(with_added_tokens=True),
        "cases": hf_cases(legacy),
    }

    llama3 = train_llama3_style(corpus)
    d = os.path.join(OUT, "llama3_style")
    os.makedirs(d, exist_ok=True)
    llama3.save(os.path.join(d, "tokenizer.json"), pretty=True)
    write_json(os.path.join(d, "tokenizer_config.json"),
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                "tokenizer_class": "PreTrainedTokenizerFast"})
    llama3 = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    results["llama3_style"] = {
        "tokenizer": "llama3_style/tokenizer.json",
        "vocab_size": llama3.get_vocab_size(with_added_tokens=True),
        "bos_id": llama3.token_to_id("<|begin_of_text|>"),
        "eod_id": llama3.token_to_id("<|end_of_text|>"),
        "cases": hf_cases(llama3),
    }

    with tempfile.TemporaryDirectory() as tmp:
        sp = train_spm(corpus, os.path.join(tmp, "spm_bpe"))
        with open(os.path.join(tmp, "spm_bpe.model"), "rb") as f:
            model = f.read()
    with open(os.path.join(OUT, "spm_bpe.model"), "wb") as f:
        f.write(model)
    cases = []
    for text in TEXTS:
        ids = sp.encode(text)  # no bos/eos: Megatron's SentencePieceTokenizer.tokenize
        decoded = sp.decode(ids)
        cases.append({"ids": ids, "decoded": decoded, "lossless": decoded == text})
    results["spm_bpe"] = {
        "model": "spm_bpe.model",
        "vocab_size": sp.get_piece_size(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "cases": cases,
    }

    versions = {
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "sentencepiece": spm.__version__,
    }
    # One line per case keeps diffs after a regeneration readable.
    lines = ["{", '  "generated_by": "tools/tokenizer_reference/make_reference.sh",',
             '  "versions": ' + jline(versions) + ",",
             '  "texts": [']
    lines += ["    " + jline(t) + ("," if i + 1 < len(TEXTS) else "") for i, t in enumerate(TEXTS)]
    lines.append("  ],")
    names = list(results)
    for n, name in enumerate(names):
        r = results[name]
        lines.append("  " + jline(name) + ": {")
        for k, v in r.items():
            if k == "cases":
                continue
            lines.append("    " + jline(k) + ": " + jline(v) + ",")
        lines.append('    "cases": [')
        for i, c in enumerate(r["cases"]):
            lines.append("      " + jline(c) + ("," if i + 1 < len(r["cases"]) else ""))
        lines.append("    ]")
        lines.append("  }" + ("," if n + 1 < len(names) else ""))
    lines.append("}")
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    json.load(open(os.path.join(OUT, "expected.json"), encoding="utf-8"))  # well-formed

    with open(os.path.join(OUT, "README.md"), "w", encoding="utf-8") as f:
        f.write(README.format(**versions))
    for name, r in results.items():
        lossy = [i for i, c in enumerate(r["cases"]) if not c["lossless"]]
        print(f"{name}: vocab {r['vocab_size']}, texts not round-tripping: {lossy}")
    print("versions:", versions)


README = """# Reference tokenizers for Loom's tests

Generated by `tools/tokenizer_reference/make_reference.sh` (which runs
`make_reference.py` in a virtual environment at `$LOOM_TOKENIZER_VENV`, default
`~/.cache/loom/tokenizer-venv`) with:

- Python {python}
- tokenizers {tokenizers} (Hugging Face, PyPI)
- sentencepiece {sentencepiece} (PyPI)

Do not edit these files by hand: change the script and run it again; `git diff`
then shows what a newer `tokenizers`/`sentencepiece` changed.

- `corpus.txt`: the training text, committed so that the files below do not
  depend on the machine (the first fortunes of Debian's `fortunes` package
  files `computers` and `science`, then a few lines written for these tests
  with non-ASCII text, digits and whitespace runs).
- `gpt2_style/tokenizer.json`: byte-level BPE with GPT-2's pre-tokenizer
  (ByteLevel with its regex), special tokens `<|endoftext|>` and `<|pad|>`;
  `gpt2_style/vocab.json` + `merges.txt`: the same model in OpenAI's format.
  `expected.json`'s `gpt2_style_add_prefix_space` encodes with that
  tokenizer.json edited to ByteLevel `add_prefix_space: true`.
- `llama3_style/tokenizer.json`: byte-level BPE as Llama 3 builds it: a Split
  pre-tokenizer with Llama 3's regex, then ByteLevel without regex,
  `ignore_merges`, a TemplateProcessing post-processor that puts
  `<|begin_of_text|>` first, added tokens past the model vocabulary;
  `tokenizer_config.json` names the eos token.
- `spm_bpe.model`: SentencePiece BPE with Llama 2's settings (byte fallback,
  identity normalization, dummy prefix, split digits).
- `expected.json`: for each text in `texts`, every tokenizer's ids
  (Hugging Face `Tokenizer.encode(text).ids`, SentencePiece `encode(text)`),
  the decoded text (`decode(ids)`, special tokens kept) and whether that equals
  the input.
"""

if __name__ == "__main__":
    sys.exit(main())
