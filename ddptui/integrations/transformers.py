"""DdptuiCallback for the Hugging Face Trainer, by its public name: the callback lives in the rank's side
(ddptui/rank/integrations/transformers.py), where every rank of a run loads it."""

from ddptui.rank.integrations.transformers import DdptuiCallback

__all__ = ["DdptuiCallback"]
