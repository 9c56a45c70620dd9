"""The speed benchmark's own code runs end to end on the CPU (``--tiny``), so the GPU run's table cannot rot."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.bench

# The benchmark scripts' --tiny runs (and the engines and commands they start) on one CPU thread each: their work is
# many tiny operations, where a second thread only waits on the first, and the other test worker has the other core
# (the speed benchmark's run takes 36 s instead of 67 s on the 2-core machine). Nothing here reads a time.
BENCH_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_tiny(script: str, tmp_path) -> tuple[dict, object]:
    """(the results, their file) of ``bench/SCRIPT --tiny``, which must end well with no part failed."""
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), str(out), "--tiny", "--work",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=600, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert "failures" not in results, results["failures"]
    return results, out


def test_the_speed_bench_runs_every_part_on_the_self_test_model(tmp_path):
    results, out = run_tiny("speed.py", tmp_path)
    assert all(run["rc"] == 0 for side in results["cold"]["runs"].values() for run in side), results["cold"]
    assert results["cold"]["ratio"] > 0
    for case in ("fastwan", "long"):
        engine = results["warm"][case]["engine"]
        exact = [r for r in engine if r["variant"] in ("default", "compile off") and r["latents_vs_plain"] is not None]
        assert exact and all(r["latents_vs_plain"] == 0.0 for r in exact)   # the engine's latents are diffusers'
        assert all(r["predicted"] and r["timings"] for r in engine)
    light = [r for r in results["warm"]["fastwan"]["engine"] if r["variant"] == "light VAE + compile"]
    assert light and light[0]["speed"]["decoder"] == "vae_light (lightvaew2_1)", light
    assert results["decode"]["streamed equals whole"] is True
    assert results["decode"]["fast decoder frames"] == [9, 64, 64, 3]
    assert {"none", "first_block", "taylor", "mag", "mag (calibrated)"} <= set(results["caches"])
    assert results["calibration"]["backend"] == "cpu"
    assert results["decode"]["fast decoder, streamed as the engine does"]["seconds"] > 0
    assert results["decode"]["fast decoder streamed equals whole"]["within_2"] == 1.0

    from bench.speed_table import tables

    table = tables([out])
    assert "said / took" in table and "| fastwan, default |" in table   # the engine's own predictions, per run


def test_the_multi_gpu_bench_runs_on_two_cpu_engines(tmp_path):
    """bench/multi_gpu.py through the app's EnginePool with two CPU engines (gloo): whole, split and the queue."""
    results, out = run_tiny("multi_gpu.py", tmp_path)
    run = results["1.3b"]
    assert run["engines"] == 2 and run["split_latents_vs_whole"] == 0.0      # split exactly as whole (float32)
    assert run["split"]["split"]["ranks"] == 2 and run["split"]["split"]["kind"] == "ulysses"
    assert run["whole"]["split"] is None
    assert len(run["whole"]["steps"]) == len(run["split"]["steps"]) == 4
    assert run["queue"]["one_engine_s"] > 0 and run["queue"]["two_engines_s"] > 0
    from bench.multi_gpu import table

    assert "| 1.3b | 64x64x9 |" in table([out])


def test_the_memory_validation_bench_runs_each_self_test_preset_through_the_engine(tmp_path):
    out = tmp_path / "validate.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "validate_memory.py"), str(out), "--tiny", "--work",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=600, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["preset"] for row in rows] == ["selftest-t2v", "selftest-i2v"]
    assert all(row["status"] == "ok" and row["measured_peak_gb"] > 0 and row["predicted_peak_run_gb"] > 0
               for row in rows), rows


def test_the_memory_soak_runs_every_job_on_the_self_test_model(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "memory_soak.py"), str(out), "--tiny", "--work",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=600, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads(out.read_text())
    jobs = results["jobs"] + results["small_machine"]
    assert len(jobs) >= 30 and all(job.get("ended") == "JobFinished" for job in jobs), jobs
    assert [job["strategy"] for job in results["small_machine"]][:2] == ["disk_offload"] * 2
    merged = [job for job in results["jobs"] if job["settings"].get("loras") and "gguf" not in job["tag"]]
    assert merged and all(job["loras"] == "merged" for job in merged)
    assert next(job for job in results["jobs"] if job["tag"] == "A gguf lora 1.0")["loras"] == "beside the weights"

    from bench.soak_table import table

    assert "| A swap |" in table(results)


def test_the_lora_differences_check_runs_every_placement_on_the_cpu(tmp_path):
    out = tmp_path / "lora-diffs.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "lora_diffs_check.py"), str(out), "--cpu"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(row["model"], row["strategy"]) for row in rows] == [
        ("tiny-t2v", "all_on_device"), ("tiny-t2v", "group_offload"), ("tiny-t2v", "leaf_offload"),
        ("tiny-a14b", "all_on_device"), ("tiny-a14b", "expert_swap"), ("tiny-a14b", "group_offload")]
    for row in rows:   # each placement as the hand merge, and every change taken out after
        assert row["planned"] == row["strategy"] and row["after_equals_own"], row
        assert row["lora_vs_hand_rel"] < 1e-5 < 1e-2 < row["lora_effect_rel"], row


def test_the_decode_window_bench_runs_on_the_cpu_and_finds_every_window_within_a_level(tmp_path):
    out = tmp_path / "windows.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_windows.py"), str(out), "--tiny",
                           "--windows", "1,3,20"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = json.loads(out.read_text())["wan21 tiny"]
    assert {"window 1", "window 3", "window 20"} <= set(runs)
    # On the CPU every window decodes the frames of one latent frame at a time, or within one level of them: on some
    # CPUs the self-test VAE's larger convolutions round a few pixels the other way (3 in a million at window 3).
    # The engine's own decodes are held to exact in tests/engine/test_decoding.py.
    assert all(run["frames_vs_window_1"]["max"] <= 1 for name, run in runs.items() if name.startswith("window"))
    assert runs["window 20"]["frames_vs_window_1"]["share_differing"] < 1e-4
    assert all(run["seconds"] > 0 for run in runs.values())


def _run_plain_tiny(script: str, tmp_path) -> dict:
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), str(out), "--tiny"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=BENCH_ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_attention_kernel_bench_runs_on_the_cpu_and_says_what_did_not_import(tmp_path):
    results = _run_plain_tiny("attention_kernels.py", tmp_path)
    assert results["diffusers_backends"][0] == "native"
    assert results["tiny"]["sdpa"]["max_vs_sdpa"] == 0.0 and results["tiny"]["diffusers native"]["ms"] > 0
    assert "flash_attn_4" not in results["tiny"]   # a GPU kernel: never run on the CPU (nor installed here)


def test_the_light_vae_bench_decodes_with_all_three_and_models_each(tmp_path):
    results = _run_plain_tiny("light_vae.py", tmp_path)
    assert set(results["measured"]) == {"vae", "vae_light", "fast"}
    assert all(row["seconds"] > 0 for row in results["measured"].values())
    assert results["light_vae"]["parameters"] < results["light_vae"]["vae_parameters"]
    assert results["light_vae_factor"] == round(results["measured"]["vae_light"]["seconds"]
                                                / results["predicted"]["vae_light_modelled"], 3)
    assert results["calibration"]["fp8_matmul_tflops"] == []        # quick, on the CPU: not measured


def test_the_guidance_batch_bench_compares_one_batch_with_two_calls(tmp_path):
    results = _run_plain_tiny("guidance_batch.py", tmp_path)
    assert results["conditional"]["equal"] and results["unconditional"]["equal"]   # exact on the CPU
    assert results["one_batch"]["step_s"] > 0 and results["two_calls"]["step_s"] > 0


def test_the_stored_load_bench_loads_each_layout_through_the_engine(tmp_path):
    """bench/stored_load.py: the published, bf16 and FastWan layouts written from one model, each loaded by the engine
    in the benchmark's child process (--tiny: one child loads the three in turn), FastWan's with its gate."""
    results, _ = run_tiny("stored_load.py", tmp_path)
    loads = results["loads"]
    assert set(loads) == {"published", "bf16", "fastwan"} and set(loads["fastwan"]) == {"cold"}
    runs = [run for states in loads.values() for run in states.values()]
    assert all("failed" not in run for run in runs), runs
    assert all(run["timings"]["load"] > 0 and run["load"]["rss_gb"] > 0 and run["predicted_load_ram_gb"] > 0
               for run in runs)
    assert loads["fastwan"]["cold"]["transformer"] == "GatedWanTransformer3DModel"
    assert loads["fastwan"]["cold"]["gate_layers"] == 2
    assert any(path.startswith("transformer/") and "-of-" in path for path in results["folders"]["published"]["files"])
