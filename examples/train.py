"""Vendor-agnostic training example: a small MLP on the Iris data set.

Hugging Face Accelerate picks the device and the distributed backend, so the
same file runs unchanged on any accelerator the image supports and on plain
CPUs. Nothing is written to disk, so a read-only working directory is fine;
the data is found relative to this file, so any working directory works.

Run it plainly, or with several processes:

    python examples/train.py
    torchrun --nproc_per_node 2 examples/train.py
    accelerate launch --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no examples/train.py

On a machine without an accelerator, ``accelerate launch --cpu
--num_processes 2`` runs too, but Accelerate's CPU launcher starts a single
process unless it is given an MPI hostfile; torchrun (or Accelerate's
multi-device launch flag) starts two processes that form a gloo group.

The main process prints the mean loss of every epoch and, at the end, one
machine-readable line:

    FINAL first_loss=1.0712 last_loss=0.0893 accuracy=0.967

The exit status is 0 only if the loss fell (last epoch below the first).

Data: Fisher's Iris data (150 rows, public domain), examples/data/iris.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA_FILE = Path(__file__).resolve().parent / "data" / "iris.csv"
SPECIES = ("setosa", "versicolor", "virginica")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; the defaults train in a few seconds.

    Example:
        >>> parse_args([]).epochs
        15
    """
    parser = argparse.ArgumentParser(description="Train a small MLP on Iris with Accelerate.")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA_FILE)
    return parser.parse_args(argv)


def load_iris(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (150 x 4, float32) and labels (150, int64) from the CSV.

    Example:
        >>> x, y = load_iris(DATA_FILE)
        >>> tuple(x.shape), int(y.max())
        ((150, 4), 2)
    """
    features, labels = [], []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            features.append(
                [float(row[k]) for k in ("sepal_length", "sepal_width", "petal_length", "petal_width")]
            )
            labels.append(SPECIES.index(row["species"]))
    return torch.tensor(features, dtype=torch.float32), torch.tensor(labels, dtype=torch.int64)


def split(x: torch.Tensor, y: torch.Tensor, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Deterministic 80/20 train/eval split, standardised with train statistics.

    Example:
        >>> train, test = split(*load_iris(DATA_FILE), seed=0)
        >>> len(train), len(test)
        (120, 30)
    """
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(len(x) * 0.8)
    train_idx, test_idx = order[:cut], order[cut:]
    mean, std = x[train_idx].mean(dim=0), x[train_idx].std(dim=0)
    x = (x - mean) / std
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


def build_model() -> nn.Module:
    """A 4 -> 32 -> 32 -> 3 multilayer perceptron.

    Example:
        >>> build_model()(torch.zeros(2, 4)).shape
        torch.Size([2, 3])
    """
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


def accelerator_available() -> bool:
    """Whether torch sees an accelerator (vendor-neutral ``torch.accelerator``).

    Without one, Accelerate must be told ``cpu=True`` so that a multi-process
    launch (torchrun, or accelerate launch with several processes) forms a
    gloo group instead of running independent single-process copies. Before
    torch 2.6 there is no ``torch.accelerator``: the choice is left to
    Accelerate (set ACCELERATE_USE_CPU=1 for a multi-process run on CPUs).

    Example:
        >>> isinstance(accelerator_available(), bool)
        True
    """
    api = getattr(torch, "accelerator", None)
    return True if api is None else bool(api.is_available())


def train(args: argparse.Namespace) -> int:
    """Train, report per-epoch loss on the main process; return the exit code.

    Example:
        >>> train(parse_args(["--epochs", "3"]))  # doctest: +SKIP
        0
    """
    accelerator = Accelerator(cpu=not accelerator_available())
    set_seed(args.seed)  # same initial weights on every process

    train_set, test_set = split(*load_iris(args.data), seed=args.seed)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=args.batch_size)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model, optimizer, train_loader, test_loader
    )
    loss_fn = nn.CrossEntropyLoss()

    accelerator.print(
        f"processes={accelerator.num_processes} backend={accelerator.state.backend or 'none'} "
        f"device={accelerator.device.type} train={len(train_set)} eval={len(test_set)}"
    )
    epoch_losses = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = torch.zeros(2, device=accelerator.device)  # (sum of losses, number of samples)
        for features, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            total += torch.stack(
                [loss.detach() * len(labels), torch.tensor(float(len(labels)), device=total.device)]
            )
        # Sum over processes so every rank reports the same global mean.
        total = accelerator.reduce(total, reduction="sum")
        epoch_losses.append((total[0] / total[1]).item())
        accelerator.print(f"epoch {epoch:3d}  loss {epoch_losses[-1]:.4f}")

    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for features, labels in test_loader:
            predictions = model(features).argmax(dim=-1)
            # gather_for_metrics drops the samples padded in to even out the shards.
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            seen += len(labels)

    first, last = epoch_losses[0], epoch_losses[-1]
    accelerator.print(
        f"FINAL first_loss={first:.4f} last_loss={last:.4f} accuracy={correct / max(seen, 1):.3f}"
    )
    accelerator.wait_for_everyone()
    # Drop every reference to the wrapped model (its DDP reducer holds the
    # process group) before the group is destroyed: otherwise gloo's threads
    # can outlive it into interpreter shutdown and abort the process (seen
    # once in CI: "terminate called without an active exception", rank 1).
    del model, optimizer, train_loader, test_loader
    accelerator.free_memory()
    accelerator.end_training()
    return 0 if last < first else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point.

    Example:
        >>> main(["--epochs", "2"])  # doctest: +SKIP
        0
    """
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
