"""Writes torch's ScheduleDualPipeV compute order per stage, the reference that
//pipeline:schedule_test compares Loom's dualpipev schedule with.

  ~/.cache/loom/pytorch-venv/bin/python tools/pytorch_reference/dualpipev_order.py \
      > pipeline/testdata/dualpipev_torch_order.txt

One line per (P, M, stage): "P M r: F0.0 I0.1 W0.1 F3.1+B0.0 ...", Loom's short
names (F forward, B full backward, I input-gradient backward, W weight-gradient
backward; micro-batch.chunk, chunk 0 = torch's first local stage r, chunk 1 =
2P-1-r), torch's OVERLAP_F_B compound action written as "F...+B...".
"""
import sys
import types

import torch
from torch.distributed.pipelining import schedules as S


def short(action, rank, p):
    chunk = 0 if action.stage_index == rank else 1
    assert action.stage_index == (rank if chunk == 0 else 2 * p - 1 - rank)
    letter = {S._ComputationType.FORWARD: "F", S._ComputationType.FULL_BACKWARD: "B",
              S._ComputationType.BACKWARD_INPUT: "I",
              S._ComputationType.BACKWARD_WEIGHT: "W"}[action.computation_type]
    return f"{letter}{action.microbatch_index}.{chunk}"


def order(p, m, rank):
    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    actions = S.ScheduleDualPipeV._calculate_single_rank_operations(fake, rank)
    out = []
    for a in actions:
        if a.computation_type == S._ComputationType.OVERLAP_F_B:
            out.append("+".join(short(s, rank, p) for s in a.sub_actions))
        else:
            out.append(short(a, rank, p))
    return " ".join(out)


def main():
    print(f"# torch {torch.__version__} ScheduleDualPipeV._calculate_single_rank_operations; "
          "regenerate with tools/pytorch_reference/dualpipev_order.py")
    for p, m in [(1, 2), (1, 5), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 16), (8, 32)]:
        for rank in range(p):
            print(f"{p} {m} {rank}: {order(p, m, rank)}")


if __name__ == "__main__":
    sys.exit(main())
