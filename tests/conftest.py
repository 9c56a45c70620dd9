"""Shared fixtures: tiny random-weight Wan pipelines saved to disk, loaded the way users load models."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Engines in the tests (and the app servers they start) don't measure the machine before their first job:
# hundreds of short jobs would each pay for it. The time plan's own tests turn it on.
os.environ.setdefault("WAN_STUDIO_CALIBRATE", "0")
# Offline, as the app servers and commands the tests start (app_env): what an engine would fetch from the Hugging
# Face Hub (a RIFE file for Smoother, a repo) is refused at once, in this process and in the engines it forks, unless
# a stand-in Hub runs (tests/fake_hub.py puts the process online meanwhile). Set before huggingface_hub loads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Torch on one CPU thread in every process of the suite: the workers, the engines they fork, the apps, commands and
# benchmark scripts they start (which inherit it). Two workers share two cores, and the self-test model's work is many
# tiny operations, where a second thread mostly waits on the first while the other worker's processes need the core
# (a windowed image-to-video test in a worker took 16.5 s instead of 3.3 s; the speed benchmark's run 67 s instead
# of 36 s). What they compute is the same. Set before torch loads; a developer's own value is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.words import sentence
from engine.device.hardware import HardwareProfile  # noqa: E402
from engine.models.selftest import (  # noqa: E402
    _TEXT_DIM,
    SELFTEST_I2V,
    SELFTEST_T2V,
    _text_encoder,
    _tokenizer,
    build_selftest_pipeline,
)
from engine.settings.presets import load_presets  # noqa: E402
from engine.settings.request import GenerationRequest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def libraries_out_of_collections():
    """What the worker process has imported (torch, diffusers and transformers with the self-test model's code) is
    kept out of the garbage collector's later passes, as the app and its engines keep theirs
    (engine/device/runtime.py): Python collects on its own as tests allocate, and each pass walked the libraries'
    400,000 objects again (0.2 s each)."""
    import gc

    import diffusers
    import transformers

    diffusers.WanPipeline, transformers.UMT5EncoderModel   # imported as they are read
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session", autouse=True)
def started_processes_wait_without_spinning():
    """The processes the tests start (apps, engines, commands) inherit OMP_WAIT_POLICY=PASSIVE: torch's OpenMP
    threads then sleep between operations instead of spinning, and the self-test model's operations are tiny, so a
    spinning thread mostly burns the core another test's process needs (a browser file took 35.0 s of CPU with
    spinning, 27.2 s without). What the processes compute is the same."""
    before = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    yield
    if before is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = before


@pytest.fixture(scope="session", autouse=True)
def started_processes_hear_ctrl_c():
    """Ctrl+C reaches the processes the tests start even when the suite itself was started with SIGINT ignored (a
    shell's background job, some CI runners): an ignored signal stays ignored in every child, and each app the
    tests stop with Ctrl+C then stood its full STOP_LIMIT_S before it was killed (20 s an app, minutes a run)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        yield


# The hardware of the tests that run the engine in their own process: a CPU-only machine with room for the
# self-test models (nothing is probed, so every machine plans alike).
CPU = HardwareProfile(backend="cpu", device_name="test-cpu", ram_total_gb=24, ram_available_gb=20)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny T2V and I2V pipelines saved with save_pretrained (built once per session)."""
    base = tmp_path_factory.mktemp("models")
    dirs = {}
    for ref, name in ((SELFTEST_T2V, "tiny-t2v"), (SELFTEST_I2V, "tiny-i2v")):
        build_selftest_pipeline(ref).save_pretrained(base / name)
        dirs[name] = base / name
    return dirs


@pytest.fixture(scope="session")
def two_experts(model_dirs, tmp_path_factory):
    """A tiny Wan2.2 A14B look-alike (two transformers, boundary 0.875), saved as a diffusers folder."""
    import copy

    import torch
    from diffusers import WanPipeline

    one = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    second = copy.deepcopy(one.transformer)
    with torch.no_grad():
        for parameter in second.parameters():   # another expert: other weights
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)))
    pipe = WanPipeline(**{**one.components, "transformer_2": second}, boundary_ratio=0.875)
    folder = tmp_path_factory.mktemp("two-experts") / "tiny-a14b"
    pipe.save_pretrained(folder)
    return folder


def tiny_ti2v_pipeline():
    """A tiny Wan2.2-5B look-alike: 48 latent channels, a residual VAE with 2x2 patches (16x), per-token
    timesteps, and latents_mean / latents_std that are not 0 / 1, so the un-normalising matters."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(0)
    stats = torch.Generator().manual_seed(1)
    vae = AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, latents_mean=(0.3 * torch.randn(48, generator=stats)).tolist(),
        latents_std=(0.5 + torch.rand(48, generator=stats)).tolist())
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=48, out_channels=48,
        text_dim=_TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    return WanPipeline(tokenizer=_tokenizer(), text_encoder=_text_encoder(), vae=vae, transformer=transformer,
                       scheduler=scheduler, expand_timesteps=True)


@pytest.fixture(scope="session")
def ti2v_pipe():
    return tiny_ti2v_pipeline()


@pytest.fixture(scope="session")
def ti2v_dir(ti2v_pipe, tmp_path_factory):
    """The tiny Wan2.2-5B look-alike saved as a diffusers folder."""
    folder = tmp_path_factory.mktemp("ti2v") / "tiny-ti2v"
    ti2v_pipe.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def selftest_models_dir(tmp_path_factory, model_dirs) -> Path:
    """A models folder already holding the built-in self-test models (saves rebuilding them per process)."""
    folder = tmp_path_factory.mktemp("selftest-models")
    shutil.copytree(model_dirs["tiny-t2v"], folder / SELFTEST_T2V)
    shutil.copytree(model_dirs["tiny-i2v"], folder / SELFTEST_I2V)
    return folder


@pytest.fixture(scope="session")
def presets():
    return load_presets()


@pytest.fixture
def outputs(tmp_path) -> Path:
    folder = tmp_path / "outputs"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def image_file(tmp_path_factory) -> Path:
    """A 100x70 (not square, not a multiple of 16) RGB photo stand-in."""
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "photo.png"
    img = Image.new("RGB", (100, 70), (200, 40, 40))
    for x in range(50, 100):
        for y in range(70):
            img.putpixel((x, y), (20, 40, 220))
    img.save(path)
    return path


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> tuple[Path, str]:
    """A file in the system temp folder (which gradio trusts for some things) holding a marker."""
    marker = f"SECRET-{secrets.token_hex(8)}"
    path = tmp_path_factory.mktemp("secret") / "secret.txt"
    path.write_text(marker + "\n")
    return path, marker


def shown(markdown: str) -> str:
    """Markdown as it reads on the page: escaped characters (``\\.``, ``&lt;``) as the characters."""
    import html
    import re

    return html.unescape(re.sub(r"\\(.)", r"\1", markdown))


def said(clause: str) -> str:
    """How a problem's clause reads in a message: as a sentence, with a capital first letter (a name as its first
    word keeps its letters: engine/words.py)."""
    return sentence(clause).removesuffix(".") if not clause.endswith(".") else sentence(clause)


def tiny_request(presets, model: str, outputs: Path, mode: str = "t2v", **overrides) -> GenerationRequest:
    preset = presets["selftest-i2v" if mode == "i2v" else "selftest-t2v"]
    prompt = overrides.pop("prompt", "a red fox in the snow")
    values = dict(mode=mode, model=str(model), outputs_dir=str(outputs), seed=1234)
    values.update(overrides)
    return GenerationRequest.from_preset(preset, prompt, **values)


def run_engine(engine, request: GenerationRequest, should_cancel=lambda: False) -> tuple:
    """(the terminal event, every event in order) of one run on ``engine``; the terminal event is emitted last."""
    events = []
    result = engine.run(request, "job", events.append, should_cancel)
    assert events[-1] is result
    return result, events


@contextlib.contextmanager
def one_torch_thread():
    """Torch on one thread meanwhile: tiny models and frames run in many tiny operations, and on a busy machine more
    threads only wait on each other (many times slower); the count is put back after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "app.py"), *args]


def app_main(*args: str) -> subprocess.CompletedProcess:
    """``python app.py ARGS`` run through app.main in this process: its exit code (an argparse refusal's included)
    and what it printed, as a finished command. A command that runs a job (generate, decode) starts its engine from
    this process's fork server (a fork, where a command's own process loads the libraries twice: about five seconds
    of CPU); what the engine process itself prints is not in the result, and the variables are this process's
    (offline, as app_env's; a test that needs variables of its own runs the command as a process). The
    commands as a user types them run as processes in test_cli's README, first-generate and Ctrl-C tests."""
    import io

    import app

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _columns(120):
        try:
            rc = app.main(list(args))
        except SystemExit as exc:   # argparse's --help and refusals
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["app.py", *args], rc, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _columns(width: int):
    """argparse's help wrapped at ``width`` meanwhile, as in a terminal of that width."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def app_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    env.update(extra)
    return env


# Ctrl+C stops an app within seconds (ui/serving.py stop_quickly, WorkerClient.close: 1-5 s in the suite's runs);
# one still running after this long is killed. (How fast it stops is no test's assertion: on a loaded machine it
# is a matter of pace; tests/engine/test_worker.py checks what closing does.)
STOP_LIMIT_S = 20


@contextlib.contextmanager
def running_app(log_path: Path, *args: str, env: dict | None = None, startup_s: float = 120):
    """Start ``app.py --no-browser --port P *args``; yield (url, process); stop it with Ctrl-C."""
    port = free_port()
    if "--user-presets" not in args:   # never the developer's own user_presets/ folder
        args = (*args, "--user-presets", str(Path(log_path).parent / "user_presets"))
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(app_command("--no-browser", "--port", str(port), *args), stdout=log,
                                stderr=subprocess.STDOUT, env=app_env(**(env or {})), cwd=ROOT)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.time() + startup_s
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2)
                    break
                except urllib.error.HTTPError:   # answering (a login page, say): it is up
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        log.seek(0)
                        pytest.fail(f"the app did not start:\n{log.read()}")
                    time.sleep(0.3)
            yield url, proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)   # its threads' stacks into its log, for whoever looks into it
                time.sleep(1)
                with open(log_path, "a") as note:
                    note.write(f"\n[tests] still up {STOP_LIMIT_S} s after Ctrl+C: killed\n")
                proc.kill()
                proc.wait()


def engine_pid(app: dict) -> int:
    """The engine process of a running app (``app``: what selftest_app yields)."""
    from tests.helpers.processes import engine_processes

    for _ in range(100):
        workers = engine_processes(app["proc"].pid)
        if workers:
            return workers[0].pid
        time.sleep(0.1)
    raise AssertionError("no engine process found")


@pytest.fixture(scope="session")
def shared_app(tmp_path_factory, selftest_models_dir):
    """The app on the self-test model as ``./launch.sh`` starts it, shared by the files that use it: one per worker
    process that runs any of them, not one per file. Its outputs, history and console hold every such file's runs,
    so a test looks for its own."""
    with selftest_app(tmp_path_factory, selftest_models_dir, "shared") as app:
        yield app


@pytest.fixture(scope="module")
def client(server):
    """An API client of the app that the test module runs as its ``server`` fixture (a dict with its "url")."""
    from tests.helpers.api import api_client

    return api_client(server["url"])


@contextlib.contextmanager
def selftest_app(tmp_path_factory, models_dir: Path, name: str, *args: str):
    """The app on the self-test model with fresh outputs and log folders named after ``name``;
    yields {"url", "proc", "outputs", "log"}."""
    outputs = tmp_path_factory.mktemp(f"{name}-outputs")
    log = tmp_path_factory.mktemp(f"{name}-logs") / "app.log"
    with running_app(log, "--model", "selftest-t2v", "--outputs", str(outputs), "--models-dir", str(models_dir),
                     *args) as (url, proc):
        yield {"url": url, "proc": proc, "outputs": outputs, "log": log}


# ----- a real browser, driven by Playwright: the one tests/browser_setup.py chose (./launch.sh test runs it) -----
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]
# Screenshots of browser tests; set WAN_SCREENSHOTS_DIR (e.g. docs/screenshots) to copy them there too.
ARTIFACTS = ROOT / "test-artifacts" / "screenshots"


def browser_path() -> str:
    """WAN_TEST_BROWSER, else a browser on this machine, else Playwright's own; the tests fail (never skip)
    without one."""
    from tests.browser_setup import ENV, find_installed, playwright_browser

    path = os.environ.get(ENV, "").strip() or find_installed() or playwright_browser()
    if not path:
        pytest.fail(f"no browser for the page tests: run them with ./launch.sh test (launch.bat test on "
                    f"Windows), which finds or installs one, or set {ENV} to a Chromium, Chrome or Edge")
    return path


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    path = browser_path()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


# The page autoplays each result video in a loop; a page open through a test file would play every video it made
# until the file ends (a looping 64x64 clip kept 30% of a core busy in headless Chromium, which shares the two cores
# with the tests). In the tests' browser a video pauses once it has looped for PLAYED_S: its playing is seen first.
PLAYED_S = 10
PAUSE_WHEN_PLAYED = """
(() => {
  const seen = new WeakMap();
  document.addEventListener("loadstart", (event) => seen.delete(event.target), true);
  document.addEventListener("timeupdate", (event) => {
    const video = event.target;
    if (!(video instanceof HTMLVideoElement) || !video.loop) return;
    const state = seen.get(video) || {at: 0, loops: 0};
    if (video.currentTime < state.at && ++state.loops * video.duration >= %d) video.pause();
    state.at = video.currentTime;
    seen.set(video, state);
  }, true);
})();
""" % PLAYED_S


@contextlib.contextmanager
def open_page(browser, url: str, timeout_s: float = 60):
    """A fresh browser context on the app's page, once the page has drawn its first tab."""
    from tests.helpers.page import COUNT_FRAMES

    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.add_init_script(PAUSE_WHEN_PLAYED)
    context.add_init_script(COUNT_FRAMES)
    page = context.new_page()
    page.set_default_timeout(timeout_s * 1000)
    page.goto(url)
    page.locator("#t2v-generate").wait_for()
    try:
        yield page
    finally:
        context.close()


class Screenshots:
    def __init__(self):
        self.extra = Path(os.environ["WAN_SCREENSHOTS_DIR"]) if os.environ.get("WAN_SCREENSHOTS_DIR") else None
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def __call__(self, page, name: str, full_page: bool = True) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        if self.extra:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)
        return path


@pytest.fixture(scope="session")
def shot():
    return Screenshots()


# The kinds of test that start something heavy (pytest.ini lists them); each is also ``slow``, and the quick lane
# (``./launch.sh test -m "not slow"``) leaves them out. A file says its kind with ``pytestmark``; tests/browser/ is
# ``browser`` as a whole.
SLOW_KINDS = ("bench", "browser", "server", "process")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test of a heavy kind is ``slow`` too; and the files run heaviest kind first (pytest.ini's ``--dist
    loadfile --no-loadscope-reorder`` hands out whole files in this order), so that the many quick files fill the two
    workers' ends rather than one long file keeping one worker busy after the other is done."""
    browser_folder = Path(__file__).parent / "browser"
    for item in items:
        if browser_folder in Path(item.path).parents:
            item.add_marker(pytest.mark.browser)
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
    first = {}   # each file's rank: the heaviest kind of test it holds (SLOW_KINDS' order), quick files last
    for item in items:
        rank = next((n for n, kind in enumerate(SLOW_KINDS) if item.get_closest_marker(kind)), len(SLOW_KINDS))
        first[item.path] = min(rank, first.get(item.path, rank))
    items.sort(key=lambda item: first[item.path])   # stable: each file's tests keep their order


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def screenshot_on_failure(request):
    """A failed browser test leaves a picture of the page (test-artifacts/screenshots/FAILED-<test>.png)."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and "page" in request.fixturenames:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        request.getfixturevalue("page").screenshot(path=str(ARTIFACTS / f"FAILED-{request.node.name}.png"),
                                                   full_page=True)
