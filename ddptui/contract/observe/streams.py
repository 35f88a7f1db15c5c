"""Where each rank's stdout and stderr go besides its .rankN.out file, as torchrun routes them:
--redirects (files only), --tee (files and console, each line prefixed), --local-ranks-filter.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from dataclasses import dataclass
from string import Template

OUT, ERR = 1, 2  # torchrun's Std: 1 stdout, 2 stderr, 3 both
DEFAULT_PREFIX = "[${role_name}${local_rank}]:"  # torchrun's header of a tee'd line
ROLE = "default"


def std_spec(text: str) -> str:
    """An argparse type: torchrun's --redirects/--tee value, '3' for every rank or '0:1,1:2'
    per local rank."""
    try:
        std_map(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: 0, 1 (stdout), 2 (stderr), 3 (both), or per local rank: 0:3,1:1"
        ) from None
    return text


def std_map(text: str, n: int) -> dict[int, int]:
    """The streams each local rank 0..n-1 has the option for, as torchrun's Std.from_str reads
    the value (ranks a mapping does not name: none)."""
    text = text.strip()
    if text.isdigit():
        if int(text) > OUT | ERR:
            raise ValueError(text)
        return dict.fromkeys(range(n), int(text))
    found = {}
    for item in text.split(","):
        rank, sep, std = item.partition(":")
        if not sep or not rank.strip().isdigit() or std.strip() not in ("0", "1", "2", "3"):
            raise ValueError(text)
        found[int(rank)] = int(std)
    return {r: found.get(r, 0) for r in range(n)}


def ranks_filter(text: str) -> tuple[int, ...]:
    """An argparse type: --local-ranks-filter 0,1."""
    try:
        ranks = tuple(int(x) for x in text.split(","))
    except ValueError:
        ranks = ()
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: local ranks, e.g. 0 or 0,1")
    return ranks


@dataclass(frozen=True)
class Route:
    """One stream of one rank: to the console (raw, or line by line after `prefix`), and to
    torchrun's log file."""

    console: bool
    prefix: bytes | None = None
    file: str | None = None


@dataclass(frozen=True)
class Routing:
    """The console and file options of one run (torchrun's)."""

    redirects: str = "0"
    tee: str = "0"
    only: tuple[int, ...] | None = None  # --local-ranks-filter
    prefix_template: str | None = None
    log_dir: str | None = None

    def attempt_dir(self, run_id: str, restart: int, base: list[str]) -> str | None:
        """torchrun's <log dir>/<run id>_<random>/attempt_<restart>, made on first use; `base`
        keeps the run's folder between attempts."""
        if self.log_dir is None:
            return None
        if not base:
            os.makedirs(self.log_dir, exist_ok=True)
            base.append(tempfile.mkdtemp(prefix=f"{run_id}_", dir=self.log_dir))
        path = os.path.join(base[0], f"attempt_{restart}")
        os.makedirs(path, exist_ok=True)
        return path

    def routes(self, slot: int, n: int, attempt_dir: str | None) -> tuple[Route, Route]:
        """(stdout, stderr) of local rank `slot` of `n`."""
        tee = std_map(self.tee, n).get(slot, 0)
        to_file = std_map(self.redirects, n).get(slot, 0) | tee
        shown = self.only is None or slot in self.only
        template = self.prefix_template or os.environ.get(
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or DEFAULT_PREFIX
        prefix = Template(template).safe_substitute(
            role_name=ROLE, rank=slot, local_rank=slot,
            hostname=socket.gethostname() if "${hostname}" in template else "").encode()
        folder = os.path.join(attempt_dir, str(slot)) if attempt_dir else None
        if folder:
            os.makedirs(folder, exist_ok=True)
        out, err = (Route(
            console=shown and not (to_file & std and not tee & std),
            prefix=prefix if tee & std else None,
            file=os.path.join(folder, name) if folder and to_file & std else None)
            for std, name in ((OUT, "stdout.log"), (ERR, "stderr.log")))
        return out, err

    def error_file(self, slot: int, attempt_dir: str | None) -> str | None:
        """torchrun's place for the rank's error.json under --log-dir."""
        return os.path.join(attempt_dir, str(slot), "error.json") if attempt_dir else None
