"""Reads write_sample's event file with TensorBoard's own reader.

usage: read_with_tensorboard.py DIR. Exit 0: TensorBoard read the scalars
write_sample.cc wrote; 1: it did not; 77: the tensorboard package is missing.
"""

import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"tensorboard is not importable ({e})")
    sys.exit(77)


def main():
    acc = EventAccumulator(sys.argv[1])
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    assert tags == ["lm loss", "lm loss vs samples"], tags
    assert acc.file_version == 2.0, acc.file_version  # parsed from "brain.Event:2"
    for tag, scale in (("lm loss", 1), ("lm loss vs samples", 8)):
        got = [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        want = [(scale * s, 10.0 - s / 4.0, 1700000000.0 + s) for s in range(1, 5)]
        assert got == want, (tag, got, want)
    print("TensorBoard read", {t: len(acc.Scalars(t)) for t in tags})


if __name__ == "__main__":
    main()
