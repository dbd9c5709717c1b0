"""Writes train/tensorboard/testdata/reference.tfevents with TensorBoard's writer.

Run through make_reference.sh (it creates the virtual environment). The file
holds a file_version event and Megatron-style scalars (one simple_value per
Summary, as torch's SummaryWriter.add_scalar writes them), framed by
tensorboard.summary.writer.record_writer.RecordWriter, with fixed wall times
so the bytes are reproducible. //train/tensorboard:events_test reads it back
and checks that Loom's EventWriter writes the same bytes for the same events.
A README.md next to it records the tensorboard and protobuf versions.
"""

import os

import google.protobuf
import tensorboard
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "train",
                                    "tensorboard", "testdata"))

# (tag, value, step, wall_time): Megatron's names; zero values and step 0
# exercise proto3's omitted defaults; a value that is not exact in f32.
SCALARS = [
    ("lm loss", 10.8125, 1, 1700000001.25),
    ("lm loss vs samples", 10.8125, 8, 1700000001.25),
    ("learning-rate", 3e-4, 1, 1700000001.25),
    ("grad-norm", 0.0, 1, 1700000001.25),
    ("batch-size", 8.0, 0, 1700000001.5),
    ("mem-max-allocated-bytes", 92065792.0, 2, 1700000002.0),
    ("lm loss validation ppl", 1.0e20, 1000000, 1700000003.0),
]


def main():
    path = os.path.join(OUT, "reference.tfevents")
    with open(path, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=1700000000.5,
                                file_version="brain.Event:2").SerializeToString())
        for tag, value, step, wall_time in SCALARS:
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            w.write(event_pb2.Event(wall_time=wall_time, step=step,
                                    summary=summary).SerializeToString())
        w.flush()
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("`reference.tfevents`: written by `tools/tensorboard_reference/make_reference.py`\n"
                f"with tensorboard {tensorboard.__version__} and protobuf "
                f"{google.protobuf.__version__} (TensorBoard's RecordWriter and Event protos).\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
