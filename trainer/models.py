"""Building the network: a torchvision classifier by name or a user's `pkg.module:function`.

The class count and the input channels follow the data; a 1-channel set gets its first conv
rebuilt for one channel (the d2l multi-GPU chapter's move), so resnet18 trains on MNIST.
"""

from __future__ import annotations

import inspect

from torch import nn

from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.training import check_model_name
from ddptui_trainer.pipeline.datasets import load_callable


def build_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """A freshly initialised model for `num_classes` outputs and `in_channels` inputs."""
    if ":" in name:
        fn = load_callable(name, "model")
        params = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in (("num_classes", num_classes), ("in_channels", in_channels))
                  if k in params or any(p.kind == p.VAR_KEYWORD for p in params.values())}
        model = fn(**kwargs)
        if not isinstance(model, nn.Module):
            raise UsageError(f"model {name} returned {type(model).__name__}, not a torch.nn.Module")
        if "in_channels" in kwargs:
            return model  # it was built for the data's channels
    else:
        check_model_name(name)
        kwargs = {"image_size": image_size} if name.startswith(("vit_", "maxvit")) else {}
        if name in ("inception_v3", "googlenet"):
            kwargs["aux_logits"] = False
            kwargs["init_weights"] = True
        from torchvision import models  # 1.1 s: a user's own model never pays it

        model = models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    if in_channels != 3:
        adapt_first_conv(model, in_channels)
    return model

def adapt_first_conv(model: nn.Module, in_channels: int) -> None:
    """Replace the first Conv2d with one of the same shape that takes `in_channels`."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                if child.in_channels == in_channels:
                    return
                setattr(parent, child_name, nn.Conv2d(
                    in_channels, child.out_channels, child.kernel_size, child.stride,
                    child.padding, child.dilation, child.groups, child.bias is not None,
                    child.padding_mode))
                return
    raise UsageError(f"{type(model).__name__} has no Conv2d to adapt to {in_channels} channels "
                     "(a model function of your own can take in_channels)")

def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
