"""The runs this user started on this machine, for `ddptui ls`: each run ddptui owns leaves a
small record in the user's runtime folder (mode 0700), kept after its end to say how it ended.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import psutil

from ddptui.observe.endings import tail_lines
from ddptui.options.errors import UsageError

KEPT_S = 7 * 24 * 3600  # an ended run's record is dropped after a week


@dataclass
class RunRecord:
    name: str
    pid: int
    what: str  # the model, or the script and its arguments
    ranks: int
    log: str
    started: float
    state: str = "running"  # or the run's end status from its log: done, failed, interrupted
    socket: str = ""  # where its dashboards connect (ddptui attach NAME)


def default_log_path() -> str:
    """runs/<time>.jsonl, claimed (made empty) so that a run started in the same second gets
    runs/<time>-2.jsonl: two runs never share a log, nor a name."""
    stem, n = os.path.join("runs", time.strftime("%Y-%m-%dT%H-%M-%S")), 1
    while True:
        path = f"{stem}-{n}.jsonl" if n > 1 else f"{stem}.jsonl"
        try:
            os.makedirs("runs", exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            n += 1
        except OSError as e:
            raise UsageError(f"cannot write the run's log in {os.path.abspath('runs')}: "
                             f"{e.strerror or e} (--log FILE.jsonl puts it elsewhere)") from None


def run_name(log: str) -> str:
    """A run is named after its log: runs/2026-11-29T10-00-00.jsonl is 2026-11-29T10-00-00."""
    return os.path.splitext(os.path.basename(log))[0]


def folder() -> str:
    """$XDG_RUNTIME_DIR/ddptui, else /tmp/ddptui-UID: made 0700, and refused if another user
    owns it or others may write to it (a record there names logs that ls would read)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "ddptui") if base else f"/tmp/ddptui-{os.getuid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{path} is not this user's own folder (owner {info.st_uid}, "
                              f"mode {oct(info.st_mode & 0o777)})")
    return path


def register(log: str, meta: dict, socket: str = "") -> str | None:
    """Record the run ddptui is starting in this process; the record's path, or None where the
    folder cannot be used (the run goes on: ls will not list it)."""
    name = run_name(log)
    record = RunRecord(name, os.getpid(), meta.get("script") or meta.get("model") or "?",
                       int(meta.get("world_size") or 0), os.path.abspath(log), time.time(),
                       socket=socket)
    try:
        path = os.path.join(folder(), f"{name}.{os.getpid()}.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(record.__dict__, f)
    except OSError:
        return None
    return path


def runs(now: float | None = None) -> list[RunRecord]:
    """This user's runs, newest first: a live one `running`, an ended one as its log says."""
    now = time.time() if now is None else now
    found = []
    for entry in os.scandir(folder()):
        if not entry.name.endswith(".json"):
            continue
        try:
            with open(entry.path) as f:
                record = RunRecord(**json.load(f))
        except (OSError, ValueError, TypeError):
            continue
        if not _alive(record):
            record.state = _end_status(record.log)
            if now - record.started > KEPT_S:
                for path in (entry.path, os.path.join(os.path.dirname(entry.path),
                                                      f"{record.name}.out")):
                    if os.path.exists(path):
                        os.unlink(path)
                continue
        found.append(record)
    return sorted(found, key=lambda r: r.started, reverse=True)


def find(name: str | None) -> RunRecord:
    """The live run named `name` (or by a prefix of its name that no other live run shares), or
    the newest live run; LookupError says why there is none."""
    live = [r for r in runs() if r.state == "running" and r.socket]
    if not live:
        raise LookupError("no run of yours is running on this machine (ddptui ls lists them)")
    if name is None:
        return live[0]
    exact = [r for r in live if r.name == name]
    matches = exact or [r for r in live if r.name.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        ended = [r for r in runs() if r.name == name]
        raise LookupError(f"run {name} has ended ({ended[0].state})" if ended else
                          f"no running run of yours is named {name} (ddptui ls lists them)")
    raise LookupError(f"{name} names {len(matches)} running runs: "
                      + ", ".join(r.name for r in matches))


def _alive(record: RunRecord) -> bool:
    """Its process still runs (and is the one that started: a pid may be used again)."""
    try:
        process = psutil.Process(record.pid)
        return process.create_time() <= record.started + 1 and \
            process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _end_status(log: str) -> str:
    """The last `run` event's status in the log's tail (an hour's log is tens of MB)."""
    for line in reversed(tail_lines(log)):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("kind") == "run" and ev.get("status") not in (None, "started"):
            return ev["status"]
    return "ended"
