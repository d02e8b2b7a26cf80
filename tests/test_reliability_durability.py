"""Issue 15, point 8: durable, race-free writes (shared model cache, run outputs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

CONVERTER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from gnll.backends import registry

    log = Path(sys.argv[1])

    def slow_convert(spec, target, version):
        # Stands in for the 30-60 s GGUF de-quantisation: long enough for the runs to overlap.
        with log.open("a") as fh:
            fh.write(f"convert {os.getpid()}\\n")
        out = target.parent / f".tmp-{os.getpid()}"
        out.mkdir()
        time.sleep(1.5)
        (out / "weights").write_text("w" * 1000)
        (out / "gnll-model.json").write_text(json.dumps({"name": spec.name}))
        registry._publish(out, target)

    registry._convert_gguf = slow_convert
    spec = registry.EmbeddedModel("fake", "json", "-", lambda d: d, True, "stand-in")
    path = registry.embedded_model_dir(spec, progress=False)
    assert (path / "weights").read_text() == "w" * 1000
    print(path)
    """
)


def test_two_processes_converting_one_embedded_model_convert_once(tmp_path):
    env = {**os.environ, "GNLL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": SRC}
    log = tmp_path / "log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERTER, str(log)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert outs[0][0] == outs[1][0]  # both use the same checkpoint
    assert len(log.read_text().splitlines()) == 1  # and only one of them converted it
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == [
        Path(outs[0][0].strip()).name
    ]
