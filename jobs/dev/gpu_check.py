"""GPU check of `Batch.to_torch`: pinned host tensors -> device, against a plain tensor copy.

Run on a machine with CUDA (`replaylake dev gpu-check`, well under a minute): for a synthetic
batch (B=1024 and B=256, the benchmark's lengths) and both layouts it checks that
``batch_to_torch(device="cuda", pin_memory=True)`` equals the host tensors element for element,
that the host tensors really are pinned, and prints three timings (median ms):

- ``build+copy``: `batch_to_torch(..., pin_memory=True, device="cuda")` plus a synchronize;
- ``h2d ours``: copying our pinned host tensors to the device (non-blocking, then synchronize);
- ``h2d plain``: copying one pinned uint8 tensor of the same bytes (the link's speed).

Without CUDA it prints why and exits 0, so it is safe anywhere.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer


def _median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run(repeats: int = 5) -> list[dict[str, Any]]:
    import torch

    from jobs.bench.to_torch import synthetic_batch
    from pipeline.to_torch import batch_to_torch

    sync = torch.cuda.synchronize
    rows = []
    for b in (256, 1024):
        table = synthetic_batch(b, (128, 1024), (1024, 4096))
        for layout in ("padded", "packed"):
            host = batch_to_torch(table, layout=layout, pin_memory=True)
            if not all(t.is_pinned() for t in host.values()):
                raise SystemExit(f"B={b} {layout}: host tensors are not pinned")
            dev = batch_to_torch(table, layout=layout, device="cuda", pin_memory=True)
            sync()
            plain = batch_to_torch(table, layout=layout)
            for name, t in plain.items():
                if dev[name].device.type != "cuda" or not torch.equal(dev[name].cpu(), t):
                    raise SystemExit(f"B={b} {layout}: {name} differs after the copy")
            nbytes = sum(t.numel() * t.element_size() for t in host.values())
            flat = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            rows.append({
                "batch_size": b, "layout": layout, "mib": nbytes / 2**20,
                "build_copy_ms": _median_ms(lambda t=table, lay=layout: batch_to_torch(
                    t, layout=lay, device="cuda", pin_memory=True), repeats, sync),
                "h2d_ours_ms": _median_ms(lambda h=host: [v.to("cuda", non_blocking=True)
                                                         for v in h.values()], repeats, sync),
                "h2d_plain_ms": _median_ms(lambda f=flat: f.to("cuda", non_blocking=True),
                                           repeats, sync)})
    return rows


def main(
    repeats: Annotated[int, typer.Option(help="timed copies per figure (the median is shown)")] = 5,
) -> None:
    """Check `to_torch` on a CUDA device: device tensors equal the host ones, host tensors are
    pinned, and the host-to-device copy costs about what a plain copy of the same bytes does.

    Without CUDA (or torch) it says so and exits 0.

    Examples:
        replaylake dev gpu-check
        replaylake dev gpu-check --repeats 20
    """
    try:
        import torch
    except ImportError:
        print("gpu-check: torch is not installed; nothing to check")
        return
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device; skipped")
        return
    print(f"gpu-check on {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
    print(f"{'B':>5} {'layout':>7} {'MiB':>6} {'build+copy':>11} {'h2d ours':>9} "
          f"{'h2d plain':>10} {'ours/plain':>10}")
    for r in run(repeats):
        print(f"{r['batch_size']:>5} {r['layout']:>7} {r['mib']:>6.0f} "
              f"{r['build_copy_ms']:>11.1f} {r['h2d_ours_ms']:>9.2f} {r['h2d_plain_ms']:>10.2f} "
              f"{r['h2d_ours_ms'] / r['h2d_plain_ms']:>9.2f}x")
    print("all device tensors equal the host tensors; host tensors pinned")


if __name__ == "__main__":
    from jobs.cli import run as run_command
    run_command(main)       # through the one handler of user errors
