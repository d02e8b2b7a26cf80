"""Issue 15, point 8: durable, race-free writes (shared model cache, run outputs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

CONVERTER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from gnll.backends import embedded as registry  # the catalogue and its conversion

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


@pytest.mark.e2e
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


# ------------------------------------------------------------------------------------ run outputs
class _Recorder:
    """Records fsync (of files and of directories) and rename calls, in order."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            target = os.readlink(f"/proc/self/fd/{fd}")
            self.events.append(("fsync", target))
            return real_fsync(fd)

        def replace(src, dst):
            self.events.append(("replace", f"{src} -> {dst}"))
            return real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def index(self, kind: str, pred) -> int:
        return next(i for i, (k, v) in enumerate(self.events) if k == kind and pred(v))


def test_outputs_are_fsynced_renamed_and_their_directory_fsynced(tmp_path, monkeypatch):
    from fakes import FakeModel, cfg, make_data_dir

    from gnll.evaluation.run.runner import Evaluator

    data = make_data_dir(tmp_path / "data")
    out = tmp_path / "run"
    rec = _Recorder(monkeypatch)
    Evaluator(cfg(data, out, measures=["g-nll"]), model=FakeModel()).run()
    for name in ("samples.jsonl", "table.md", "results.json"):
        renamed = rec.index("replace", lambda v, n=name: v.endswith(f" -> {out / n}"))
        tmp = rec.events[renamed][1].split(" -> ")[0]
        assert Path(tmp).parent == out and Path(tmp).name != name
        synced = rec.index("fsync", lambda v, t=tmp: v == t)
        assert synced < renamed, name  # the data is on disk before the new name points at it
        after = [v for k, v in rec.events[renamed + 1 :] if k == "fsync"]
        assert str(out) in after, name  # and the rename itself is made durable
    assert not list(out.glob(".*.tmp"))


def test_results_json_has_no_local_paths(tmp_path):
    from fakes import FakeModel, cfg, make_data_dir

    from gnll.evaluation.run.runner import Evaluator

    class LocalModel(FakeModel):
        def info(self):
            return {"name": self.name, "source": str(tmp_path / "models" / "my-checkpoint")}

    data = make_data_dir(tmp_path / "data")
    out = tmp_path / "run"
    Evaluator(cfg(data, out, measures=["g-nll"]), model=LocalModel()).run()
    text = (out / "results.json").read_text()
    assert str(tmp_path) not in text and str(Path.home()) + "/" not in text
    assert '"my-checkpoint"' in text and '"SVAMP.json"' in text  # the names stay


def test_atomic_file_uses_unique_temporary_names_and_cleans_up(tmp_path):
    from gnll.evaluation.run.cache import atomic_file

    target = tmp_path / "samples.jsonl"
    with atomic_file(target) as a, atomic_file(target) as b:  # two writers at once
        assert a.name != b.name
        a.write("a\n")
        b.write("b\n")
    assert target.read_text() == "a\n"  # the last one to finish wins, whole
    try:
        with atomic_file(target) as c:
            c.write("half")
            raise RuntimeError("killed")
    except RuntimeError:
        pass
    assert target.read_text() == "a\n" and not list(tmp_path.glob(".*.tmp"))
