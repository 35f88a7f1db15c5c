"""The runs this user started on this machine, for `ddptui ls`: each run ddptui owns leaves a
small record in the user's runtime folder (mode 0700), kept after its end to say how it ended.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from ddptui.contract.observe.endings import last_run_event
from ddptui.contract.options.errors import UsageError
from ddptui.contract.protocol.codec import dumps, parse
from ddptui.contract.runs.runtime_dir import RuntimeDir, safe_name
from ddptui.contract.safe_text import escaped

KEPT_S = 7 * 24 * 3600  # an ended run's record is dropped after a week
# Set by a dashboard in the run's own process it starts: the log that process writes (and that
# it is that process: it serves the dashboard, its output goes to a file).
HOST_ENV = "DDPTUI_HOST"


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
    reason: str = ""  # why it ended, where its log could not say (record_end)
    metrics: str = ""  # its Prometheus endpoint (--metrics)


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


def register(log: str, meta: dict, socket: str = "", metrics: str = "") -> str | None:
    """Record the run ddptui is starting in this process; the record's name in the runtime
    folder, or None where the folder cannot be used (the run goes on: ls will not list it)."""
    name = run_name(log)
    record = RunRecord(name, os.getpid(), meta.get("script") or meta.get("model") or "?",
                       int(meta.get("world_size") or 0), os.path.abspath(log), time.time(),
                       socket=socket, metrics=metrics)
    file = f"{name}.{os.getpid()}.json"
    if not safe_name(file):
        return None
    try:
        with RuntimeDir() as folder:
            folder.write(file, dumps(record.__dict__).encode())
    except OSError:
        return None
    return file


def record_end(file: str | None, status: str, reason: str) -> None:
    """Say in the run's record how it ended, where its log could not (a full disk): ls reads
    it there."""
    if file is None:
        return
    try:
        with RuntimeDir() as folder:
            record = parse(folder.read(file))
            if record is None:
                return
            record.update(state=status, reason=reason)
            folder.write(file, dumps(record).encode())
    except (OSError, ValueError):
        pass


def runs(now: float | None = None, warn=lambda text: None) -> list[RunRecord]:
    """This user's runs, newest first: a live one `running`, an ended one as its record or its
    log says. A record that cannot be read, or whose fields are not what a run writes, is
    skipped and `warn`ed of; an ended run's record and output are removed after a week."""
    now = time.time() if now is None else now
    found = []
    with RuntimeDir() as folder:
        for file in folder.names():
            if not file.endswith(".json"):
                continue
            try:
                record = parse_record(folder.read(file))
            except (OSError, ValueError) as e:
                warn(f"skipped the run record {escaped(file)}: {escaped(str(e))}")
                continue
            if not is_running(record):
                record.state = record.state if record.state != "running" else \
                    end_status(record.log)
                if now - record.started > KEPT_S:
                    folder.remove(file)
                    if safe_name(f"{record.name}.out"):
                        folder.remove(f"{record.name}.out")
                    continue
            found.append(record)
    return sorted(found, key=lambda r: r.started, reverse=True)


def parse_record(data: bytes) -> RunRecord:
    """A record's fields, each of the type a run writes (ValueError says which is not)."""
    fields = parse(data)
    if fields is None:
        raise ValueError("not a JSON object")
    for name, kind in _FIELDS.items():
        if name in fields and not (isinstance(fields[name], kind)
                                   and not isinstance(fields[name], bool)):
            raise ValueError(f"its {name} is not a {kind[0].__name__}")
    missing = [n for n in ("name", "pid", "what", "ranks", "log", "started") if n not in fields]
    if missing:
        raise ValueError(f"it has no {', '.join(missing)}")
    if not safe_name(fields["name"]):
        raise ValueError("its name is not a name")
    if fields["pid"] <= 0:
        raise ValueError("its pid is not a process id")
    return RunRecord(**{n: fields[n] for n in _FIELDS if n in fields})


_FIELDS = {"name": (str,), "pid": (int,), "what": (str,), "ranks": (int,), "log": (str,),
           "started": (float, int), "state": (str,), "socket": (str,), "reason": (str,),
           "metrics": (str,)}


def find(name: str | None) -> RunRecord:
    """The live run named `name` (or by a prefix of its name that no other live run shares), or
    the newest live run; LookupError says why there is none."""
    if name is not None and not name:
        raise LookupError("an empty run name names no run (ddptui ls lists them)")
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
        raise LookupError(f"run {escaped(name)} has ended ({ended[0].state})" if ended else
                          f"no running run of yours is named {escaped(name)} (ddptui ls lists "
                          "them)")
    raise LookupError(f"{escaped(name)} names {len(matches)} running runs: "
                      + ", ".join(r.name for r in matches))


def is_running(record: RunRecord) -> bool:
    """Its process still runs (and is the one that started: a pid may be used again)."""
    try:
        process = psutil.Process(record.pid)
        return process.create_time() <= record.started + 1 and \
            process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_status(log: str) -> str:
    """The last `run` event's status in the log's tail (an hour's log is tens of MB)."""
    end = last_run_event(log)
    return end.status if end is not None else "ended"
