"""`python app.py generate` and `doctor`, run as a user runs them."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.models.loras import Lora
from engine.outputs.export import read_video
from tests.conftest import ROOT, app_command, app_env, app_main, said

pytestmark = pytest.mark.process

REVISION = "89abcdef0123456789abcdef0123456789abcdef"


def generate(*args, models_dir, outputs, env=None, timeout=180):
    command = app_command("generate", "--models-dir", str(models_dir), "--outputs", str(outputs), *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or app_env(), cwd=ROOT)


def generated_here(*args, models_dir, outputs) -> subprocess.CompletedProcess:
    """``generate ARGS`` through app.main in this process, its engine forked from this process's fork server (a
    fraction of a second, where a command's own process loads the libraries twice, about five seconds of CPU): for
    what the job makes and the command prints; a new user's terminal, the README's lines and Ctrl-C run as
    processes (generate above). A refusal comes before any engine starts."""
    return app_main("generate", "--models-dir", str(models_dir), "--outputs", str(outputs), *args)


def test_generate_with_the_selftest_model_writes_video_and_sidecar(selftest_models_dir, outputs):
    """Also a new user's terminal: the first line says the engine is starting, the table times it, nothing leaks."""
    done = generate("--model", "selftest-t2v", "--prompt", "a cat", "--seed", "42",
                    models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "[Engine start (libraries)]"
    lines = done.stderr.splitlines()   # the plan, then its reasons under it
    heading = next(i for i, line in enumerate(lines) if line.startswith("  Plan: CPU only (predicted peak"))
    assert lines[heading + 1].startswith("    - No GPU found"), lines
    assert re.search(r"^  Engine start \(libraries\) +\d+\.\d{3} s", done.stdout, re.M), done.stdout
    assert "leaked semaphore" not in done.stderr and "Traceback" not in done.stderr
    videos = list(outputs.rglob("*.mp4"))
    assert len(videos) == 1 and f"Wrote {videos[0]}" in done.stdout
    frames, fps = read_video(videos[0])
    assert frames.shape == (9, 64, 64, 3) and fps == 16
    sidecar = json.loads(videos[0].with_suffix(".json").read_text())
    assert sidecar["seed"] == 42 and sidecar["prompt"] == "a cat"
    assert "Phase timings:" in done.stdout and "Denoise" in done.stdout and "VAE decode" in done.stdout
    assert "step 4/4" in done.stderr
    assert "self-test model" in done.stdout


def test_generate_image_to_video(selftest_models_dir, outputs, image_file):
    done = generated_here("--model", "selftest-i2v", "--prompt", "waves", "--image", str(image_file),
                          "--width", "96", "--height", "64", models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 0, done.stderr
    frames, _ = read_video(next(outputs.rglob("*.mp4")))
    assert frames.shape == (9, 64, 96, 3)


@pytest.mark.parametrize("args, expected", [
    (("--model", "selftest-t2v", "--width", "70"), "width 70 is not a multiple of 16"),
    (("--model", "selftest-t2v", "--frames", "10"), "frames must be 4k+1"),
    (("--model", "selftest-t2v", "--steps", "0"), "steps 0 is out of range"),
    (("--preset", "no-such-preset"), "unknown preset 'no-such-preset'"),
    (("--model", "/no/such/model/folder"), "does not exist"),
    (("--model", "selftest-i2v", "--image", "app.py"), "is not a readable image"),
    (("--model", "selftest-i2v", "--preset", "selftest-i2v"), "image-to-video needs an image"),
])
def test_bad_input_exits_2_with_a_message_and_writes_nothing(selftest_models_dir, outputs, args, expected):
    done = generated_here("--prompt", "a cat", *args, models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said(expected) in done.stderr or expected in done.stderr
    assert not [p for p in outputs.rglob("*") if p.is_file()]


def test_empty_prompt_exits_2(selftest_models_dir, outputs):
    done = generated_here("--model", "selftest-t2v", "--prompt", " ", models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 2 and "The prompt is empty: describe what the video should show." in done.stderr


def test_unwritable_outputs_exit_2(selftest_models_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = generated_here("--model", "selftest-t2v", "--prompt", "a cat", models_dir=selftest_models_dir,
                          outputs=blocker / "out")
    assert done.returncode == 2 and "is not writable" in done.stderr


def test_generate_from_a_hub_cache_offline(model_dirs, tmp_path, outputs):
    """A repo id resolves from a populated Hugging Face cache with HF_HUB_OFFLINE=1."""
    repo = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-wan"
    shutil.copytree(model_dirs["tiny-t2v"], repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    env = app_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    done = generate("--model", "tiny-org/tiny-wan", "--preset", "selftest-t2v", "--prompt", "a cat",
                    models_dir=tmp_path / "models", outputs=outputs, env=env)
    assert done.returncode == 0, done.stderr
    sidecar = json.loads(next(outputs.rglob("*.json")).read_text())
    assert sidecar["model"]["ref"] == "tiny-org/tiny-wan" and sidecar["model"]["revision"] == REVISION
    assert "download" in sidecar["timings"]
    missing = generate("--model", "tiny-org/absent", "--preset", "selftest-t2v", "--prompt", "a cat",
                       models_dir=tmp_path / "models", outputs=outputs, env=env)
    assert missing.returncode == 2 and "offline mode is on" in missing.stderr


def test_doctor_reports_hardware_and_versions():
    done = app_main("doctor", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["hardware"]["backend"] in ("cpu", "cuda", "rocm", "mps")
    assert report["packages"]["diffusers"] and report["packages"]["torch"]
    assert Path(report["ffmpeg"]).exists()
    text = app_main("doctor")
    assert text.returncode == 0 and "Hardware:" in text.stdout and "backend" in text.stdout


def _hardware_file(tmp_path, **fields):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"backend": "cuda", "device_name": "test card", **fields}))
    return path


def test_plan_json_for_a_described_machine(tmp_path):
    hw = _hardware_file(tmp_path, vram_total_gb=24, vram_free_gb=23, ram_total_gb=64, ram_available_gb=58)
    done = app_main("plan", "--preset", "wan21-i2v-14b", "--hardware", str(hw), "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["fits"] is True and plan["strategy"] == "group_offload"
    assert plan["predicted_peak_vram_gb"] <= plan["budget_vram_gb"]
    assert {"text_encode", "image_encode", "denoise", "vae_decode"} <= set(plan["phases"])
    assert any("streams to the device" in d for d in plan["decisions"])


def test_plan_that_fits_nowhere_exits_non_zero_and_says_what_would_fit(tmp_path):
    hw = _hardware_file(tmp_path, vram_total_gb=4, vram_free_gb=3.5, ram_total_gb=8, ram_available_gb=6)
    done = app_main("plan", "--preset", "wan21-i2v-14b", "--hardware", str(hw), "--frames", "81", "--width", "832")
    assert done.returncode == 1
    assert "fits: NO" in done.stdout and "To make it fit:" not in done.stdout and "GGUF" not in done.stdout
    assert "Neither fewer frames, a smaller size nor a smaller known model makes it fit" in done.stdout
    roomier = _hardware_file(tmp_path, vram_total_gb=12, vram_free_gb=11.5, ram_total_gb=32, ram_available_gb=28)
    done = app_main("plan", "--preset", "wan21-i2v-14b", "--hardware", str(roomier), "--frames", "81", "--width", "832")
    assert done.returncode == 1 and "To make it fit:" in done.stdout
    assert "Use a smaller model: Wan2.2 TI2V 5B (Wan-AI/Wan2.2-TI2V-5B-Diffusers) fits here" in done.stdout
    as_json = app_main("plan", "--preset", "wan21-i2v-14b", "--hardware", str(hw), "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["fits"] is False


@pytest.mark.parametrize("content, expected", [
    ('{"backend": "cuda", "device_name": "x", "vram_total_gb": "lots"}', "'vram_total_gb' must be float"),
    ('{"backend": "cuda", "device_name": "x", "colour": 1}', "unknown hardware field(s): colour"),
    ('not json', "cannot read hardware file"),
])
def test_plan_refuses_a_bad_hardware_file(tmp_path, content, expected):
    path = tmp_path / "hw.json"
    path.write_text(content)
    done = app_main("plan", "--preset", "wan21-t2v-1.3b", "--hardware", str(path))
    assert done.returncode == 2 and expected in done.stderr


def test_help_lists_the_page_s_options_as_well_as_the_commands():
    done = app_main("--help")
    assert done.returncode == 0
    for part in ("{serve,generate,plan,decode,post,doctor}", "--port PORT", "--share", "--auth AUTH", "--max-queue N",
                 "--preview-every SECONDS", "'python app.py [options]' is 'python app.py serve [options]'"):
        assert part in done.stdout, part


def test_lora_options_are_files_with_a_strength_each(tmp_path, capsys):
    import app

    models = tmp_path / "models"
    (models / "loras").mkdir(parents=True)
    (models / "loras" / "mine.safetensors").write_bytes(b"")
    elsewhere = tmp_path / "other.safetensors"
    common = ["--prompt", "a cat", "--models-dir", str(models), "--user-presets", str(tmp_path / "presets")]
    args = app.parse_args(["generate", *common, "--lora", "mine.safetensors:0.5", "--lora", str(elsewhere)])
    assert args.lora == [Lora("mine.safetensors", 0.5), Lora(str(elsewhere), 1.0)]
    # A bare name is found in the models folder's loras/; in the given order, the preset's replaced.
    assert app._settings(args)[1].loras == (Lora(str(models / "loras" / "mine.safetensors"), 0.5), Lora(str(elsewhere)))
    assert app._settings(app.parse_args(["generate", *common]))[1].loras == ()
    with pytest.raises(SystemExit) as refused:
        app.parse_args(["plan", "--preset", "selftest-t2v", "--lora", "mine.safetensors:strong"])
    assert refused.value.code == 2
    assert ("argument --lora: LoRA 'mine.safetensors:strong': the strength after the last ':' must be a number; "
            "write 'detail.safetensors: 0.8'.") in capsys.readouterr().err


def test_a_file_that_is_no_lora_is_refused_before_anything_runs(tmp_path):
    done = app_main("plan", "--preset", "selftest-t2v", "--lora", "app.py:0.5", "--lora",
                    str(tmp_path / "gone.safetensors"), "--models-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == (f"error: LoRA file 'app.py' is not a .safetensors file: use the .safetensors version of "
                           f"the LoRA (other formats can run code when they are read). LoRA file "
                           f"'{tmp_path / 'gone.safetensors'}' is not there: check its name and folder.\n")


def test_plan_splits_a_job_across_gpus_when_it_fits_only_split_and_split_1_keeps_it_on_one(tmp_path):
    card = {"index": 0, "name": "card", "total_gb": 36, "free_gb": 35}
    path = tmp_path / "two-cards.json"
    path.write_text(json.dumps({"backend": "cuda", "device_name": "card", "vram_total_gb": 36, "vram_free_gb": 35,
                                "ram_total_gb": 128, "ram_available_gb": 120,
                                "devices": [card, {**card, "index": 1}]}))
    for extra, words in (((), "GPUs: 2, split (ulysses)"), (("--split", "1"), "GPUs: 1 GPU, as the settings ask.")):
        done = app_main("plan", "--preset", "wan21-t2v-14b-720p", "--hardware", str(path), *extra)
        assert done.returncode == 0 and words in done.stdout, done.stdout + done.stderr


def test_generate_with_a_lora_of_nan_weights_exits_non_zero_naming_it(selftest_models_dir, outputs, tmp_path):
    import torch
    from safetensors.torch import save_file

    from tests.helpers.loras import diffusers_lora

    lora = tmp_path / "broken.safetensors"
    save_file({name: torch.full_like(t, float("nan")) for name, t in diffusers_lora().items()}, lora)
    done = generated_here("--model", "selftest-t2v", "--prompt", "a cat", "--lora", f"{lora}:0.8",
                          models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (f"The LoRA broken.safetensors holds NaN values in {len(diffusers_lora())} of its "
            f"{len(diffusers_lora())} tensors") in done.stderr
    assert "it is damaged; remove it or download it again." in done.stderr
    assert not list(outputs.rglob("*.mp4")) and "Wrote" not in done.stdout


# ----- a new user's terminal (the first line and the table: the self-test generate above) ----------------------
def test_bad_input_is_refused_before_any_engine_starts(selftest_models_dir, outputs):
    for args in (("--width", "70"), ("--prompt", " "), ("--model", "selftest-i2v")):
        done = generated_here("--model", "selftest-t2v", "--prompt", "a cat", *args, models_dir=selftest_models_dir,
                              outputs=outputs)
        assert done.returncode == 2 and done.stderr.startswith("error: "), (args, done.stderr)
        assert "Engine start" not in done.stderr + done.stdout and len(done.stderr.splitlines()) == 1, done.stderr


def test_ctrl_c_cancels_at_the_next_step_and_exits_130_without_a_traceback(selftest_models_dir, outputs):
    """As a terminal sends it: SIGINT to the whole process group, the engine process included."""
    command = app_command("generate", "--models-dir", str(selftest_models_dir), "--outputs", str(outputs),
                          "--model", "selftest-t2v", "--prompt", "a cat", "--steps", "200", "--width", "256",
                          "--height", "256", "--frames", "33")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=app_env(),
                               cwd=ROOT, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 150
    while not any("] step 2/200" in line for line in lines) and time.monotonic() < deadline:
        assert process.poll() is None, "".join(lines)
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)
    out = process.stdout.read()
    assert process.wait(timeout=120) == 130
    reader.join(10)
    err = "".join(lines)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "leaked" not in err, err
    assert "Cancelling at the next step" in err and "Cancelled during the denoising, after step" in err, err
    assert "cancelled after step" in out and not list(outputs.rglob("*.mp4"))
    gone = time.monotonic() + 20   # the engine process ends with the app
    while time.monotonic() < gone:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the engine process outlived the app")


def test_decode_of_a_file_that_is_not_saved_latents_exits_2_with_one_sentence(tmp_path, selftest_models_dir):
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"not an image at all")
    fake = tmp_path / "fake.latents.safetensors"
    fake.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    for path, words in ((notes, "notes.png is not saved latents"), (fake, "fake.latents.safetensors is not latents"),
                        (tmp_path / "gone.latents.safetensors", "does not exist")):
        done = app_main("decode", str(path), "--models-dir", str(selftest_models_dir))
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Latents saved" not in done.stderr and not done.stdout


def _outside_python() -> str:
    """The interpreter the test's own .venv was made from: one without the app's packages, as a new user's
    ``python`` is."""
    base = Path(sys.base_prefix)
    return str(base / "python.exe" if os.name == "nt" else base / "bin" / "python3")


# The README's command lines that are no command to run as they stand, and why.
NOT_RUN = {
    "python app.py ...": "the start of any command",
    "python app.py plan --preset NAME": "a pattern: NAME is the preset the reader picks",
}


def _readme_commands() -> list[str]:
    """Every whole ``python app.py ...`` command line the README gives (inline, or a line of a code block), in order;
    the usage summaries (with [--options] or choices a|b) and a server's start left out."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = [(m.start(), " ".join(m.group(1).split())) for m in re.finditer(r"`(python app\.py [^`]+)`", text)]
    for block in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
        found += [(block.start() + n, line.split("  #")[0].strip())
                  for n, line in enumerate(block.group(1).splitlines()) if line.startswith("python app.py")]
    commands = dict.fromkeys(command for _, command in sorted(found))
    return [command for command in commands
            if command not in NOT_RUN and " serve" not in command and not re.search(r"\[|\|", command)]


def test_the_readme_s_commands_work_as_written_from_a_python_without_the_app_s_packages(tmp_path, selftest_models_dir):
    """Every command line of the README, run as written by another Python (it runs in the project's .venv, which the
    launchers made), from a folder holding the files it names (INPUT.mp4, my-gpu.json once doctor wrote it), with
    the smallest output made before it as its OUTPUT.mp4; on the self-test models, offline."""
    import numpy as np

    from engine.outputs.export import write_mp4

    python = _outside_python()
    missing = subprocess.run([python, "-c", "import torch"], capture_output=True)
    assert missing.returncode != 0, "the base interpreter has torch: this test needs one without"
    outputs = tmp_path / "outputs"
    env = app_env(WAN_MODELS_DIR=str(selftest_models_dir), WAN_OUTPUTS_DIR=str(outputs))
    write_mp4(np.full((9, 64, 96, 3), 90, np.uint8), tmp_path / "INPUT.mp4", 16)
    # Those given an output run last, on the smallest output made before them (as quick as any would be).
    commands = sorted(_readme_commands(), key=lambda command: "OUTPUT.mp4" in command)
    assert 'python app.py generate --model selftest-t2v --prompt "a cat"' in commands and len(commands) >= 10
    for command in commands:
        made = sorted((path for path in outputs.rglob("*.mp4") if path.with_suffix(".json").is_file()),
                      key=lambda path: path.stat().st_size)    # outputs (a kept input has no sidecar of its own)
        words = shlex.split(command.replace("OUTPUT.mp4", str(made[0]) if made else "OUTPUT.mp4"))
        line = [python, str(ROOT / "app.py"), *words[2:]]
        script = ["bash", "-c", " ".join(word if word == ">" else shlex.quote(word) for word in line)]
        done = subprocess.run(script, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, (command, done.stderr)
        if words[2] == "plan":   # exit 1 when the plan does not fit (a 14B model on this CPU), as documented
            assert done.returncode in (0, 1) and (done.returncode == 0 or "fits: NO" in done.stdout), \
                (command, done.stdout[-1000:], done.stderr[-1000:])
        elif "--split" in command:   # two GPUs and a 14B model: refused here in a sentence, before any load
            assert done.returncode == 2 and "error: " in done.stderr, (command, done.stderr[-1000:])
        else:
            assert done.returncode == 0, (command, done.stdout[-1000:], done.stderr[-1000:])
    assert {"generate", "post", "plan", "doctor"} <= {shlex.split(c)[2] for c in commands}
    assert (tmp_path / "my-gpu.json").is_file() and list(outputs.rglob("*_smoother2x.mp4"))


def test_generate_count_3_writes_three_videos_with_three_seeds(selftest_models_dir, outputs):
    done = generated_here("--model", "selftest-t2v", "--prompt", "three cats", "--seed", "7", "--count", "3",
                          "--steps", "2", models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 0, done.stderr
    videos = sorted(outputs.rglob("*.mp4"))
    assert len(videos) == 3 and all(f"Wrote {video}" in done.stdout for video in videos)
    assert sorted(json.loads(v.with_suffix(".json").read_text())["seed"] for v in videos) == [7, 8, 9]
    assert "[Video 2 of 3]" in done.stderr and "[Video 3 of 3]" in done.stderr


def test_post_makes_an_output_smoother_beside_it_and_refuses_a_still_in_a_sentence(selftest_models_dir, outputs):
    done = generated_here("--model", "selftest-t2v", "--prompt", "a slow river", "--frames", "9", "--steps", "2",
                          "--upscale", "2", models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 0, done.stderr
    video = next(outputs.rglob("*.mp4"))
    assert "Larger (upscale)" in done.stdout + done.stderr
    smoother = app_main("post", str(video), "--interpolate", "2", "--outputs", str(outputs),
                        "--models-dir", str(selftest_models_dir))
    assert smoother.returncode == 0, smoother.stderr
    made = video.with_name(video.stem + "_smoother2x.mp4")
    assert f"Wrote {made}" in smoother.stdout and json.loads(made.with_suffix(".json").read_text())["output"][
        "frames"] == 17
    stills = outputs.parent / "stills"   # one frame: a PNG, and no video
    still = generated_here("--model", "selftest-t2v", "--prompt", "a still", "--frames", "1", "--steps", "2",
                           models_dir=selftest_models_dir, outputs=stills)
    assert still.returncode == 0, still.stderr
    [image] = list(stills.rglob("*.png"))
    assert not list(stills.rglob("*.mp4"))
    refused = app_main("post", str(image), "--interpolate", "2")
    assert refused.returncode == 2 and "a still has no frames" in refused.stderr.lower()


def test_extend_continues_an_output_with_its_prompt_and_video_remakes_one_by_a_strength(selftest_models_dir,
                                                                                          outputs):
    done = generated_here("--model", "selftest-t2v", "--prompt", "a slow river", "--frames", "9", "--steps", "2",
                          models_dir=selftest_models_dir, outputs=outputs)
    assert done.returncode == 0, done.stderr
    video = next(outputs.rglob("*.mp4"))
    # No prompt, no preset, no model: the output's own prompt and the self-test's image-to-video preset.
    extended = generated_here("--extend", str(video), "--frames", "5", "--steps", "2",
                              models_dir=selftest_models_dir, outputs=outputs)
    assert extended.returncode == 0, extended.stderr
    joined = Path(next(line.split(" ", 1)[1] for line in extended.stdout.splitlines() if line.startswith("Wrote ")))
    sidecar = json.loads(joined.with_suffix(".json").read_text())
    assert sidecar["prompt"] == "a slow river" and sidecar["model"]["ref"] == "selftest-i2v"
    assert sidecar["output"]["frames"] == 9 + 5 - 1 and "It extends" in extended.stdout
    assert "Join (the new part after the video)" in extended.stdout + extended.stderr
    remade = generated_here("--video", str(video), "--model", "selftest-t2v", "--strength", "0",
                            "--prompt", "the same river", "--steps", "2", models_dir=selftest_models_dir,
                            outputs=outputs)
    assert remade.returncode == 0, remade.stderr
    made = Path(next(line.split(" ", 1)[1] for line in remade.stdout.splitlines() if line.startswith("Wrote ")))
    data = json.loads(made.with_suffix(".json").read_text())
    assert data["mode"] == "v2v" and data["parameters"]["strength"] == 0 and data["output"]["frames"] == 9
    assert "video_encode" in data["timings"] and "denoise" not in data["timings"]   # strength 0: the input back
    missing = generated_here("--video", str(outputs / "missing.mp4"), "--prompt", "x", models_dir=selftest_models_dir,
                             outputs=outputs)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr


def test_a_playlist_or_manifest_given_as_a_video_is_refused_before_anything_reads_what_it_names(selftest_models_dir,
                                                                                                  outputs, tmp_path):
    from tests.helpers.containers import dash, hls, video

    secret = video(tmp_path / "private" / "secret.mp4")
    (tmp_path / "video.mp4").write_text(dash(secret))
    (tmp_path / "clip.m3u8").write_text(hls(secret))
    for option, upload, named in (("--video", "video.mp4", "a DASH manifest"), ("--extend", "clip.m3u8",
                                                                                  "an HLS playlist")):
        done = generated_here(option, str(tmp_path / upload), "--prompt", "x", models_dir=selftest_models_dir,
                              outputs=outputs)
        assert done.returncode == 2 and named in done.stderr and "names other files" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "Engine start" not in done.stdout + done.stderr
    assert not list(outputs.rglob("*.mp4"))
