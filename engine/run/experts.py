"""Wan2.2 A14B's two experts with one on the device at a time (the planner's expert_swap rung).

Both experts keep their weights in RAM (pinned when the plan pins) for as long as they are loaded; the one
that computes also has a copy on the device. Swapping drops the device copy of one (its RAM copy is put back
in place: nothing is copied to the host) and copies the other in, so the device never holds more than one
expert and each swap costs one expert's copy to the device.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from engine.models.spec import TRANSFORMERS



@dataclass
class _RamCopy:
    """One model's weights in RAM: every parameter (the object and its data) and buffer, by module and name."""
    params: list
    buffers: list

    @classmethod
    def of(cls, model) -> "_RamCopy":
        # .to() either swaps a parameter's data or replaces the parameter: keep both, and every buffer.
        return cls([(module, key, param, param.data) for module in model.modules()
                    for key, param in module._parameters.items() if param is not None],
                   [(module, key, buffer) for module in model.modules()
                    for key, buffer in module._buffers.items() if buffer is not None])

    def put_back(self) -> None:
        for module, key, param, data in self.params:
            param.data = data
            module._parameters[key] = param
        for module, key, buffer in self.buffers:
            module._buffers[key] = buffer


@dataclass
class ExpertSwap:
    """Which expert of ``pipe`` is on ``device``; ``bring`` puts another there (the other back to its RAM copy)."""
    pipe: object
    device: str
    on_device: str | None = None
    _ram: _RamCopy | None = None   # the RAM copy of the expert on the device, put back when it leaves

    @classmethod
    def place(cls, pipe, device: str, pin: bool) -> "ExpertSwap":
        """Both experts in RAM (page-locked with ``pin``, for fast copies), the high-noise one also on ``device``."""
        from engine.run.apply_plan import pin_in_place

        swap = cls(pipe, device)
        for name in TRANSFORMERS:
            model = getattr(pipe, name, None)
            if model is None:
                continue
            model.to("cpu")
            if pin and device != "cpu":
                pin_in_place(model)
        swap.bring(TRANSFORMERS[0])
        return swap

    @contextmanager
    def parked(self):
        """Both experts in RAM alone while the block runs (a change to their weights must reach the RAM copies,
        which every swap puts back), then the one that was on the device back on it."""
        was = self.on_device
        if self._ram is not None:
            self._ram.put_back()
        self._ram, self.on_device = None, None
        try:
            yield
        finally:
            if was is not None:
                self.bring(was)

    def bring(self, name: str) -> bool:
        """Put expert ``name`` on the device, the other one back in RAM; False when it was there already."""
        model = getattr(self.pipe, name, None)
        if self.on_device == name or model is None:
            return False
        if self._ram is not None:
            self._ram.put_back()   # first: the device never holds both
        self._ram = _RamCopy.of(model)   # taken now, so it has whatever was added since (a LoRA's layers)
        model.to(self.device, non_blocking=True)
        self.on_device = name
        return True


def switch_step(steps_per_expert: dict[str, int], steps: int) -> int | None:
    """The index of the first step the low-noise expert runs (None when it runs none), from
    speedups.steps_per_transformer's counts."""
    high = steps_per_expert.get(TRANSFORMERS[0], steps)
    return high if high < steps else None
