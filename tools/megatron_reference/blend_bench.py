"""Megatron-Core's side of //train/data:blend_bench: the same blend built by
BlendedMegatronDatasetBuilder(GPTDataset, ...), as Megatron-LM's pretrain_gpt.py
builds it, with a cold --data-cache-path and then a warm one; prints seconds.

  blend_bench.py CACHE_DIR SEQ_LENGTH SPLIT TRAIN VALID W1 PREFIX1 W2 PREFIX2 ...
"""

import logging
import os
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402


class Tokenizer:
    """What GPTDatasetConfig reads of a tokenizer (GPT-2's sizes)."""

    vocab_size = 50257
    eod = 50256
    pad = -1
    unique_identifiers = {"class": "blend_bench"}


def main(argv):
    cache, seq_length, split, train, valid = argv[1:6]
    rest = argv[6:]
    weights = [float(w) for w in rest[0::2]]
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=int(seq_length),
        blend=(rest[1::2], weights),
        split=split,
        path_to_cache=cache,
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        mmap_bin_files=True,
    )
    # BlendedDataset asks for the rank: one process, as one rank of a run.
    store = os.path.join(tempfile.mkdtemp(), "store")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1
    )
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        BlendedMegatronDatasetBuilder(
            GPTDataset, [int(train), int(valid), 0], lambda: True, config
        ).build()
        print(f"megatron-core {name}: {time.perf_counter() - t0:.3f} s")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv)
