"""What the page and the command line use of the engines, whether one engine process (``WorkerClient``) or one
per GPU (``EnginePool``): the one type ``AppContext.client`` is, and a test checks that both classes have every
member here and take its parameters (tests/test_architecture.py).

``slots`` name the engines a job runs on, as the job queue gave them: a WorkerClient is the one engine (it has
no other slot to run on), a pool runs a job on the first slot alone or splits it across all of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

if TYPE_CHECKING:
    from engine.device.hardware import HardwareProfile
    from engine.events import Event
    from engine.models.catalog import ModelCatalog
    from engine.settings.request import GenerationRequest


class Engines(Protocol):
    models_dir: str

    @property
    def catalog(self) -> "ModelCatalog": ...

    def check(self, request: "GenerationRequest") -> tuple["GenerationRequest", list[str]]: ...

    def run(self, request: "GenerationRequest", notes: Sequence[str] = (), job_id: str | None = None,
            slots: Sequence[int] = ()) -> Iterator["Event"]: ...

    def decode(self, latents: str, tiled: bool = False, on_cpu: bool = False, job_id: str | None = None,
               slots: Sequence[int] = ()) -> Iterator["Event"]: ...

    def post(self, path: str, step: str, factor: int, job_id: str | None = None,
             slots: Sequence[int] = ()) -> Iterator["Event"]: ...

    def cancel(self, slots: Sequence[int] | None = None) -> None: ...

    def unload(self) -> None: ...

    def engine_count(self, timeout: float = 0.0) -> int: ...

    def engines_for(self, request: "GenerationRequest") -> int: ...

    def hardware_profile(self) -> "HardwareProfile": ...

    def memory(self, timeout: float = 5.0): ...

    def memories(self, timeout: float = 2.0) -> list: ...

    def all_loaded_files(self, timeout: float = 2.0) -> list: ...

    def all_running_settings(self) -> list: ...


MEMBERS = ("models_dir", "catalog", "check", "run", "decode", "post", "cancel", "unload", "engine_count", "engines_for",
           "hardware_profile", "memory", "memories", "all_loaded_files", "all_running_settings")
