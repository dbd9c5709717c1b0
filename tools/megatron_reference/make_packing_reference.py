"""Writes Megatron-Core's masks and position ids for a few packed samples.

For each case (a sample's input tokens, the EOD id and the three switches):
megatron.core.datasets.gpt_dataset._get_ltor_masks_and_position_ids's
attention mask (True: masked), loss mask and position ids, exactly as
GPTDataset calls it. //train/data:packing_test compares Loom's
LtorMasksAndPositionIds with them.
"""

import json
import sys
import warnings
from importlib import metadata

import torch

warnings.filterwarnings("ignore")

from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids  # noqa: E402

EOD = 0
# Input tokens of one sample (what GPTDataset passes: text[:-1]).
SAMPLES = [
    [5, 6, 7, 8, 9, 10],                    # no EOD: one document
    [5, 6, 0, 7, 8, 9, 0, 3],               # two EODs inside
    [0, 4, 4, 0, 0, 9, 2, 0],               # EOD first, two in a row, EOD last
    [1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 7, 7],   # a short and a longer document
]
SWITCHES = [
    (True, True, True),
    (True, False, False),
    (False, True, False),
    (False, False, True),
    (False, False, False),
]


def main(out_path):
    cases = []
    for tokens in SAMPLES:
        for reset_position_ids, reset_attention_mask, eod_mask_loss in SWITCHES:
            mask, loss_mask, position_ids = _get_ltor_masks_and_position_ids(
                torch.tensor(tokens, dtype=torch.int64),
                EOD,
                reset_position_ids,
                reset_attention_mask,
                eod_mask_loss,
                True,
            )
            cases.append(
                {
                    "tokens": tokens,
                    "eod": EOD,
                    "reset_position_ids": reset_position_ids,
                    "reset_attention_mask": reset_attention_mask,
                    "eod_mask_loss": eod_mask_loss,
                    "attention_mask": mask[0].int().tolist(),
                    "loss_mask": loss_mask.tolist(),
                    "position_ids": position_ids.tolist(),
                }
            )
    doc = {
        "generator": "tools/megatron_reference/make_packing_reference.py",
        "megatron_core": metadata.version("megatron-core"),
        "torch": torch.__version__,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases (megatron-core {doc['megatron_core']}) to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1])
