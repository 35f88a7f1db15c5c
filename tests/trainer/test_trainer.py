"""The trainer as a user meets it: torchrun launches, every data kind, learning, checkpoints and
exact resume. Real processes, 2 gloo ranks on CPU."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import torch
from PIL import Image

from tests.helpers.runs import ROOT, TINY, ddptui, events, run_config, run_env


def test_the_built_in_loop_runs_from_a_folder_that_holds_a_trainer_py(env, tmp_path):
    """`ddptui`, the installed command, and `python -m ddptui` in a project with a trainer.py of
    its own in the working folder (a common name): ddptui and its ranks import ddptui's trainer
    package, never the user's."""
    (tmp_path / "trainer.py").write_text("raise SystemExit(\"the user's trainer.py ran\")\n")
    command = os.path.join(os.path.dirname(sys.executable), "ddptui")
    log = tmp_path / "x.jsonl"
    r = subprocess.run([command, "run", *TINY, "--cpus", "2", "--epochs", "1", "--headless",
                        "--log", str(log)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert events(log, "run")[-1]["status"] == "done"
    # `python -m ddptui` puts that folder first on its own path too
    r = subprocess.run([sys.executable, "-m", "ddptui", "gpus"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]


def test_torchrun_trains_on_synthetic_data_and_logs_both_ranks(env, tmp_path):
    """Under torchrun, without ddptui; --data synthetic: one batch made on the device, served
    every step (compute only), which the model learns."""
    log = tmp_path / "run.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ddptui_trainer", "--", "tests.helpers.userpkg:tiny_cnn", "--data", "synthetic",
           "--image-size", "16", "--batch-size", "16", "--epochs", "2", "--steps-per-epoch", "6",
           "--log", str(log)]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "epoch 1:" in r.stdout and r.stdout.count("training done") == 1  # rank 0 prints
    for kind in ("step", "epoch"):  # (device figures: test_lifecycle's normal end)
        assert {e["rank"] for e in events(log, kind)} == {0, 1}, kind
    assert [e["steps"] for e in events(log, "epoch")] == [6] * 4  # 2 epochs x 2 ranks
    losses = [e["train_loss"] for e in events(log, "epoch") if e["rank"] == 0]
    assert losses[1] < losses[0]


def _write_mnist(root, n_train=64, n_test=32):
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = torch.randint(0, 10, (n,), generator=g, dtype=torch.uint8)
        images = torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images.numpy().tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, n) + labels.numpy().tobytes())


def test_mnist_format_is_read_and_resnet18_takes_its_one_channel(tmp_path):
    """--data mnist:PATH (torchvision's files, never downloaded) gives one-channel samples of
    the ten classes, and resnet18 is built for one channel: a batch of them goes through (the
    2-rank loop itself is the other tests' subject)."""
    from ddptui_trainer.models import build_model
    from ddptui_trainer.pipeline.datasets import build_datasets

    _write_mnist(tmp_path / "mnist")
    config = run_config("resnet18", "--data", f"mnist:{tmp_path / 'mnist'}", "--batch-size", "8")
    bundle = build_datasets(config, progress=lambda text: None)
    assert (bundle.num_train, bundle.num_classes, bundle.in_channels) == (64, 10, 1)
    image, label = bundle.train[(0, 0)]
    assert image.shape[0] == 1 and 0 <= int(label) < 10
    model = build_model("resnet18", bundle.num_classes, bundle.in_channels,
                        config.data.resolved_image_size)
    batch = torch.stack([bundle.val[(0, i)][0] for i in range(4)]).float()
    assert model.eval()(batch).shape == (4, 10)


@pytest.fixture(scope="module")
def tiny_run(cache_dir, tmp_path_factory):
    """One run of the user's model and dataset functions, read by the tests that follow (a
    run costs the suite two ranks' start-up)."""
    out = tmp_path_factory.mktemp("tiny")
    r = ddptui(["run", *TINY, "--cpus", "2", "--epochs", "3", "--lr", "0.1", "--tensorboard",
                str(out / "tb"), "--log", str(out / "run.jsonl")], run_env(cache_dir), ROOT)
    assert r.returncode == 0, r.stderr
    return out


def test_user_model_and_dataset_functions_learn(tiny_run):
    rank0 = [e for e in events(tiny_run / "run.jsonl", "epoch") if e["rank"] == 0]
    assert rank0[-1]["val_acc"] > 0.6  # four classes: chance is 0.25


def test_tensorboard_gets_every_rank_s_scalars(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tiny_run / "tb"
    files = os.listdir(tb)
    assert {f.rsplit(".", 1)[1] for f in files} == {"rank0", "rank1"}, files  # a file per rank
    run = EventAccumulator(str(tb))  # TensorBoard's view of the directory: one run
    run.Reload()
    scalars = set(run.Tags()["scalars"])
    assert {"loss/rank0", "loss/rank1", "img_per_s/rank1", "val_acc", "train_loss"} <= scalars
    assert [round(s.step) for s in run.Scalars("val_acc")] == [0, 1, 2]  # one point per epoch


def _jpeg_folder(root, per_class: int = 8) -> None:
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (40, 40), (i * 30, 0, 0)).save(root / cls / f"{i}.jpg")


def test_corrupt_image_is_exit_2_naming_the_file(env, tmp_path):
    """With --decode gpu the sample is read on the prefetching thread: its error still ends
    the run as bad input (--max-bad-samples 0: the first one does). --decode cpu raises the same
    worker error on the training thread itself, the simpler path, so it has no run of its own."""
    _jpeg_folder(tmp_path / "imgs")
    bad = tmp_path / "imgs" / "a" / "3.jpg"
    bad.write_bytes(b"\xff\xd8 this is not a jpeg")
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--data",
                f"imagefolder:{tmp_path / 'imgs'}", "--batch-size", "4", "--workers", "1",
                "--decode", "gpu", "--epochs", "1", "--max-bad-samples", "0"], env, ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "corrupt or unreadable sample" in line and str(bad) in line


def test_decode_gpu_prefetch_thread_keeps_its_workers_across_epochs(env, tmp_path):
    """The prefetching thread ends with each epoch; the persistent workers it read from must
    not end with it (they die with the thread that forked them). The rank says which decoder
    it uses. Validation loads ahead and sees every held-out image once."""
    _jpeg_folder(tmp_path / "imgs", per_class=16)
    log = tmp_path / "run.jsonl"
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--data",
                f"imagefolder:{tmp_path / 'imgs'}", "--batch-size", "4", "--workers", "1",
                "--decode", "gpu", "--epochs", "3", "--log", str(log)], env, ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    done = [(e["rank"], e["epoch"]) for e in events(log, "epoch")]
    assert sorted(done) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {e["settings"]["prefetch"] for e in events(log, "epoch")} == {True}
    said = [e["text"] for e in events(log, "message") if e.get("decoder")]
    assert said == ["--decode gpu: JPEGs decoded in the rank process (CPU rank) by torchvision "
                    "libjpeg (whole images)"]
    # 32 images, every 20th held out: each validation, its batches loading since the epoch's
    # first step (3 steps, all within VAL_AHEAD of the end), counts both once.
    assert [e["val_samples"] for e in events(log, "epoch")] == [2] * 6
    assert all(e["val_acc"] is not None for e in events(log, "epoch"))


def _final_state(directory):
    (final,) = [f for f in os.listdir(directory) if f.startswith("ckpt-e0002-s000000")]
    return torch.load(os.path.join(directory, final), weights_only=True)


def test_resume_skips_a_truncated_checkpoint_and_equals_uninterrupted_training(env, tmp_path):
    common = [*TINY, "--cpus", "2", "--epochs", "2", "--steps-per-epoch", "6", "--deterministic",
              "--checkpoint-dir", str(tmp_path)]
    r = ddptui(["run", *common, "--checkpoint-every", "3"], env, ROOT)
    assert r.returncode == 0, r.stderr
    uninterrupted = _final_state(tmp_path)
    # Pretend the run died after epoch 1 step 3: only the checkpoints up to there exist, and a
    # later one was cut short (a copy or a disk that failed, not our writer: it renames).
    for name in os.listdir(tmp_path):
        if name > "ckpt-e0001-s000003.pt":
            os.unlink(tmp_path / name)
    truncated = tmp_path / "ckpt-e0001-s000005.pt"
    truncated.write_bytes((tmp_path / "ckpt-e0001-s000003.pt").read_bytes()[:1000])
    log = tmp_path / "resume.jsonl"
    r = ddptui(["run", *common, "--resume", "--log", str(log)], env, ROOT)
    assert r.returncode == 0, r.stderr
    texts = [e["text"] for e in events(log, "message")]
    assert any("skipping checkpoint" in t and "e0001-s000005" in t for t in texts)
    assert any("resumed from" in t and "e0001-s000003" in t for t in texts)
    assert truncated.exists()  # reported, never deleted: the user decides
    steps = [e for e in events(log, "epoch") if e["rank"] == 0]
    assert [e["steps"] for e in steps] == [3]  # only the rest of epoch 1 was trained
    sa, sb = uninterrupted, _final_state(tmp_path)
    for key, tensor in sa["model"].items():
        assert torch.equal(tensor, sb["model"][key]), key
    for i, st in sa["optimizer"]["state"].items():
        assert torch.equal(st["momentum_buffer"], sb["optimizer"]["state"][i]["momentum_buffer"])
    assert sa["scheduler"]["last_epoch"] == sb["scheduler"]["last_epoch"]


def test_cifar10_files_that_fail_torchvision_checks_are_exit_2(env, tmp_path):
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"not a pickle")
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--data",
                f"cifar10:{tmp_path / 'cifar'}", "--epochs", "1"], env, ROOT)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "cannot read cifar10" in line


def test_decode_gpu_path_gives_the_cpu_path_s_images(cache_dir, monkeypatch):
    """--decode gpu's crops, decoded and resized by the rank (here on the CPU), match the
    torchvision transforms of the CPU path: the same validation images, the same augmentation."""
    monkeypatch.setenv("DDPTUI_CACHE", cache_dir)
    from ddptui.contract.options.config import DataOptions, RunConfig
    from ddptui.rank.prefetch import Normalize
    from ddptui_trainer.pipeline import gpudecode
    from ddptui_trainer.pipeline.datasets import build_datasets
    from ddptui_trainer.pipeline.gpudecode import Decoder, TorchvisionCodec, collate

    gpu, cpu = (build_datasets(RunConfig(data=DataOptions(decode=d)), progress=lambda _: None)
                for d in ("gpu", "cpu"))
    cpu_dev = torch.device("cpu")
    normalize = Normalize(3, cpu_dev, False)
    decode = Decoder(cpu_dev, 64, normalize, TorchvisionCodec(cpu_dev), undecodable=pytest.fail)
    images, labels = decode(collate([gpu.val[i] for i in range(16)]))
    ref = normalize(torch.stack([cpu.val[i][0] for i in range(16)]))
    assert labels.tolist() == [cpu.val[i][1] for i in range(16)]
    assert images.shape == ref.shape == (16, 3, 64, 64)
    assert (images - ref).abs().mean() < 0.02  # in standard deviations: resampling differences
    # Training crops: the crop the worker drew, flipped where its coin said so; resized 5 at a
    # time, so that each chunk's crops land in their places of the batch.
    monkeypatch.setattr(gpudecode, "CHUNK", 5)
    batch = collate([gpu.train[(0, i)] for i in range(16)])
    crops, _ = decode(batch)
    whole = [TorchvisionCodec(cpu_dev).decode(*batch[:3])[i].float()
             for i in range(16)]
    for i, (top, left, h, w, flip) in enumerate(batch[2].tolist()):
        ref = torch.nn.functional.interpolate(whole[i][None, :, top:top + h, left:left + w],
                                              size=(64, 64), mode="bilinear", antialias=True)
        ref = normalize.standardize(ref.flip(-1) if flip else ref)[0]
        assert (crops[i] - ref).abs().mean() < 0.05, (i, (crops[i] - ref).abs().mean())
    boxes = torch.stack([gpu.train[(0, i)][1] for i in range(200)])
    top, left, h, w, flip = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 72).all() and (left + w <= 72).all()
    area = (h * w).float() / (72 * 72)
    assert 0.3 < area.min() and area.max() <= 1.0 and 0.3 < flip.float().mean() < 0.7


def test_the_cpu_path_reads_every_format_and_crops_as_the_pil_transforms_did(tmp_path):
    """--decode cpu decodes with torchvision and augments uint8 tensors: the same pixels and,
    for a seed, the same crop and flip as PIL with the ImageNet example's transforms; formats
    torchvision does not read (BMP, 16-bit PNG) still load through PIL."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms

    from ddptui_trainer.pipeline.datasets import _imagefolder, load_image

    rng = np.random.default_rng(0)
    pixels = (rng.random((60, 80, 3)) * 64 + np.linspace(0, 180, 80)[None, :, None]).astype("uint8")
    (tmp_path / "a").mkdir()
    files = {"jpg": ("RGB", "JPEG"), "png": ("RGBA", "PNG"), "bmp": ("RGB", "BMP"),
             "gif": ("P", "GIF"), "webp": ("RGB", "WEBP")}
    for ext, (mode, fmt) in files.items():
        Image.fromarray(pixels).convert(mode).save(tmp_path / "a" / f"x.{ext}", fmt)
    Image.fromarray(pixels[..., 0].astype("uint16") * 257).save(tmp_path / "a" / "deep.png")
    for ext in [*files, "png16"]:
        path = tmp_path / "a" / ("deep.png" if ext == "png16" else f"x.{ext}")
        with Image.open(path) as im:
            ref = transforms.functional.pil_to_tensor(im.convert("RGB"))
        got = load_image(str(path))
        assert got.dtype == torch.uint8 and got.shape == ref.shape == (3, 60, 80), ext
        assert (got.int() - ref.int()).abs().float().mean() < 1.5, ext  # JPEG's IDCT rounding
    bundle = _imagefolder(str(tmp_path), None, 32, seed=None)
    pil = transforms.Compose([transforms.RandomResizedCrop(32, scale=(0.35, 1.0), antialias=True),
                              transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    for seed in range(8):
        torch.manual_seed(seed)
        with Image.open(tmp_path / "a" / "x.jpg") as im:
            want = pil(im.convert("RGB"))
        torch.manual_seed(seed)
        got = bundle.train.transform(load_image(str(tmp_path / "a" / "x.jpg")))
        assert (got.int() - want.int()).abs().float().mean() < 3, seed


MINE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

seen = {}


def net(num_classes, in_channels):
    seen.update(num_classes=num_classes, in_channels=in_channels)
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, num_classes))


def data():
    x, y = torch.rand(20, 1, 8, 8), torch.arange(20) % 4
    return TensorDataset(x, y), TensorDataset(x[:4], y[:4])


def not_a_dataset():
    return 3


def flat_images():
    return TensorDataset(torch.rand(5, 64), torch.zeros(5, dtype=torch.long))


def no_label():
    return [torch.rand(3, 8, 8)] * 4


def not_a_module(num_classes):
    return "resnet18"
'''


def test_your_own_model_and_data_get_what_the_docs_promise_and_a_bad_return_is_named(
        tmp_path, monkeypatch):
    """docs/input-pipeline.md's contract of `--data pkg:fn` and `pkg:fn` models."""
    from ddptui.contract.options.errors import DataError, UsageError
    from ddptui_trainer.models import build_model
    from ddptui_trainer.pipeline.datasets import _custom

    (tmp_path / "mine.py").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    bundle = _custom("mine:data", 8, None)
    assert (bundle.num_train, bundle.num_classes, bundle.in_channels) == (20, 4, 1)
    assert len(bundle.val) == 4
    model = build_model("mine:net", bundle.num_classes, bundle.in_channels, 8)
    import mine

    assert mine.seen == {"num_classes": 4, "in_channels": 1}
    assert model(torch.rand(2, 1, 8, 8)).shape == (2, 4)
    for fn, says in [("not_a_dataset", "data mine:not_a_dataset returned int: it must return"),
                     ("flat_images", "data mine:flat_images: an image is Tensor of shape (64,)"),
                     ("no_label", "data mine:no_label: a sample is Tensor; each must be an "
                                  "(image, label) pair")]:
        with pytest.raises(DataError) as e:
            _custom(f"mine:{fn}", 8, None)
        assert str(e.value).startswith(says), e.value
    with pytest.raises(UsageError, match="model mine:not_a_module returned str, not a torch.nn"):
        build_model("mine:not_a_module", 4, 3, 8)
