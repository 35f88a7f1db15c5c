"""--gpus and --cpus read against this machine: which GPUs a run ddptui starts takes, or how many
CPU ranks; one line for a bad choice. Shared by `ddptui run MODEL` and `ddptui run SCRIPT`."""

from __future__ import annotations

from ddptui.contract.options.errors import UsageError


def resolve_devices(gpus: str | None, cpus: int | None,
                    count: int | None = None) -> tuple[tuple[int, ...] | None, int | None]:
    """(--gpus, --cpus) -> (tuple of GPU indices or None, CPU rank count or None)."""
    if gpus is not None and cpus is not None:
        raise UsageError("use either --gpus or --cpus, not both")
    if cpus is not None:
        return None, cpus
    if count is None:
        from ddptui.contract.nvml import gpu_count

        count = gpu_count()
    if gpus is None:
        return (tuple(range(count)), None) if count else (None, 2)
    if count == 0:
        raise UsageError("no NVIDIA GPU found: --gpus needs one (use --cpus N for CPU ranks)")
    if gpus.strip() == "all":
        return tuple(range(count)), None
    try:
        chosen = tuple(int(x) for x in gpus.split(","))
    except ValueError:
        raise UsageError(f"bad --gpus {gpus!r}: use indices like 0,1 or 'all'") from None
    if len(set(chosen)) != len(chosen):
        raise UsageError(f"bad --gpus {gpus!r}: an index appears twice")
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise UsageError(f"--gpus {gpus}: no GPU {bad[0]} (this machine has {count}: "
                         f"0-{count - 1})")
    return chosen, None
