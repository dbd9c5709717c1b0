"""Hugging Face `tokenizers` side of //train:preprocess_bench.

  corpus OUT.jsonl MIN_MB      text files of this machine as JSON lines
  train CORPUS DIR VOCAB       a byte-level BPE (GPT-2's pre-tokenizer) into DIR/tokenizer.json
  encode CORPUS DIR            read the JSON lines and encode_batch them (RAYON_NUM_THREADS
                               threads): prints tokens and seconds as JSON
"""
import glob
import json
import os
import sys
import time


def corpus(out, min_mb):
    # Licenses and the Python standard library: text every Debian machine has.
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
    written = 0
    with open(out, "w") as f:
        while written < min_mb * 1e6:
            for path in files:
                try:
                    text = open(path, encoding="utf-8").read()
                except (OSError, UnicodeDecodeError):
                    continue
                if text.strip():
                    f.write(json.dumps({"text": text}) + "\n")
                    written += len(text.encode())
            if written == 0:
                sys.exit("preprocess_bench: no text files found for the corpus")
    print(json.dumps({"mb": written / 1e6}))


def train(corpus_path, out_dir, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [json.loads(line)["text"] for line in open(corpus_path)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>"}, f)


def encode(corpus_path, tok_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    start = time.perf_counter()
    texts = [json.loads(line)["text"] for line in open(corpus_path)]
    read = time.perf_counter()
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    end = time.perf_counter()
    tokens = sum(len(e.ids) for e in encodings)
    print(json.dumps({"tokens": tokens, "seconds": end - start, "encode_seconds": end - read}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        corpus(args[0], float(args[1]))
    elif cmd == "train":
        train(args[0], args[1], int(args[2]))
    else:
        encode(args[0], args[1])
