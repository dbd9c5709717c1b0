#!/usr/bin/env python3
"""Makes the Hugging Face reference data in checkpoint/hf/testdata.

Run with the virtual environment of make_venv.sh, from anywhere:

    tools/hf_reference/make_venv.sh
    ~/.cache/loom/hf-venv/bin/python tools/hf_reference/make_reference.py

Nothing is downloaded: every model is built from a config with random
weights under fixed seeds, with a large init so that the logits are far from
uniform (a wrong weight, layout or op then changes them a lot). For each model
folder it writes what save_pretrained writes (config.json, safetensors, ...)
plus:

  reference.json  the input ids (batch 2 x seq 16), the logits' shape and file,
                  every tensor's name/dtype/shape/shard and a checksum of its
                  values (read back with the safetensors package itself), and
                  the versions of the packages that made it.
  logits.f32      the f32 logits of model(input_ids), raw little-endian,
                  shape [2, 16, vocab].

configs/ holds config.json files of models Loom must accept or refuse, saved
by transformers itself (no weights).
"""

import argparse
import json
import os
import re
import shutil
import sys

try:
    import numpy as np
    import safetensors
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              MistralConfig, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
except ImportError as e:
    sys.exit(f"make_reference.py: {e}. Run it with the virtual environment of "
             "tools/hf_reference/make_venv.sh (~/.cache/loom/hf-venv/bin/python).")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO, "checkpoint", "hf", "testdata")
SCRIPT = "tools/hf_reference/make_reference.py"

VOCAB = 96
BATCH, SEQ = 2, 16
SEED = 1234
# Weight std: ~10x the usual 0.02, so logits spread over several units.
INIT_STD = 0.2


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def input_ids():
    rng = np.random.default_rng(SEED)
    return rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)


def randomize(model, seed):
    """Every parameter random: matrices N(0, INIT_STD), norm weights 1 + N(0, 0.2),
    biases N(0, 0.2); so a dropped norm weight or bias shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(INIT_STD * noise)


def gpt2_tiny():
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                        initializer_range=INIT_STD, bos_token_id=VOCAB - 1,
                        eos_token_id=VOCAB - 1, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(config)
    randomize(model, SEED + 1)
    return model


def llama_tiny():
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, vocab_size=VOCAB,
                         max_position_embeddings=32, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, initializer_range=INIT_STD,
                         bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    randomize(model, SEED + 2)
    return model


def mixtral_tiny():
    """Llama's shape with every MLP a mixture of 4 SwiGLU experts, top-2 (the
    rope_theta default of Mixtral, 1e6, unlike Llama's)."""
    config = MixtralConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, vocab_size=VOCAB,
                           max_position_embeddings=32, num_local_experts=4,
                           num_experts_per_tok=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2,
                           attn_implementation="eager")
    torch.manual_seed(SEED)
    model = MixtralForCausalLM(config)
    randomize(model, SEED + 3)
    return model


def qwen2_tiny():
    """Llama's shape with Qwen2's one difference: a bias on q/k/v_proj (none
    on o_proj or the MLP); tied embeddings as Qwen2-0.5B, RoPE base 1e6."""
    config = Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, vocab_size=VOCAB,
                         max_position_embeddings=32, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, use_sliding_window=False,
                         initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2,
                         attn_implementation="eager")
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    randomize(model, SEED + 4)
    return model


def checksum(t):
    x = t.to(torch.float64).flatten()
    return {"sum": float(x.sum()), "sum_sq": float((x * x).sum()),
            "first": [float(v) for v in x[:4]]}


def describe(folder):
    """Every tensor as the safetensors package itself reads it."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    tensors = []
    for shard in files:
        with safe_open(os.path.join(folder, shard), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                dtype = {torch.float32: "F32", torch.bfloat16: "BF16",
                         torch.float16: "F16", torch.int64: "I64"}[t.dtype]
                tensors.append(dict(name=name, dtype=dtype, shape=list(t.shape), file=shard,
                                    **checksum(t)))
    tensors.sort(key=lambda d: d["name"])
    return files, tensors


def write_json(obj, path):
    text = json.dumps(obj, indent=1)
    # Lists of numbers on one line each.
    text = re.sub(r"\[[-0-9.e,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0))
                  .replace("[ ", "[").replace(" ]", "]"), text)
    with open(path, "w") as f:
        f.write(text + "\n")


def save(model, folder, ids, **save_kwargs):
    if os.path.exists(folder):
        shutil.rmtree(folder)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits.to(torch.float32).numpy()
    logits.astype("<f4").tofile(os.path.join(folder, "logits.f32"))
    files, tensors = describe(folder)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ref = {
        "made_by": SCRIPT,
        "versions": versions(),
        "model_class": type(model).__name__,
        "seed": SEED,
        "init_std": INIT_STD,
        "input_ids": ids.tolist(),
        "logits_file": "logits.f32",
        "logits_dtype": "float32 little-endian",
        "logits_shape": list(logits.shape),
        "logits_stats": {"std": float(logits.std()), "min": float(logits.min()),
                         "max": float(logits.max()),
                         "mean_max_prob": float(probs.max(-1).mean())},
        "files": files,
        "tensors": tensors,
    }
    # What was saved reproduces the logits.
    reloaded = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        again = reloaded(torch.from_numpy(ids)).logits.to(torch.float32).numpy()
    assert np.array_equal(logits, again), f"{folder}: reloaded model gives other logits"
    write_json(ref, os.path.join(folder, "reference.json"))
    print(f"{folder}: {len(tensors)} tensors in {len(files)} file(s), logits {list(logits.shape)} "
          f"std {logits.std():.3f}, mean max prob {probs.max(-1).mean():.3f}")
    return logits


def save_bf16(model, folder):
    """The model's weights rounded to bf16 by torch (for Loom's bf16 writer)."""
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    files, tensors = describe(folder)
    ref = {"made_by": SCRIPT, "versions": versions(),
           "what": "llama_tiny's weights, .to(torch.bfloat16), safetensors.torch.save_file",
           "files": files, "tensors": tensors}
    write_json(ref, os.path.join(folder, "reference.json"))
    print(f"{folder}: {len(tensors)} bf16 tensors")


def write_configs(out):
    """config.json files (no weights) that Loom must accept or refuse."""
    folder = os.path.join(out, "configs")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    common = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, vocab_size=VOCAB,
                  max_position_embeddings=32, rms_norm_eps=1e-5)
    configs = {
        # Same architecture as Llama: no sliding window.
        "mistral_tiny.json": MistralConfig(**common, sliding_window=None,
                                           architectures=["MistralForCausalLM"]),
        # Sliding window shorter than the context: not supported.
        "mistral_sliding_window.json": MistralConfig(**common, sliding_window=16,
                                                     architectures=["MistralForCausalLM"]),
        # Linear RoPE scaling: not supported.
        "llama_rope_scaling.json": LlamaConfig(**common, tie_word_embeddings=False,
                                               rope_scaling={"rope_type": "linear",
                                                             "factor": 2.0},
                                               architectures=["LlamaForCausalLM"]),
        # Tied Llama, multi-head (kv heads == heads).
        "llama_tied_mha.json": LlamaConfig(**{**common, "num_key_value_heads": 4},
                                           tie_word_embeddings=True,
                                           architectures=["LlamaForCausalLM"]),
    }
    for name, config in configs.items():
        config.to_json_file(os.path.join(folder, name), use_diff=False)
    print(f"{folder}: {', '.join(sorted(configs))}")


README = """# Hugging Face reference data

Made by `{script}` (no hub downloads: tiny random models from configs,
fixed seeds) with:

{versions}

Regenerate (the virtual environment is made once, several GB):

    tools/hf_reference/make_venv.sh            # LOOM_HF_VENV, default ~/.cache/loom/hf-venv
    ~/.cache/loom/hf-venv/bin/python tools/hf_reference/make_reference.py
    git diff --stat checkpoint/hf/testdata     # what a newer transformers changed

The script is deterministic: running it twice with the same versions on the
same machine gives the same bytes (another CPU may change the logits' last
bits, ~2e-6). It also rewrites this README.

| folder | what |
| --- | --- |
| `gpt2_tiny/` | `GPT2LMHeadModel`: 2 layers, hidden 32, 4 heads, vocab 96, 32 positions, tied `lm_head` (not saved) |
| `llama_tiny/` | `LlamaForCausalLM`: 2 layers, hidden 32, 4 heads, 2 KV heads (GQA), FFN 64, vocab 96, 32 positions, RoPE base 10000, RMSNorm eps 1e-5, untied |
| `llama_tiny_sharded/` | the same Llama saved with `max_shard_size="40KB"`: 3 shards and `model.safetensors.index.json` |
| `llama_tiny_bf16/` | the same Llama's weights `.to(torch.bfloat16)` (torch's rounding, for Loom's bf16 writer) |
| `mixtral_tiny/` | `MixtralForCausalLM`: the Llama's shape (RoPE base 1e6) with every MLP 4 SwiGLU experts, top-2 routing; saved as transformers writes it (`block_sparse_moe.gate`, `experts.E.w1/w2/w3`) |
| `qwen2_tiny/` | `Qwen2ForCausalLM`: the Llama's shape with a bias on `q_proj`/`k_proj`/`v_proj` only, RoPE base 1e6, RMSNorm eps 1e-6, tied embeddings |
| `configs/` | `config.json` files only: `mistral_tiny.json` (no sliding window: Llama's architecture), `llama_tied_mha.json` (tied, no GQA), and two Loom refuses: `mistral_sliding_window.json`, `llama_rope_scaling.json` |

Each model folder holds what `save_pretrained` wrote (f32 safetensors,
`config.json`, `generation_config.json`) and `reference.json`: the input ids
(batch 2 x seq 16), `logits_shape` and `logits_file` (`logits.f32`: raw
little-endian f32 logits of `model(input_ids)`, eager attention), every tensor's
name, dtype, shape, file and a checksum (sum, sum of squares, first values) as
the safetensors package reads it, and the package versions. Every weight is
random with a large init (matrices N(0, {init_std}), norm weights 1 + N(0, 0.2),
biases N(0, 0.2)) so the logits are far from uniform.

Used by `//checkpoint/hf:safetensors_test`, `//checkpoint/hf:hf_config_test`,
`//checkpoint/hf:import_test` and `//train:hf_logits_test`.
"""


def write_readme(out):
    lines = "\n".join(f"- {k} {v}" for k, v in versions().items())
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(README.format(script=SCRIPT, versions=lines, init_std=INIT_STD))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="testdata folder (default: %(default)s)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ids = input_ids()
    os.makedirs(args.out, exist_ok=True)

    save(gpt2_tiny(), os.path.join(args.out, "gpt2_tiny"), ids)
    llama = llama_tiny()
    a = save(llama, os.path.join(args.out, "llama_tiny"), ids)
    # ~40 KB per shard: the ~100 KB model spreads over 3+ files.
    b = save(llama, os.path.join(args.out, "llama_tiny_sharded"), ids, max_shard_size="40KB")
    assert np.array_equal(a, b)
    if not os.path.exists(os.path.join(args.out, "llama_tiny_sharded",
                                       "model.safetensors.index.json")):
        sys.exit("llama_tiny_sharded: save_pretrained wrote no index (one shard)")
    save_bf16(llama, os.path.join(args.out, "llama_tiny_bf16"))
    save(mixtral_tiny(), os.path.join(args.out, "mixtral_tiny"), ids)
    save(qwen2_tiny(), os.path.join(args.out, "qwen2_tiny"), ids)
    write_configs(args.out)
    write_readme(args.out)
    print("versions:", json.dumps(versions()))


if __name__ == "__main__":
    main()
