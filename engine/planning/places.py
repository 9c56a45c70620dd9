"""Where a memory plan keeps things: each component between the phases of a run (a phase's placement), and how
a rung of the ladder holds the transformer. Two words for two questions: "device" is said by both, and means
"on the device now" in one and "whole on the device all along" in the other."""
from __future__ import annotations

from engine.events import Named


# In the order the phase table lists them (ui/views/plan_panel.py).
class ComponentPlace(Named):
    """Where a component is in one phase of a run. Each equals its string (plans say "streamed" as before)."""
    DEVICE = "device"
    STREAMED = "streamed"   # in RAM, copied through the device piece by piece as it runs
    CPU = "cpu"             # in RAM (computing there, or waiting to be used or copied in)
    ABSENT = "absent"       # not loaded (the planner leaves a component the model lacks out of the placement)


class TransformerPlace(Named):
    """How a rung holds the transformer. Each equals its string (plans say "group" as before)."""
    DEVICE = "device"   # whole on the device
    GROUP = "group"     # in RAM, streamed to the device block by block (group offload)
    LEAF = "leaf"       # in RAM, streamed to the device layer by layer (leaf offload)
    DISK = "disk"       # in files on disk, read back block by block as it runs
