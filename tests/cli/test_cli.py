"""Bad input is one line on stderr and exit code 2, before any process starts; the CLI never
imports torch; the model list matches torchvision."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.errors import UsageError
from tests.helpers.runs import ROOT, ddptui


@pytest.mark.parametrize("args, says", [
    (["run", "resnt18"], "unknown model 'resnt18' (did you mean resnet18"),
    (["run", "resnet18", "--gpus", "abc"], "no NVIDIA GPU found"),
    (["run", "resnet18", "--data", "imagefolder:/no/such/dir"], "data path not found: /no/such/dir"),
    (["run", "resnet18", "--data", "mnist"], "needs a path"),
    (["run", "resnet18", "--data", "lmdb:/x"], "unknown --data"),
    (["run", "resnet18", "--batch-size", "0"], "--batch-size: must be at least 1"),
    (["run", "resnet18", "--epochs", "-1"], "--epochs: must be at least 1"),
    (["run", "resnet18", "--cpus", "0"], "--cpus: must be at least 1"),
    (["run", "resnet18", "--checkpoint-dir", "/etc/passwd/ckpt"], "--checkpoint-dir is not writable"),
    (["run", "resnet18", "--resume"], "--resume needs --checkpoint-dir"),
    (["run", "resnet18", "--resume", "/no/ckpt.pt"], "checkpoint not found"),
    (["run", "resnet18", "--resume", "half.pt"], "cannot resume from half.pt: unreadable (truncated"),
    (["run", "nosuchpkg.models:net"], "model module not found: nosuchpkg.models"),
    (["run", "resnet18", "--amp", "fp8"], "invalid choice: 'fp8'"),
    (["replay", "/no/such.jsonl"], "no such log"),
    (["replay", "half.pt"], "half.pt is not a ddptui log: line 1 is not one of its events"),
    (["replay", "empty.jsonl", "--csv"], "empty.jsonl is not a ddptui log: it is empty"),
    (["replay", f"{ROOT}/tests/data/run-2cpu.jsonl", "--csv", "/proc/x.csv"],
     "cannot write /proc/x.csv"),
    (["run", "resnet18", "--report", "127.0.0.1:29600"], "--report is for ranks started by"),
    (["run", "resnet18", "--max-restarts", "-1"], "--max-restarts: must be 0 or more"),
    (["attach", "--listen", "nohost"], "bad --listen 'nohost': expected HOST:PORT"),
    (["run", "resnet18", "--strategy", "dp"], "--strategy dp needs GPUs"),
    (["run", "resnet18", "--stall-after", "0"], "--stall-after: must be above 0"),
    (["run", "resnet18", "--on-stall", "kill"], "invalid choice: 'kill'"),
    (["run", "resnet18", "--max-bad-samples", "-1"], "--max-bad-samples: must be 0 or more"),
    (["run"], "say what to train: a model (ddptui run resnet18), your own script"),
    (["run", "--cpus", "2"], "say what to train"),
    (["run", "resnet18", "--log", "/proc/x.jsonl"],
     "--log /proc/x.jsonl: cannot write this file (/proc takes no new files)"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, tmp_path, cli_main):
    """In this process (the validation is what is tested; a process each cost a second)."""
    (tmp_path / "half.pt").write_bytes(b"PK\x03\x04" + bytes(996))  # a zip cut before its directory
    (tmp_path / "empty.jsonl").write_text("\n")
    code, err = cli_main(args)
    assert code == 2, err
    assert len(err) == 1, err
    assert says in err[0]
    assert not (tmp_path / "runs").exists()  # nothing started, no log written


def test_bad_input_from_the_command_line_is_one_line_no_traceback(env, tmp_path):
    r = ddptui(["run", "resnt18"], env, tmp_path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("ddptui: error: unknown model 'resnt18' (did you mean resnet18")
    assert not (tmp_path / "runs").exists()


def test_bad_input_is_answered_before_torch_is_imported(env, tmp_path):
    """An unknown model was refused only after torchvision had been imported to list its models
    (6.9 s on a 2-core machine); no check may need torch."""
    code = ("import sys\n"
            "from ddptui.cli import main\n"
            "for argv in (['run', 'resnet1000'], ['run', 'vit_b_99', '--cpus', '2'], ['run'],\n"
            "             ['run', 'resnet18', '--log', '/proc/x.jsonl']):\n"
            "    try:\n"
            "        assert main(argv) == 2, argv\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 2, argv\n"
            "sys.exit(3 if {'torch', 'torchvision'} & set(sys.modules) else 0)")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 4
    assert "unknown model 'vit_b_99' (did you mean vit_b_32, vit_b_16" in r.stderr


def test_mnist_missing_files_are_named(env, tmp_path):
    r = ddptui(["run", "resnet18", "--data", f"mnist:{tmp_path}"], env, tmp_path)
    assert r.returncode == 2
    assert "MNIST/raw/train-images-idx3-ubyte" in r.stderr


def test_gpu_selection_rules():
    assert resolve_devices(None, None, count=0) == (None, 2)
    assert resolve_devices(None, None, count=2) == ((0, 1), None)
    assert resolve_devices("all", None, count=4) == ((0, 1, 2, 3), None)
    assert resolve_devices("1,0", None, count=2) == ((1, 0), None)
    assert resolve_devices(None, 3, count=2) == (None, 3)
    for gpus, text in (("0,9", "no GPU 9"), ("0,0", "twice"), ("x", "bad --gpus")):
        with pytest.raises(UsageError, match=text):
            resolve_devices(gpus, None, count=2)
    with pytest.raises(UsageError, match="either --gpus or --cpus"):
        resolve_devices("0", 2, count=2)


def test_gpus_command_lists_what_nvml_sees(env, tmp_path):
    """One line per GPU under a header, or one line saying there is none (CI's machine)."""
    from ddptui.contract.nvml import gpu_count

    r = ddptui(["gpus"], env, tmp_path)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    n = gpu_count()
    if n == 0:
        assert lines == ["no NVIDIA GPU found"]
    else:
        assert lines[0].split()[:2] == ["GPU", "name"] and len(lines) == n + 1


def test_help_has_examples_and_version(env, tmp_path):
    r = ddptui(["run", "--help"], env, tmp_path)
    assert r.returncode == 0 and "ddptui run resnet18 --gpus 0,1" in r.stdout
    assert "--prefetch, --no-prefetch" in r.stdout
    assert "DDPTUI_PYCACHE=0|1" in r.stdout
    r = ddptui(["--version"], env, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ddptui ")


def test_the_dashboard_path_never_imports_torch(env):
    code = ("import sys, ddptui.cli, ddptui.dashboard.view.app, ddptui.run.builtin.supervisor, "
            "ddptui.dashboard.sources.replay, ddptui.contract.console, trainer.bootstrap; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT).returncode == 0


def test_model_list_matches_torchvision():
    import torchvision.models

    from ddptui.contract.options.model_names import classifier_names

    known = torchvision.models.list_models(module=torchvision.models)
    assert classifier_names() == tuple(sorted(known)) and "resnet18" in known


def test_report_without_a_key_is_one_line_and_exit_2(env, tmp_path):
    env = dict(env, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    env.pop("DDPTUI_AUTHKEY", None)
    r = subprocess.run([sys.executable, "-m", "ddptui_trainer", "resnet18", "--report", "127.0.0.1:9"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "python -m ddptui_trainer: error: no key for the dashboard link: set DDPTUI_AUTHKEY, or copy "
        f"the key file `ddptui attach` printed to {tmp_path}/cfg/ddptui/authkey"]


def test_attach_makes_a_private_key_file_and_refuses_a_busy_port(env, tmp_path):
    import socket

    env = dict(env, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    env.pop("DDPTUI_AUTHKEY", None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = ddptui(["attach", "--listen", f"127.0.0.1:{port}", "--headless"], env, tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"ddptui: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    key = tmp_path / "cfg" / "ddptui" / "authkey"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64


def test_each_option_fills_its_section_and_replace_finds_it():
    """The command line is generated from RunConfig's sections: every flag lands in its section,
    the launch and health options in ddptui's RunPolicy, never in what the ranks get."""
    import dataclasses

    from ddptui.cli import build_parser
    from ddptui.contract.options.config import RunConfig
    from ddptui.contract.options.parser import from_args
    from ddptui.contract.options.policy import RunPolicy
    from ddptui.contract.options.training import config_from_args

    args = build_parser().parse_args([
        "run", "resnet50", "--data", "synthetic", "--batch-size", "8", "--no-prefetch",
        "--amp", "bf16", "--checkpoint-every", "3", "--telemetry-hz", "2", "--cpus", "3",
        "--seed", "7", "--max-restarts", "2", "--stall-after", "12", "--on-stall", "recover"])
    config = config_from_args(args, gpus=None, cpus=args.cpus)
    assert (config.model.name, config.model.amp, config.data.kind, config.data.prefetch) == \
        ("resnet50", "bf16", "synthetic", False)
    assert (config.train.batch_size, config.train.seed, config.checkpoint.every,
            config.telemetry.hz, config.devices.world_size) == (8, 7, 3, 2.0, 3)
    assert from_args(RunPolicy, args) == RunPolicy(max_restarts=2, stall_after=12.0,
                                                   on_stall="recover")
    sections = [f.name for s in dataclasses.fields(RunConfig) for f in
                dataclasses.fields(s.default_factory())]
    assert len(sections) == len(set(sections))  # replace() routes a field by its name alone
    changed = config.replace(batch_size=16, cudnn_benchmark=False)
    assert (changed.train.batch_size, changed.model.cudnn_benchmark, changed.model.amp) == \
        (16, False, "bf16")
    with pytest.raises(TypeError):
        config.replace(stall_after=3)  # ddptui's own, not the ranks'


def test_replay_csv_writes_the_epochs_table_as_the_log_recorded_it(tmp_path, cli_main, capsys):
    import csv
    import json
    import os

    log = os.path.join(ROOT, "tests", "data", "run-2cpu.jsonl")
    code, _ = cli_main(["replay", log, "--csv", str(tmp_path / "epochs.csv")])
    assert code == 0
    with open(tmp_path / "epochs.csv") as f:
        rows = list(csv.DictReader(f))
    with open(log) as f:
        rank0 = [e for e in map(json.loads, f) if e["kind"] == "epoch" and e["rank"] == 0]
    assert [int(r["epoch"]) for r in rows] == [e["epoch"] for e in rank0]
    assert [float(r["train_loss"]) for r in rows] == \
        [float(f"{e['train_loss']:.6g}") for e in rank0]
    assert all(r["workers"] and r["world_size"] == "2" for r in rows)


def test_a_partly_broken_log_plays_and_names_its_first_bad_line(tmp_path, env, cli_main):
    """A log cut short by a crash (or written over) still plays; what was skipped is named."""
    with open(os.path.join(ROOT, "tests", "data", "run-2cpu.jsonl")) as f:
        lines = f.readlines()
    log = tmp_path / "broken.jsonl"
    log.write_text("".join(lines[:5]) + '{"kind": "step", "ra\n' + "".join(lines[5:]) + "\0\0\n")
    r = ddptui(["replay", str(log), "--speed", "0"], env, tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if "not a ddptui event" in line]
    assert said == [f"warning: {log} line 6 is not a ddptui event: skipped",
                    f"warning: {log} line 6 is not a ddptui event: skipped (and 1 more such line)"]
    out = r.stdout.splitlines()
    end = next(i for i, line in enumerate(out) if line.startswith("done in"))
    assert out[end + 1].startswith("verdict: ")  # the run's, from its log, after its exit line
    code, err = cli_main(["replay", str(log), "--csv", str(tmp_path / "e.csv")])
    assert code == 0 and err[0].endswith("line 6 is not a ddptui event: skipped (and 1 more such line)")
