"""Benchmark: activation compression (BFP formats, adaptive, Gist) against fp32 training.

Each case trains a fresh model in its own subprocess (so peak RSS is per case) and reports:
- saved_bytes: bytes of activations saved for backward in one step on a fixed batch, counted in
  the pack hook (fp32 counts the same tensors unencoded; parameters are not counted);
- peak_saved_bytes: the most bytes the hooks held alive at once (the same step);
- peak_rss_delta_mb: ru_maxrss after training minus before it, in the case's own process
  (whole-process memory: allocator noise of a few MB is expected on small models);
- accuracy on the held-out split, and step_ms (wall time per training step, probes included).
Torch runs with one thread per process: on the 2 shared cores, two OpenMP threads contend badly.

Usage: python bench/compression.py [--quick]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Results, parse_args  # noqa: E402

DIGITS_CASES = ["fp32", "bfp8", "bfp6", "bfp4", "bfp3", "nonuniform4", "bfp4+outliers1%", "adaptive", "gist",
                "gist+adaptive"]
SCENE_CASES = ["fp32", "bfp4", "gist+adaptive"]


def _setup(case: str, model):  # -> (model, compressor | None, controller | None)
    from cloud.training.compression import (
        ActivationCompressor,
        AdaptiveController,
        ControllerSettings,
        LayerPolicy,
        gist_transform,
    )
    from models.numerics import BfpFormat

    fixed = {"bfp8": BfpFormat(mantissa_bits=8), "bfp6": BfpFormat(mantissa_bits=6),
             "bfp4": BfpFormat(mantissa_bits=4), "bfp3": BfpFormat(mantissa_bits=3),
             "nonuniform4": BfpFormat(mantissa_bits=4, levels="log"),
             "bfp4+outliers1%": BfpFormat(mantissa_bits=4, outlier_fraction=0.01),
             "gist": BfpFormat(mantissa_bits=8)}  # Gist's delayed precision reduction at 8 bits
    ssdc: frozenset[str] = frozenset()
    if case.startswith("gist"):
        model, plan = gist_transform(model)
        ssdc = plan.ssdc_layers
    if case == "fp32":
        return model, None, None
    if case.endswith("adaptive"):
        layers = [n for n, m in model.named_modules() if n and not any(True for _ in m.children())]
        controller = AdaptiveController(layers, ControllerSettings(window=10))
        return model, ActivationCompressor(model, controller.policy, ssdc_layers=ssdc), controller
    return model, ActivationCompressor(model, LayerPolicy.uniform(fixed[case]), ssdc_layers=ssdc), None


def run_case(task: str, case: str, quick: bool, data_path: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from cloud.training.compression import (
        ActivationCompressor,
        LayerPolicy,
        count_saved_bytes,
        train_compressed,
    )
    from models.digits import DigitsSplit, accuracy, digits_cnn

    if task == "digits":
        from models.digits import load_digits_split
        split = load_digits_split()
        make, epochs, batch, lr, opt = digits_cnn, (8 if quick else 20), 128, 0.05, "sgd"
    else:
        from models.scene import scene_cnn
        split = DigitsSplit(*torch.load(data_path))
        make, epochs, batch, lr, opt = scene_cnn, (4 if quick else 12), 32, 2e-3, "adam"
    torch.manual_seed(0)
    model, compressor, controller = _setup(case, make())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = train_compressed(model, split, compressor=compressor, controller=controller, epochs=epochs,
                              batch_size=batch, lr=lr, optimizer_name=opt)
    rss_delta_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    counter = compressor or ActivationCompressor(model, LayerPolicy())
    if controller is not None:
        counter.policy = controller.policy
    count_saved_bytes(model, counter, split.train_x[:batch], split.train_y[:batch])
    return {"saved_bytes": counter.total().stored, "peak_saved_bytes": counter.peak_live_bytes,
            "peak_rss_delta_mb": rss_delta_kb / 1024, "accuracy": accuracy(model, split.test_x, split.test_y),
            "step_ms": result.step_seconds * 1e3,
            "decisions": len(controller.decisions) if controller else 0}


def _scene_data(quick: bool, path: str) -> None:
    import torch

    from models.scene import scene_dataset
    data = scene_dataset(0, 160 if quick else 600)
    n_test = len(data.y) // 4
    torch.save((data.x[n_test:], data.y[n_test:], data.x[:n_test], data.y[:n_test]), path)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        task, case, quick, data_path = sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
        print(json.dumps(run_case(task, case, quick, data_path)))
        return 0
    args = parse_args(__doc__.splitlines()[0])
    results = Results("compression", args.quick)
    measured: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_path = str(Path(tmp) / "scene.pt")
        tasks = [("digits", DIGITS_CASES)]
        if (ROOT / "models" / "scene.py").exists():
            _scene_data(args.quick, data_path)
            tasks.append(("scene", SCENE_CASES))
        else:
            print("models/scene.py missing: scene cases skipped")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for task, cases in tasks:
            for case in cases:
                quick_flag = "1" if args.quick else "0"
                command = [sys.executable, __file__, "--case", task, case, quick_flag, data_path]
                out = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
                                     check=True)
                measured[task, case] = row = json.loads(out.stdout.strip().splitlines()[-1])
                for metric in ("saved_bytes", "peak_saved_bytes", "peak_rss_delta_mb", "accuracy", "step_ms"):
                    results.add(f"{task}/{case}", "fp32" if case == "fp32" else "ours", metric, row[metric])
    base, ours = measured["digits", "fp32"], measured["digits", "gist+adaptive"]
    results.ratio("saved_bytes_reduction", base["saved_bytes"], ours["saved_bytes"])
    results.ratios["accuracy_drop_pp"] = 100 * (base["accuracy"] - ours["accuracy"])
    results.ratio("step_time_vs_fp32", base["step_ms"], ours["step_ms"])
    for case in DIGITS_CASES[1:]:
        results.ratios[f"saved_bytes_reduction[{case}]"] = base["saved_bytes"] / measured["digits", case][
            "saved_bytes"]
        results.ratios[f"step_time_vs_fp32[{case}]"] = base["step_ms"] / measured["digits", case]["step_ms"]
    if ("scene", "fp32") in measured:
        sb, so = measured["scene", "fp32"], measured["scene", "gist+adaptive"]
        results.ratios["scene_saved_bytes_reduction"] = sb["saved_bytes"] / so["saved_bytes"]
        results.ratios["scene_accuracy_drop_pp"] = 100 * (sb["accuracy"] - so["accuracy"])
        results.ratios["scene_step_time_vs_fp32"] = sb["step_ms"] / so["step_ms"]
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
