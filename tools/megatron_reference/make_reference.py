"""Writes Megatron-Core's blending indices for a few (weights, size) cases.

For each case: Megatron's --data-path weights as typed, their normalisation
(megatron.core.datasets.utils.normalize), the samples each dataset must give
(blended_megatron_dataset_builder._get_size_per_split_per_dataset, without and
with the default mid_level_dataset_surplus), and the dataset index and dataset
sample index that the compiled helpers_cpp.build_blending_indices writes for
the blend's size, exactly as BlendedDataset._build_indices calls it.
"""

import json
import sys
import warnings
from importlib import metadata

import numpy

warnings.filterwarnings("ignore")

from megatron.core.datasets import helpers  # noqa: E402  (the compiled helpers_cpp)
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    _get_size_per_split_per_dataset,
)
from megatron.core.datasets.blended_megatron_dataset_config import (  # noqa: E402
    BlendedMegatronDatasetConfig,
)
from megatron.core.datasets.utils import normalize  # noqa: E402

# (weights as typed after --data-path, samples the split asks for)
CASES = [
    (["0.3", "0.7"], 1000),
    (["1", "1", "1"], 3000),
    (["0.5", "0.25", "0.25"], 2048),
    (["7", "2", "1"], 999),
    (["0.1", "0.2", "0.3", "0.4"], 4097),
    (["0.99", "0.01"], 1500),
    # Ten datasets: numpy sums them pairwise (eight accumulators), not in order.
    ([str(w) for w in [3, 1, 4, 1, 5, 9, 2, 6, 5, 3.5]], 2500),
    (["1e-3", "2.5e-3", "0.0117"], 777),
]


def main(out_path):
    surplus = BlendedMegatronDatasetConfig.__dataclass_fields__["mid_level_dataset_surplus"].default
    cases = []
    for typed, size in CASES:
        weights = normalize([float(w) for w in typed])
        target = [per_split[0] for per_split in _get_size_per_split_per_dataset(weights, [size])]
        buffer = [
            per_split[0]
            for per_split in _get_size_per_split_per_dataset(weights, [size], surplus=surplus)
        ]
        blend_size = sum(target)
        dataset_index = numpy.zeros(blend_size, dtype=numpy.int16)
        dataset_sample_index = numpy.zeros(blend_size, dtype=numpy.int64)
        helpers.build_blending_indices(
            dataset_index, dataset_sample_index, weights, len(weights), blend_size, False
        )
        cases.append(
            {
                "weights": typed,
                "size": size,
                "normalized_weights_hex": [float(w).hex() for w in weights],
                "samples_per_dataset": target,
                "samples_built_per_dataset": buffer,
                "blend_size": blend_size,
                "dataset_index": dataset_index.tolist(),
                "dataset_sample_index": dataset_sample_index.tolist(),
            }
        )
    doc = {
        "generator": "tools/megatron_reference/make_reference.py",
        "megatron_core": metadata.version("megatron-core"),
        "numpy": numpy.__version__,
        "mid_level_dataset_surplus": surplus,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases (megatron-core {doc['megatron_core']}) to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1])
