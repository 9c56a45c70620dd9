"""The service's numbers for Prometheus: how jobs end and how long they take, and what the queue and the engines
hold right now, in Prometheus' text format (``/metrics``).

One ``ServiceMetrics`` per app, with a registry of its own (no module-level state): the page's and the JSON API's
jobs both tell it how they ended (``job_ended``); what is true now (the queue, each engine's state and memory, the
GPUs' utilisation, the loaded models) is read when Prometheus scrapes, by a collector registered on that registry
(``LiveGauges``), from the job queue and the engines' status channels, which answer during a job too. No thread
samples anything between scrapes, and an engine that does not answer within a short time is reported silent.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from engine.device.hardware import GIB
from engine.device.usage import EngineMemory, EngineSilent, EngineStarting
from engine.events import Ending, FailureKind, JobEnding

if TYPE_CHECKING:
    from engine.device.utilization import GpuUtilization
    from engine.service.engines import Engines
    from engine.service.jobqueue import JobQueue

PREFIX = "wan_studio"
# The outcomes a job is counted under (jobs_total's "outcome").
OUTCOMES = ("done", "failed", "refused", "cancelled", "hung", "disk")
# Seconds a whole job takes, and one phase of it: from a still on a datacenter GPU to a long 14B video on a laptop.
JOB_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, float("inf"))
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, float("inf"))
# The job's words ("text to video", as the queue names it) as the metrics' mode label.
MODES = {"text to video": "t2v", "text to image": "t2i", "image to video": "i2v", "video to video": "v2v",
         "decode again": "decode", "smoother": "smoother", "larger": "larger"}
# What an engine is doing, engine_state's "state" (one of them 1, the others 0): loading its libraries, not
# answering, waiting for a job, running one; "stopped": no engine process (it starts again with the next job).
STATES = ("starting", "silent", "idle", "running", "stopped")
# How long one engine may take to answer a scrape, and all of them together: a scrape ends well within Prometheus'
# own 10 s timeout even when every engine hangs.
ENGINE_ANSWER_S = 1.0
SCRAPE_BUDGET_S = 4.0


def outcome_of(ending: JobEnding | None) -> str:
    """How a job ended, as jobs_total counts it: a failure by its cause where that is its own outcome (an engine
    that hung, a full disk), a withdrawn or stopped job as cancelled."""
    if ending is None:
        return "cancelled"
    if ending.kind is Ending.FAILED:
        return {"hung": "hung", "disk": "disk"}.get(str(ending.cause or ""), "failed")
    return {Ending.DONE: "done", Ending.REFUSED: "refused"}.get(ending.kind, "cancelled")


def model_label(ref: str | None) -> str:
    """A model as the metrics name it: a Hub repo id or self-test model as it is, a folder or file by its name only
    (its path on this machine is nobody else's business, as on the page's system panel); "" for none."""
    from engine.models.refs import is_hub_ref
    from engine.models.selftest import SELFTEST_REFS

    if not ref:
        return ""
    return ref if ref in SELFTEST_REFS or is_hub_ref(ref) else Path(ref).name


@dataclass(frozen=True)
class JobRecord:
    """One job as the metrics count it."""
    mode: str                        # t2v, i2v, ... (MODES)
    model: str                       # its model reference ("" when it was refused before one was known)
    outcome: str                     # one of OUTCOMES
    seconds: float | None = None     # its whole time, from its turn to its end (None: it never ran)
    phases: dict | None = None       # phase -> seconds, as its finished event gives them
    failure: str | None = None       # the failure's kind (events.FailureKind): errors_total, or refusals_total
    waited: float | None = None      # seconds from joining the queue to its turn (None: it never got one)


# The model label of a model no preset names and no engine has made a video with: what users type is not a label.
OTHER_MODEL = "other"


class ModelLabels:
    """The bounded set of model labels: the presets' models, and a model an engine made a video with (it exists and
    loaded); any other reference (a typo, a probe's random names) is OTHER_MODEL, so /metrics grows no series for
    what a user typed and shows no one's typing."""

    def __init__(self, known=()):
        self.known = {model_label(ref) for ref in known if ref}
        self.made: set[str] = set()

    def of(self, ref: str | None, outcome: str = "") -> str:
        label = model_label(ref)
        if not label:
            return ""
        if outcome == "done":
            self.made.add(label)
        return label if label in self.known or label in self.made else OTHER_MODEL


@dataclass(frozen=True)
class EngineReading:
    """One engine as a scrape found it: its status channel's answer (None: no engine process), whether the queue
    has a job on it, and its GPU's busy share (None: no reading)."""
    engine: int
    answer: EngineMemory | EngineStarting | EngineSilent | None
    running: bool = False
    utilization: float | None = None


def state_of(reading: EngineReading) -> str:
    """What the engine does, one of STATES: an answer of memory is idle or running (the queue says which)."""
    if reading.answer is None:
        return "stopped"
    if isinstance(reading.answer, EngineSilent):
        return "silent"
    if isinstance(reading.answer, EngineStarting):
        return "starting"
    return "running" if reading.running else "idle"


def _bytes(gib: float | None) -> float | None:
    return None if gib is None else gib * GIB


def engine_families(readings: Sequence[EngineReading]) -> list:
    """The engines' gauges (prometheus_client's metric families) from one scrape's readings: each engine's state
    (one-hot), its device memory used and in all (absent without a separate device memory), its process's RAM and
    its GPU's utilisation (absent without a reading), and how many engines hold each model."""
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, text: str, labels: Sequence[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=list(labels))

    state = gauge("engine_state", "What each engine does now: 1 for its state, 0 for the others", ("engine", "state"))
    used = gauge("vram_used_bytes", "Device memory in use on each engine's GPU, by every process", ("engine",))
    total = gauge("vram_total_bytes", "Device memory of each engine's GPU", ("engine",))
    ram = gauge("engine_ram_bytes", "Resident memory of each engine process", ("engine",))
    busy = gauge("gpu_utilization_ratio", "Share of time each engine's GPU was busy (0 to 1), as its driver says",
                 ("engine",))
    loaded = gauge("model_loaded", "Engines that hold each model now (1 on a machine of one GPU)", ("model",))
    models: dict[str, int] = {}
    for reading in readings:
        engine, now = str(reading.engine), state_of(reading)
        for name in STATES:
            state.add_metric([engine, name], 1.0 if name == now else 0.0)
        if reading.utilization is not None:
            busy.add_metric([engine], reading.utilization)
        memory = reading.answer
        if not isinstance(memory, EngineMemory):
            continue
        ram.add_metric([engine], _bytes(memory.engine_ram_gb))
        if memory.vram_total_gb is not None and memory.vram_used_gb is not None:
            used.add_metric([engine], _bytes(memory.vram_used_gb))
            total.add_metric([engine], _bytes(memory.vram_total_gb))
        if memory.model:
            models[model_label(memory.model)] = models.get(model_label(memory.model), 0) + 1
    for model, count in sorted(models.items()):
        loaded.add_metric([model], float(count))
    return [state, used, total, ram, busy, loaded]


def queue_family(waiting: int):
    """The queue's gauge: jobs waiting for their turn (the running ones are in engine_state)."""
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(f"{PREFIX}_queue_waiting", "Jobs waiting for their turn in the queue", value=waiting)


class LiveGauges:
    """Prometheus' custom collector of what is true now, read at each scrape: the queue's waiting jobs, and each
    engine's answer on its status channel (within ENGINE_ANSWER_S; SCRAPE_BUDGET_S for all of them), with its GPU's
    utilisation through the driver's library (engine/device/utilization.py, opened on the first scrape)."""

    def __init__(self, jobs: "JobQueue | None", engines: "Engines | None", gpus: Callable[[], Sequence[int]],
                 utilization: "GpuUtilization"):
        self.jobs, self.engines, self.gpus, self.utilization = jobs, engines, gpus, utilization

    def describe(self) -> list:
        """The families it yields, empty (the registry checks their names without asking any engine)."""
        return [queue_family(0), *engine_families(())]

    def collect(self) -> Iterator:
        if self.jobs is not None:
            yield queue_family(self.jobs.waiting)
        if self.engines is not None:   # a gauge without a reading (no GPU, no device memory) is left out whole
            yield from (family for family in engine_families(self.readings()) if family.samples)

    def readings(self) -> list[EngineReading]:
        """Each engine's answer now, whether a job runs on it, and its GPU's utilisation."""
        count = max(1, self.engines.engine_count(0.0))
        answers = self.engines.memories(timeout=min(ENGINE_ANSWER_S, SCRAPE_BUDGET_S / count))
        running = {slot for ticket in self.jobs.running_jobs for slot in ticket.slots} if self.jobs else set()
        busy = self._utilization(answers)
        return [EngineReading(slot, answer, slot in running, busy.get(slot)) for slot, answer in enumerate(answers)]

    def _utilization(self, answers: list) -> dict[int, float]:
        """Each engine's GPU's busy share, by engine number, read on the backend the engines said they run on (none
        on a CPU or a Mac, nor before any engine has answered)."""
        backend = next((answer.backend for answer in answers if isinstance(answer, EngineMemory)), "cpu")
        if backend not in ("cuda", "rocm"):
            return {}
        gpus = tuple(self.gpus())
        numbers = {slot: gpus[slot] if slot < len(gpus) else slot for slot in range(len(answers))}
        ratios = self.utilization.read(backend, sorted(set(numbers.values())))
        return {slot: ratios[gpu] for slot, gpu in numbers.items() if gpu in ratios}


def _engine_gpus(engines: "Engines | None") -> Callable[[], Sequence[int]]:
    """Each engine's GPU number, asked at each scrape (the pool's list grows once the first engine has said what
    GPUs there are); one engine alone is on GPU 0."""
    return lambda: tuple(getattr(engines, "gpus", None) or (0,))


class ServiceMetrics:
    """The counters and histograms of this app's jobs, and the gauges read from ``jobs`` and ``engines`` as they
    are scraped. ``gpus``: each engine's GPU number, by engine (default: the pool's own list). ``presets``: the
    (mode, model) of each preset, the models the labels know from the start (ModelLabels) and the jobs_total
    series made at 0 from the start, so that increase() sees the first job of each."""

    def __init__(self, jobs: "JobQueue | None" = None, engines: "Engines | None" = None,
                 gpus: Callable[[], Sequence[int]] | None = None, presets: Sequence[tuple[str, str]] = ()):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        from engine.device.utilization import GpuUtilization

        self.jobs, self.engines = jobs, engines
        self.models = ModelLabels(model for _, model in presets)
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs_total = Counter(f"{PREFIX}_jobs", "Jobs by how they ended", ("mode", "model", "outcome"),
                                  registry=self.registry)
        self.errors_total = Counter(f"{PREFIX}_errors", "Jobs that failed while they ran, by the kind of their failure",
                                    ("kind",), registry=self.registry)
        self.refusals_total = Counter(f"{PREFIX}_refusals", "Jobs refused before they ran (their settings, their "
                                      "model, a full queue), by kind", ("kind",), registry=self.registry)
        for kind in FailureKind:   # each at 0 from the start, so the first of a kind shows in increase()
            self.errors_total.labels(str(kind))
            self.refusals_total.labels(str(kind))
        for mode, model in {(mode, self.models.of(model)) for mode, model in presets} | {
                (mode, OTHER_MODEL) for mode in MODES.values()}:
            for outcome in OUTCOMES:
                self.jobs_total.labels(mode, model, outcome)
        self.job_seconds = Histogram(f"{PREFIX}_job_seconds", "Seconds a job ran, from its turn to its end",
                                     ("mode", "model"), buckets=JOB_BUCKETS, registry=self.registry)
        self.phase_seconds = Histogram(f"{PREFIX}_phase_seconds", "Seconds of each phase of finished jobs",
                                       ("phase", "model"), buckets=PHASE_BUCKETS, registry=self.registry)
        self.queue_wait_seconds = Histogram(f"{PREFIX}_queue_wait_seconds", "Seconds a job waited in the queue for "
                                            "its turn", buckets=JOB_BUCKETS, registry=self.registry)
        self.utilization = GpuUtilization()
        self.live = LiveGauges(jobs, engines, gpus or _engine_gpus(engines), self.utilization)
        self.registry.register(self.live)

    def job_ended(self, record: JobRecord) -> None:
        """Count one job that ended (or was refused)."""
        model = self.models.of(record.model, record.outcome)
        self.jobs_total.labels(record.mode, model, record.outcome).inc()
        if record.failure:
            (self.refusals_total if record.outcome == "refused" else self.errors_total).labels(record.failure).inc()
        if record.waited is not None:
            self.queue_wait_seconds.observe(record.waited)
        if record.seconds is not None:
            self.job_seconds.labels(record.mode, model).observe(record.seconds)
        for phase, seconds in (record.phases or {}).items():
            self.phase_seconds.labels(str(phase), model).observe(float(seconds))

    def exposition(self) -> tuple[bytes, str]:
        """(the metrics in Prometheus' text format, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
