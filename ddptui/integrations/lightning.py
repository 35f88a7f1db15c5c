"""DdptuiCallback for Lightning, by its public name: the callback lives in the rank's side
(ddptui/rank/integrations/lightning.py), where every rank of a run loads it."""

from ddptui.rank.integrations.lightning import DdptuiCallback

__all__ = ["DdptuiCallback"]
