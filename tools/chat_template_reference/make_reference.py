#!/usr/bin/env python3
"""Makes the chat-template reference data Loom's tests compare against exactly.

Run with a Python that has transformers (and jinja2, tokenizers) installed,
e.g. the environment of tools/hf_reference/make_venv.sh, from anywhere:

    ~/.cache/loom/hf-venv/bin/python tools/chat_template_reference/make_reference.py

Writes:

  train/data/jinja/testdata/cases.json
      each case of jinja_cases.py with what transformers' own chat-template
      environment renders (trim_blocks, lstrip_blocks, its tojson,
      raise_exception, namespace, {% generation %}) and the generation spans
      as UTF-8 byte ranges (//train/data/jinja:template_test).

  train/data/testdata/chat/<style>/
      tokenizer.json, tokenizer_config.json and chat_template.jinja for the
      Llama 3, Qwen2 and Mistral-style templates in templates/ (the tokenizer
      is train/data/testdata/tokenizers/llama3_style/tokenizer.json with each
      style's special tokens added), saved by transformers, and
      reference.json: for each conversation in CONVERSATIONS, the rendered
      text, `input_ids` and `assistant_masks` of
      tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
      return_assistant_tokens_mask=True) (//train/data:chat_template_test).
"""

import json
import os
import shutil
import sys

try:
    import jinja2
    import tokenizers
    import transformers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils.chat_template_utils import (_compile_jinja_template,
                                                        _render_with_assistant_indices)
except ImportError as e:
    sys.exit(f"make_reference.py: {e}. Run it with a Python that has transformers "
             "(e.g. ~/.cache/loom/hf-venv/bin/python from tools/hf_reference/make_venv.sh).")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from jinja_cases import CASES  # noqa: E402

BASE_TOKENIZER = os.path.join(REPO, "train/data/testdata/tokenizers/llama3_style/tokenizer.json")
CHAT_OUT = os.path.join(REPO, "train/data/testdata/chat")
JINJA_OUT = os.path.join(REPO, "train/data/jinja/testdata/cases.json")

STYLES = {
    "llama3_style": {
        "special": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "qwen2_style": {
        "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
    },
    "mistral_style": {
        "special": ["<s>", "</s>", "[INST]", "[/INST]"],
        "bos_token": "<s>",
        "eos_token": "</s>",
    },
}

CONVERSATIONS = [
    {"name": "single_turn", "messages": [
        {"role": "user", "content": "What is a fortune cookie?"},
        {"role": "assistant", "content": "A crisp cookie with a paper fortune inside."},
    ]},
    {"name": "multi_turn", "messages": [
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "Seven is prime."},
        {"role": "user", "content": "And one larger than 100?"},
        {"role": "assistant", "content": "101 is the first one.\nThen 103."},
    ]},
    {"name": "system_prompt", "messages": [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Air scatters blue light more than red light."},
    ]},
    {"name": "unicode", "messages": [
        {"role": "system", "content": "Réponds poliment. 日本語もOK"},
        {"role": "user", "content": "Grüße! 你好 🙂 — naïve café?"},
        {"role": "assistant", "content": "Bonjour ! こんにちは 👋🏽 ça va très bien."},
        {"role": "user", "content": "Ελληνικά; Кириллица?"},
        {"role": "assistant", "content": "Ναι — да, ✓ 100%."},
    ]},
    {"name": "whitespace_and_digits", "messages": [
        {"role": "user", "content": "  Sum 12345 and 67890.  "},
        {"role": "assistant", "content": "  80235\n\n(checked twice)  "},
    ]},
]


def versions():
    return {"python": sys.version.split()[0], "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}


def byte_spans(text, spans):
    """Character spans (Python str indices) -> UTF-8 byte spans."""
    return [[len(text[:b].encode()), len(text[:e].encode())] for b, e in spans]


def make_jinja_cases():
    out = []
    for name, template, variables in CASES:
        compiled = _compile_jinja_template(template)
        blocks, spans = [], []
        with compiled.environment.activate_tracker(blocks, spans):
            for block in compiled.generate(**variables):
                blocks.append(block)
        text = "".join(blocks)
        out.append({"name": name, "template": template, "variables": variables,
                    "expected": text, "generation_spans": byte_spans(text, spans)})
    os.makedirs(os.path.dirname(JINJA_OUT), exist_ok=True)
    with open(JINJA_OUT, "w", encoding="utf-8") as f:
        json.dump({"made_by": "tools/chat_template_reference/make_reference.py",
                   "versions": versions(), "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")


def make_style(style, spec):
    folder = os.path.join(CHAT_OUT, style)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    base = tokenizers.Tokenizer.from_file(BASE_TOKENIZER)
    base.add_special_tokens(spec["special"])
    with open(os.path.join(HERE, "templates", style + ".jinja"), encoding="utf-8") as f:
        template = f.read()
    tok = PreTrainedTokenizerFast(tokenizer_object=base, bos_token=spec["bos_token"],
                                  eos_token=spec["eos_token"], chat_template=template)
    tok.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)  # what a user of the folder gets
    expected = []
    for conv in CONVERSATIONS:
        out = tok.apply_chat_template(conv["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        text = tok.apply_chat_template(conv["messages"], tokenize=False)
        assert sum(out["assistant_masks"]) > 0, (style, conv["name"])
        expected.append({"name": conv["name"], "messages": conv["messages"], "text": text,
                         "input_ids": list(out["input_ids"]),
                         "assistant_masks": list(out["assistant_masks"])})
    with open(os.path.join(folder, "reference.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": "tools/chat_template_reference/make_reference.py",
                   "call": "apply_chat_template(messages, tokenize=True, return_dict=True, "
                           "return_assistant_tokens_mask=True)",
                   "versions": versions(), "conversations": expected},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{style}: {sorted(os.listdir(folder))}")


def main():
    make_jinja_cases()
    for style, spec in STYLES.items():
        make_style(style, spec)


if __name__ == "__main__":
    main()
