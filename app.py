"""Wan Studio: generate Wan videos and stills on your own machine.

    python app.py [--host H] [--port P] [--listen] [--share] [--auth user:pass] [--model REF] [--outputs DIR]
    python app.py generate --prompt TEXT [--image PATH] [--preset NAME] [--model REF] [...]
    python app.py doctor [--json]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from ui.terminal import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK   # the standard library alone

ROOT = Path(__file__).resolve().parent
DEFAULT_OUTPUTS = Path(os.environ.get("WAN_OUTPUTS_DIR", ROOT / "outputs"))
DEFAULT_MODELS = Path(os.environ.get("WAN_MODELS_DIR", ROOT / "models"))
DEFAULT_USER_PRESETS = ROOT / "user_presets"
COMMANDS = ("serve", "generate", "plan", "decode", "post", "doctor")

# While the engine process loads its libraries, `generate` says so this often (seconds).
STARTING_NOTE_S = 5.0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--outputs", default=str(DEFAULT_OUTPUTS), help="folder for videos, images and sidecars")
    parser.add_argument("--models-dir", default=str(DEFAULT_MODELS),
                        help="the models folder: local models, loras/, transformers/, the self-test models "
                             "(default: models/ here, or WAN_MODELS_DIR)")
    parser.add_argument("--latents-hours", type=float, default=24.0,
                        help="keep the denoised latents of finished runs this long (0: remove at once)")


def _gpus_arg(text: str):
    from engine.service.pool import GpuChoice, GpuChoiceError

    try:
        return GpuChoice.parse(text)
    except GpuChoiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _field_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The options of ``command`` that set a field, as the field table declares them (engine/settings/fields.py)."""
    from engine.settings.fields import Parse, cli_fields

    for field in cli_fields(command):
        option = field.option
        choices = ("on", "off") if field.parse is Parse.ON_OFF else (field.choices or None)
        kind = _lora_arg if option.many else option.kind
        parser.add_argument(option.flag, dest=option.dest_of(field), type=kind, choices=choices, metavar=option.metavar,
                            help=option.help, action="append" if option.many else "store")


def _lora_arg(text: str):
    from engine.settings.loras import parse_lora
    from engine.settings.values import InputError

    try:
        return parse_lora(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    return build_parsers()[0]


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser and each command's own, by name."""
    # Long, but only a declaration: every option of every command in one place, in the order --help shows.
    from engine import APP_NAME

    parser = argparse.ArgumentParser(prog="app.py", description=f"{APP_NAME}: Wan video generation, locally.")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="start the web page (the default)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    serve.add_argument("--listen", action="store_true", help="listen on all interfaces (0.0.0.0); needs a password")
    serve.add_argument("--share", action="store_true", help="create a public share link; needs a password")
    serve.add_argument("--auth", help="user:password required to open the page")
    serve.add_argument("--forwarded-allow-ips", default="", metavar="IPS",
                       help="proxies in front of the app whose X-Forwarded-For header names the caller (addresses, "
                            "comma-separated); default none: every request is its connection's own address")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="another name the page may be reached by (behind a proxy); localhost, the --host "
                            "address and, with --listen, this machine's names and addresses are always allowed")
    serve.add_argument("--model", help="model to select at start (repo id, folder, selftest-t2v, selftest-i2v)")
    serve.add_argument("--no-browser", action="store_true", help="do not open the page in a browser")
    serve.add_argument("--allow-model-paths", action="store_true",
                       help="let the page and the API use model folders anywhere on this machine "
                            "(default: repo ids, self-test models and folders inside the models folder)")
    serve.add_argument("--max-queue", type=int, metavar="N",
                       help="jobs that may wait in the queue before new ones are refused (default 16)")
    serve.add_argument("--queue-share", type=int, metavar="N",
                       help="jobs one login may have waiting (default half the queue, at least 2)")
    serve.add_argument("--max-job-minutes", type=float, metavar="MIN",
                       help="refuse a job predicted to take longer (default 60 with a password or API tokens, else "
                            "none; 0: none)")
    serve.add_argument("--user-presets", default=str(DEFAULT_USER_PRESETS), metavar="DIR",
                       help="folder for the presets saved from the page (default: user_presets/ here)")
    serve.add_argument("--preview-every", type=float, default=1.0, metavar="SECONDS",
                       help="a live preview at most this often while denoising (0: every step; -1: none)")
    serve.add_argument("--gpus", type=_gpus_arg, default="all", metavar="all|N|0,1",
                       help="the GPUs to use, one engine each: all (default), the first N, or these numbers "
                            "(one GPU: '1,'); jobs run side by side, one per GPU")
    serve.add_argument("--api-token", metavar="FILE",
                       help="tokens for the JSON API (/api/v1), one a line, each a login of its own "
                            "(Authorization: Bearer TOKEN); the page's --auth user works there too")
    serve.add_argument("--metrics-public", action="store_true",
                       help="serve /metrics (Prometheus) without a login (default: the same login as the page)")
    _common(serve)

    gen = sub.add_parser("generate", help="generate one video or image without the page")
    gen.add_argument("--prompt", help="what the video shows (with --extend: the extended output's, when not given)")
    gen.add_argument("--preset", help="preset name (see the Presets tab or presets/)")
    gen.add_argument("--model", help="repo id, local diffusers folder, selftest-t2v or selftest-i2v")
    _field_options(gen, "generate")
    gen.add_argument("--keep-latents", action="store_true",
                     help="keep the denoised latents after the video is written (for decoding again later)")
    gen.add_argument("--user-presets", default=str(DEFAULT_USER_PRESETS), metavar="DIR",
                     help="folder of the presets saved from the page (--preset finds them too)")
    gen.add_argument("--gpus", type=_gpus_arg, default="all", metavar="all|N|0,1",
                     help="the GPUs this run may use (default all): it runs on the first, or split across "
                          "them when the plan or --split says so")
    _common(gen)

    plan = sub.add_parser("plan", help="show the memory plan for a preset on this (or a described) machine")
    plan.add_argument("--preset", required=True)
    plan.add_argument("--model", help="another model than the preset's")
    plan.add_argument("--hardware", help="a hardware JSON file (as 'doctor --json' prints under 'hardware')")
    plan.add_argument("--mode", choices=("t2v", "i2v", "t2i", "v2v"), help="default: the preset's")
    _field_options(plan, "plan")
    plan.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    plan.add_argument("--user-presets", default=str(DEFAULT_USER_PRESETS), metavar="DIR",
                      help="folder of the presets saved from the page (--preset finds them too)")
    _common(plan)

    decode = sub.add_parser("decode", help="decode saved latents again (after a failed decode), without denoising")
    decode.add_argument("latents", help="a *.latents.safetensors file beside the outputs")
    decode.add_argument("--tiled", action="store_true", help="decode in tiles (less memory)")
    decode.add_argument("--cpu", action="store_true", help="decode on the CPU (slow, but needs no device memory)")
    _common(decode)

    post = sub.add_parser("post", help="make an output smoother (more frames) or larger (upscaled): a new output "
                                       "beside it")
    post.add_argument("output", help="an output's .mp4 (or .png, for --upscale) in the outputs folder")
    steps = post.add_mutually_exclusive_group(required=True)
    steps.add_argument("--interpolate", type=int, metavar="N", help="N times the frames and fps (2 or 4)")
    steps.add_argument("--upscale", type=int, metavar="N", help="N times the width and height (2 or 4)")
    _common(post)

    doctor = sub.add_parser("doctor", help="print the detected hardware and software (paste it into bug reports)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    _common(doctor)
    return parser, {"serve": serve, "generate": gen, "plan": plan, "decode": decode, "post": post, "doctor": doctor}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser, commands = build_parsers()
    if argv and argv[0] in ("-h", "--help"):
        # The page is the default command: its options are what most people look for.
        serve = commands["serve"]
        print(parser.format_help())
        print("Starting the page is the default: 'python app.py [options]' is 'python app.py serve [options]'.\n")
        print(serve.format_help().replace("usage: app.py serve", "usage: app.py [serve]", 1))
        raise SystemExit(0)
    if not argv or argv[0] not in COMMANDS:
        argv = ["serve", *argv]
    return parser.parse_args(argv)


# ----- generate -----------------------------------------------------------
def _pick_preset(presets, args):
    from engine.settings.presets import get_preset, preset_for_model

    if args.preset:
        return get_preset(presets, args.preset)
    mode = "i2v" if getattr(args, "image", None) or getattr(args, "extend", None) else "t2v"
    found = preset_for_model(presets, args.model, mode) if args.model else None
    if found is not None:
        return found
    if getattr(args, "extend", None):   # the extended output's family (engine/post/sources.py)
        from engine.post.sources import extension_preset

        return get_preset(presets, extension_preset(presets, Path(args.extend), Path(args.outputs)) or "wan21-i2v-14b")
    return get_preset(presets, "wan21-i2v-14b" if mode == "i2v" else "wan21-t2v-1.3b")


def _settings(args):
    """(the preset, the settings the command line asks for: its preset's, with the options given)."""
    from engine.settings.draft import prepare
    from engine.settings.fields import SETTING_TYPES

    preset, values, mode = _typed(args)
    values = {name: value for name, value in values.items() if name in SETTING_TYPES}
    return preset, prepare(values, preset.settings, mode, _cli_paths(args), lambda ref: None, check=False,
                           drop_unused_guidance_2=False)


def _typed(args):
    """(the preset, the fields typed as options, by name, the mode): an option not typed is the preset's
    (engine/settings/draft.py); the run's check says what is wrong."""
    from engine.settings.fields import cli_fields
    from ui.serving import presets_with_user_folder

    preset = _pick_preset(presets_with_user_folder(args.user_presets)[0], args)
    image, extend, video = (getattr(args, name, None) for name in ("image", "extend", "video"))
    mode = getattr(args, "mode", None) or ("i2v" if image or extend else "v2v" if video else
                                           ("t2i" if args.frames == 1 else preset.settings.mode))
    typed = {field.name: getattr(args, field.option.dest_of(field)) for field in cli_fields(args.command)}
    typed["model"] = args.model
    typed = {name: value for name, value in typed.items() if value is not None}
    return preset, {**_from_video(args, preset), **typed}, mode


def _from_video(args, preset) -> dict:
    """What a run from a video (--extend, --video) takes from it where no option is typed (engine/post/sources.py);
    VideoError when it is no video."""
    from engine.post.sources import extension_start, remake_start

    extend, video = getattr(args, "extend", None), getattr(args, "video", None)
    if extend:
        return extension_start(Path(extend), Path(args.outputs), preset.settings).values
    if video:
        return remake_start(Path(video), Path(args.outputs), preset.settings).values
    return {}


def _cli_paths(args):
    """The command line's path policy: a LoRA or transformer file from here, else by that name in the models
    folder's loras/ or transformers/; any model reference."""
    from dataclasses import replace

    from engine.models.single_file import transformer_folder
    from engine.models.weights import find_file
    from engine.settings.draft import Paths
    from engine.settings.loras import find_lora

    def transformers(files: dict) -> dict:
        return {name: find_file(file, transformer_folder(args.models_dir), must_exist=True) if file else None
                for name, file in files.items()}

    return Paths(loras=lambda loras: tuple(replace(lora, file=find_lora(lora.file, args.models_dir, not lora.repo))
                                           for lora in loras), transformers=transformers)


def _build_request(args):
    from engine.settings.draft import prepare_request

    preset, values, mode = _typed(args)
    prompt = args.prompt if args.prompt is not None else values.pop("prompt", None)
    values = {name: value for name, value in values.items() if name != "prompt"}
    return prepare_request({"prompt": prompt, **values}, preset, mode, _cli_paths(args), lambda ref: None,
                           args.outputs, drop_unused_guidance_2=False, keep_latents=getattr(args, "keep_latents", False))


def generate(args) -> int:
    from engine.errors import InputError, ModelError
    from engine.service.pool import EnginePool
    from engine.settings.presets import PresetError
    from ui.terminal import follow, started_then_run

    try:
        request = _build_request(args)
    except (PresetError, InputError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # No page to show previews on: the engine makes none. Only the engines the job runs on are started.
    pool = EnginePool(args.models_dir, args.gpus, latents_hours=args.latents_hours, preview_seconds=-1,
                      outputs_dir=args.outputs)
    try:
        pool.check(request)   # bad input is refused in this process, before an engine starts
    except (InputError, ModelError) as exc:
        pool.close()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return follow(pool, started_then_run(pool, request, STARTING_NOTE_S))


def decode(args) -> int:
    from engine.errors import InputError
    from engine.outputs.latents import check_latents_file
    from engine.service.worker import WorkerClient
    from ui.terminal import follow

    try:
        check_latents_file(args.latents)   # before an engine starts
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    client = WorkerClient(args.models_dir, latents_hours=args.latents_hours, outputs_dir=args.outputs)
    return follow(client, client.decode(args.latents, tiled=args.tiled, on_cpu=args.cpu))


def post(args) -> int:
    """Smoother or larger on an output: checked here (its sidecar, the factor) before an engine starts."""
    from engine.errors import InputError
    from engine.post.apply import Media
    from engine.post.on_output import check_step, read_output
    from engine.post.steps import PostStep
    from engine.service.worker import WorkerClient
    from ui.terminal import follow

    step = PostStep("interpolate", args.interpolate) if args.interpolate is not None else PostStep("upscale", args.upscale)
    try:
        bundle, sidecar = read_output(Path(args.output))
        check_step(step, sidecar, Media.read(Path(args.output)))
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    client = WorkerClient(args.models_dir, latents_hours=args.latents_hours, outputs_dir=args.outputs)
    return follow(client, client.post(str(Path(args.output).resolve()), step.kind, step.factor))


# ----- plan ---------------------------------------------------------------
def plan(args) -> int:
    import json

    from engine.device.hardware import HardwareError, HardwareProfile
    from engine.errors import ModelError
    from engine.models.catalog import ModelCatalog
    from engine.service.ahead import plan_settings, plan_table
    from engine.settings.presets import PresetError
    from engine.settings.values import check_settings

    try:
        settings = _settings(args)[1]
        catalog = ModelCatalog()
        settings = check_settings(settings, catalog.limits(settings.model))
        if args.hardware:
            hardware = HardwareProfile.from_file(args.hardware)
        else:
            from engine.device.hardware import detect_hardware
            from engine.run.time_plan import measured_hardware

            hardware = measured_hardware(detect_hardware(), args.outputs)   # as the engine runs it
        chosen = plan_settings(settings, hardware, catalog)
    except (PresetError, HardwareError, ModelError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(chosen.to_dict(), indent=2))
    else:
        print(f"{settings.model} at {settings.width}x{settings.height}x{settings.frames} on {hardware.summary()}")
        print(plan_table(chosen))
    return EXIT_OK if chosen.fits else EXIT_FAILED


# ----- doctor -------------------------------------------------------------
def doctor(args) -> int:
    import json

    from engine.service.doctor import doctor_report, report_lines

    report = doctor_report(args.outputs)
    print(json.dumps(report, indent=2) if args.json else "\n".join(report_lines(report, args.outputs)))
    return 0


# ----- serve --------------------------------------------------------------
def _check_serve_numbers(args) -> None:
    for flag, value in (("--max-queue", args.max_queue), ("--queue-share", args.queue_share)):
        if value is not None and value < 1:
            raise SystemExit(f"error: {flag} must be at least 1")
    if args.max_job_minutes is not None and not 0 <= args.max_job_minutes < 10**6:
        raise SystemExit("error: --max-job-minutes must be a number of minutes (0: no limit)")


def _stacks_on_request() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack on the console (Linux, macOS): what a report of an app that
    hangs or will not stop needs."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def serve(args) -> int:
    from engine import APP_NAME
    from ui.startup import api_tokens, port_in_use, port_taken_message, prepare_served_dir, resolve_auth

    _check_serve_numbers(args)
    _stacks_on_request()
    host = "0.0.0.0" if args.listen else args.host
    if port_in_use(host, args.port):     # before anything is cleaned or started
        print(port_taken_message(host, args.port), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    auth = resolve_auth(args)
    tokens = api_tokens(args.api_token)
    Path(args.outputs).mkdir(parents=True, exist_ok=True)
    served = prepare_served_dir()   # before gradio is imported
    from ui.serving import make_server, stop_quickly

    server = make_server(args, served, auth, tokens)
    gc.freeze()   # the libraries and the page: out of every later collection (engine/device/runtime.py)
    server.engines.start()  # the engine processes load their libraries while the page starts and loads
    demo = server.demo
    # uvicorn believes a request's X-Forwarded-For only from these (its default trusts this machine, where a tunnel
    # connects from, and anyone's header would then name the caller the password throttle counts).
    os.environ["FORWARDED_ALLOW_IPS"] = args.forwarded_allow_ips
    try:
        try:
            # quiet: gradio's own start-up lines (and its tip about share=True) give way to ours.
            demo.launch(server_name=host, server_port=args.port, inbrowser=not args.no_browser, **server.launch)
        except OSError as exc:
            if "empty port" not in str(exc):
                raise
            print(port_taken_message(host, args.port), file=sys.stderr, flush=True)   # taken since the check
            return EXIT_BAD_INPUT
        stop_quickly(demo)
        print(f"{APP_NAME} is running at {demo.local_url} (Ctrl+C stops it)", flush=True)
        print(f"Its JSON API: {demo.local_url}api/docs; Prometheus metrics: {demo.local_url}metrics", flush=True)
        if demo.share_url:
            print(f"Share link for colleagues (password required): {demo.share_url}", flush=True)
        demo.block_thread()
    finally:
        server.engines.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return {"serve": serve, "generate": generate, "plan": plan, "decode": decode, "post": post,
            "doctor": doctor}[args.command](args)


if __name__ == "__main__":
    from engine.own_python import run_in_own_python

    own = run_in_own_python(ROOT, Path(__file__).resolve(), sys.argv[1:])   # the .venv's Python, when not this one
    sys.exit(main() if own is None else own)
