"""A tiny DDP job whose batches come from the arbitrator (tests/dynamix_gym/service/test_arbitrator_torchrun.py).

DYNAMIX_ARBITRATOR_TOKEN=... torchrun --standalone --nproc-per-node 2 tests/dynamix_gym/service/ddp_job.py ADDRESS OUT
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from adapters.data import load_dataset
from adapters.examples.common import classification_step
from adapters.models import build_model
from adapters.torchrun import DynamixController


def main() -> None:
    address, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = DDP(build_model("mlp", data.input_shape, data.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ctl = DynamixController(
        model,
        optimizer,
        arbitrator=address,
        arbitrator_kwargs={"job_id": "ddp-job", "timeout_s": 2.0},
        interval=10,
        base_batch=32,
        min_batch=16,
        max_batch=256,
        stats_every=2,
    )
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_sampler=ctl.batch_sampler(len(data.x_train), steps=60),
    )
    batches = []
    for x, y in loader:
        if classification_step(ctl, model, optimizer, x, y) or ctl.decisions:
            batches.append(ctl.batches.tolist())
    if rank == 0:
        counts = dict(ctl.policy.client.counts)
        ctl.policy.close()
        with open(out, "w") as f:
            json.dump(
                {
                    "decisions": ctl.decisions,
                    "counts": counts,
                    "without_policy": ctl.decisions_without_policy,
                    "batches": batches,
                },
                f,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
