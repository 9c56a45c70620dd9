"""What ``app.py doctor`` reports for a bug report: the app and Python, the platform, the packages that matter, ffmpeg,
the hardware as the engine sees it, the environment variables that change its behaviour, and the outputs folder."""
from __future__ import annotations

import os

PACKAGES = ("torch", "diffusers", "transformers", "accelerate", "gradio", "huggingface-hub", "imageio-ffmpeg",
            "safetensors", "pillow", "psutil")
ENVIRONMENT = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF",
               "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "HSA_OVERRIDE_GFX_VERSION", "CUDA_VISIBLE_DEVICES",
               "FORWARDED_ALLOW_IPS", "WAN_ENGINE_START")


def doctor_report(outputs: str) -> dict:
    """The report as data (``app.py doctor --json`` prints it)."""
    import platform
    from importlib import metadata

    from engine import __version__
    from engine.device.hardware import detect_hardware
    from engine.settings.request import check_outputs_dir

    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    try:
        import imageio_ffmpeg
        ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as exc:  # report, don't crash: this is the bug-report tool
        ffmpeg = f"not found ({exc})"
    return {
        "app": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": packages,
        "ffmpeg": ffmpeg,
        "hardware": detect_hardware().to_dict(),
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
        "outputs": {"path": outputs, "problem": check_outputs_dir(outputs)},
    }


def report_lines(report: dict, outputs: str) -> list[str]:
    """The report as a person reads it."""
    from engine import APP_NAME

    lines = [f"{APP_NAME} {report['app']} on Python {report['python']} ({report['platform']})", "Hardware:"]
    for key, value in report["hardware"].items():
        if key == "devices":   # one line per GPU, numbered as --gpus numbers them
            lines += [f"  {'GPU ' + str(gpu['index']):<18} {gpu['name']}, {gpu['total_gb']:.1f} GB "
                      f"({gpu['free_gb']:.1f} free)" for gpu in value]
            continue
        lines.append(f"  {key:<18} {value}")
    lines.append("Packages:")
    lines += [f"  {key:<18} {value or 'not installed'}" for key, value in report["packages"].items()]
    lines.append(f"ffmpeg: {report['ffmpeg']}")
    lines.append("Environment:" + ("" if report["environment"] else " (none of the relevant variables set)"))
    lines += [f"  {key}={value}" for key, value in report["environment"].items()]
    problem = report["outputs"]["problem"]
    lines.append(f"Outputs folder: {outputs} ({problem or 'writable'})")
    return lines
