"""What every tab needs: the worker client, the presets, and where outputs go."""
from __future__ import annotations

from dataclasses import dataclass

from engine.presets import Preset
from engine.worker import WorkerClient


@dataclass(frozen=True)
class AppContext:
    client: WorkerClient
    presets: dict[str, Preset]
    outputs_dir: str
    default_model: str | None = None

    def presets_for(self, mode: str) -> list[str]:
        wanted = "i2v" if mode == "i2v" else "t2v"
        return [name for name, preset in self.presets.items() if preset.mode == wanted]

    def default_preset(self, mode: str) -> str:
        names = self.presets_for(mode)
        if self.default_model:
            for name in names:
                if self.presets[name].model == self.default_model:
                    return name
        return names[0]

    def preset_or_default(self, name: str | None, mode: str) -> Preset:
        """The named preset, or the mode's default when the name is unknown or empty."""
        return self.presets.get(name or "") or self.presets[self.default_preset(mode)]
