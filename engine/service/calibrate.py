"""python -m engine.service.calibrate [DEVICE] [DTYPE] [--quick] [--save FOLDER]: this machine's calibration from
the command line, its device's rates (engine/device/calibrate.py) with its export's (engine/outputs/export_rates.py)."""
from __future__ import annotations

import json
from pathlib import Path

from engine.device.calibrate import CALIBRATION_FILE, calibrate
from engine.outputs.export_rates import export_rates


def main(argv: list[str] | None = None) -> None:
    """python -m engine.service.calibrate [DEVICE] [DTYPE] [--quick] [--save FOLDER]: measure, print the
    calibration as JSON and, with --save, keep it in FOLDER (the models folder) for the app to read."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("device", nargs="?", default="cuda", help="cuda, mps or cpu (default cuda)")
    parser.add_argument("dtype", nargs="?", default="bfloat16", help="the compute dtype (default bfloat16)")
    parser.add_argument("--quick", action="store_true", help="smaller shapes: about a second on a GPU")
    parser.add_argument("--save", type=Path, metavar="FOLDER", help=f"write FOLDER/{CALIBRATION_FILE}")
    args = parser.parse_args(argv)
    result = calibrate(args.device, args.dtype, quick=args.quick, export_rates=export_rates)
    print(json.dumps(result.to_dict(), indent=2))
    if args.save:
        print(f"saved {result.save(args.save)}")


if __name__ == "__main__":
    main()
