"""DdptuiCallback for Keras 3 on the torch backend, by its public name: the callback lives in the rank's side
(ddptui/rank/integrations/keras.py), where every rank of a run loads it."""

from ddptui.rank.integrations.keras import DdptuiCallback

__all__ = ["DdptuiCallback"]
