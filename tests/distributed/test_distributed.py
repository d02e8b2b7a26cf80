"""gnll on Ray: ``gnll score`` / ``gnll eval`` on replicas give the local engine's outputs.

A local Ray cluster (2 CPUs, loopback) starts once per session (the ``ray_cluster`` fixture).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import ToyModel, kill_when_eval_starts

from gnll.distributed.cluster import Cluster
from gnll.evaluation.run.runner import EvalConfig, Evaluator
from gnll.scoring import ScoreJob, run_score_job

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e  # Ray starts worker processes


def make_data_dir(root: Path, n: int = 200) -> Path:
    """A TriviaQA file in its original format: question k asks for k + 1."""
    (root / "triviaqa").mkdir(parents=True)
    with (root / "triviaqa" / "triviaqa_unfiltered_validation.jsonl").open("w") as fh:
        for k in range(n):
            rec = {"index": k, "question": f"What is {k} plus one?", "aliases": [f"n{k + 1}"]}
            fh.write(json.dumps(rec) + "\n")
    return root


def toy_job(tmp: Path, inp: Path, name: str, **kw) -> ScoreJob:

    base = dict(
        input=str(inp),
        output=str(tmp / f"{name}.jsonl"),
        input_format="jsonl",
        output_format="jsonl",
        errors=tmp / f"{name}.jsonl.errors.jsonl",
        long=False,
        chunk_size=7,
        progress=False,
    )
    base.update(kw)
    return ScoreJob(**base)


def write_rows(path: Path, n: int) -> Path:
    """Rows with an id each; some not JSON, some without an answer, some over the toy's context."""
    lines = []
    for i in range(n):
        if i % 11 == 5:
            lines.append(f'{{"id": {i}, "question": "broken')
        elif i % 13 == 7:
            lines.append(json.dumps({"id": i, "question": f"q{i}"}))
        elif i % 17 == 3:
            lines.append(json.dumps({"id": i, "question": "x" * 500, "answer": "too long"}))
        else:
            lines.append(json.dumps({"id": i, "question": f"What is {i}?", "answer": f"ans{i}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_score_job_on_ray_matches_local(ray_cluster, tmp_path):
    from gnll.distributed.scoring import run_score_job as run_ray

    inp = write_rows(tmp_path / "in.jsonl", 60)
    local = run_score_job(ToyModel(), toy_job(tmp_path, inp, "local"))
    remote = run_ray(toy_job(tmp_path, inp, "ray"), ToyModel, None, Cluster("auto", replicas=2))
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    errs = (tmp_path / "ray.jsonl.errors.jsonl").read_bytes()
    assert errs == (tmp_path / "local.jsonl.errors.jsonl").read_bytes() and errs
    assert (remote.scored, remote.failed) == (local.scored, local.failed) and local.failed


def test_ray_data_score_puts_bad_rows_in_an_error_column(ray_cluster, tmp_path):
    import ray

    from gnll.distributed import score

    rows = [{"id": i, "question": f"What is {i}?", "answer": f"ans{i}"} for i in range(30)]
    rows[4]["answer"] = ""
    rows[9]["question"] = "x" * 500  # over the toy model's context
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = score(
        ray.data.read_json(str(src)), model=ToyModel, replicas=2, cpus_per_replica=0.5, batch_size=8
    )
    got = {r["id"]: r for r in out.take_all()}
    assert sorted(got) == list(range(30))
    local = run_score_job(ToyModel(), toy_job(tmp_path, src, "local", chunk_size=8))
    assert local.failed == 2
    errs = [json.loads(x) for x in (tmp_path / "local.jsonl.errors.jsonl").read_text().splitlines()]
    errors = {e["id"]: e["error"] for e in errs}
    for line in (tmp_path / "local.jsonl").read_text().splitlines():
        want = json.loads(line)
        r = got[want["id"]]
        assert r["error"] is None and abs(r["nll"] - want["nll"]) <= 1e-6  # same path: Ray runs the same batches as the local run, which is exact
        assert r["is_greedy"] == want["is_greedy"] and r["num_tokens"] == want["num_tokens"]
    for i, msg in errors.items():
        assert got[i]["error"] == msg and got[i]["nll"] is None
    out.write_parquet(str(tmp_path / "scored"))  # one schema across blocks with and without errors
    assert ray.data.read_parquet(str(tmp_path / "scored")).count() == 30


def test_a_killed_replica_is_replaced_and_every_row_comes_once(ray_cluster, tmp_path, monkeypatch):
    import threading
    from functools import partial

    import ray

    from gnll.distributed import scoring

    inp = write_rows(tmp_path / "in.jsonl", 80)
    run_score_job(ToyModel(), toy_job(tmp_path, inp, "local", chunk_size=4))
    started, killed = [], threading.Event()
    real_start = scoring.start_replicas

    def start_and_schedule_a_kill(*args, **kwargs):
        actors = real_start(*args, **kwargs)
        started.extend(actors)
        threading.Timer(1.0, lambda: (ray.kill(actors[0], no_restart=False), killed.set())).start()
        return actors

    monkeypatch.setattr(scoring, "start_replicas", start_and_schedule_a_kill)
    slow = partial(
        ToyModel, delay=0.25
    )  # 20 chunks of 0.25 s on 2 replicas: the kill lands mid-run
    summary = scoring.run_score_job(
        toy_job(tmp_path, inp, "ray", chunk_size=4), slow, None, Cluster("auto", replicas=2)
    )
    assert killed.is_set() and len(started) == 2
    out = (tmp_path / "ray.jsonl").read_bytes()
    assert out == (tmp_path / "local.jsonl").read_bytes()
    ids = [json.loads(x)["id"] for x in out.splitlines()]
    assert len(ids) == len(set(ids)) == summary.scored
    assert (tmp_path / "ray.jsonl.errors.jsonl").read_bytes() == (
        tmp_path / "local.jsonl.errors.jsonl"
    ).read_bytes()


def test_replica_that_cannot_load_the_model_fails_in_one_line(ray_cluster, tmp_path):
    from gnll.distributed.cluster import RayUnavailable
    from gnll.distributed.scoring import run_score_job as run_ray

    inp = write_rows(tmp_path / "in.jsonl", 5)
    with pytest.raises(RayUnavailable, match="could not load the model") as e:
        run_ray(toy_job(tmp_path, inp, "x"), str(tmp_path / "no-such-model"), None, Cluster("auto"))
    assert "\n" not in str(e.value)


def test_import_gnll_never_imports_ray_and_the_local_engine_runs_without_it(tmp_path):
    inp = write_rows(tmp_path / "in.jsonl", 12)
    code = f"""
import sys
sys.modules["ray"] = None  # as if Ray were not installed
sys.path[:0] = [{str(TESTS)!r}, {str(Path(__file__).parent)!r}]
import gnll, gnll.distributed, gnll.scoring
from fakes import ToyModel
from test_distributed import toy_job
from pathlib import Path
s = gnll.scoring.run_score_job(ToyModel(), toy_job(Path({str(tmp_path)!r}), Path({str(inp)!r}), "o"))
assert s.scored == 9, s
from gnll.distributed.cluster import RayUnavailable, Cluster
from gnll.distributed.scoring import run_score_job
try:
    run_score_job(toy_job(Path({str(tmp_path)!r}), Path({str(inp)!r}), "r"), ToyModel, None, Cluster())
except RayUnavailable as e:
    print("ERR", e)
"""
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == (
        "ERR the ray engine needs Ray: pip install 'gnll[ray]' (or use --engine local)"
    )
    clean = subprocess.run(
        [sys.executable, "-c", "import sys, gnll, gnll.distributed; print('ray' in sys.modules)"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert clean.stdout.strip() == "False", clean.stderr


def test_no_cluster_at_address_fails_fast_in_one_line():
    code = (
        "import time; from gnll.distributed.cluster import connect, RayUnavailable\n"
        "t = time.time()\n"
        "try:\n    connect('127.0.0.1:1')\nexcept RayUnavailable as e:\n"
        "    print(round(time.time() - t), e)\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    secs, _, msg = res.stdout.strip().partition(" ")
    assert msg.startswith("no Ray cluster at 127.0.0.1:1") and "ray start --head" in msg, res
    assert "\n" not in msg and int(secs) < 30


def eval_config(data_dir: Path, model: Path, out: Path, **kw) -> EvalConfig:
    base = dict(
        model=str(model),
        tasks=["triviaqa_short"],
        output_path=out,
        data_dir=str(data_dir),
        limit=10,
        beams=2,
        samples=2,
        chunk_size=3,
        heldout_size=4,
        temperatures=(0.5, 1.0),
        clusterer="exact",
        n_boot=20,
        plots=False,
        progress=False,
    )
    base.update(kw)
    return EvalConfig(**base)


def test_eval_on_ray_is_byte_identical_to_local(ray_cluster, tiny_llama, tmp_path):
    from gnll.distributed.evaluation import RayEvaluator

    data = make_data_dir(tmp_path / "data")
    model = tiny_llama()
    Evaluator(eval_config(data, model, tmp_path / "local")).run()
    cluster = Cluster("auto", replicas=2)
    RayEvaluator(eval_config(data, model, tmp_path / "ray"), cluster=cluster).run()
    for name in ("results.json", "samples.jsonl", "table.md"):
        local = (tmp_path / "local" / name).read_bytes()
        assert (tmp_path / "ray" / name).read_bytes() == local, name
    recs = [json.loads(x) for x in (tmp_path / "local" / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 10 and len(recs[0]["samples"]) == 2 and len(recs[0]["beams"]) == 2
    assert "replicas" in json.loads((tmp_path / "ray" / "timings.json").read_text())["seconds"]

    # A driver killed with -9 mid-run, resumed by the local engine: the same bytes again.
    out = tmp_path / "killed"
    script = KILLED_DRIVER.format(
        src=str(SRC),
        tests=str(Path(__file__).parent),
        data=str(data),
        model=str(model),
        out=str(out),
        address=ray_cluster.get_runtime_context().gcs_address,
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    kill_when_eval_starts(proc, out)
    # The killed directory, resumed on Ray (a copy) and by the local engine: the same bytes both ways.
    on_ray = tmp_path / "killed-resumed-on-ray"
    shutil.copytree(out, on_ray)
    RayEvaluator(eval_config(data, model, on_ray, resume=True), cluster=cluster).run()
    Evaluator(eval_config(data, model, out, resume=True)).run()
    for name in ("results.json", "samples.jsonl"):
        assert (out / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
        assert (on_ray / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


KILLED_DRIVER = """
import sys
sys.path[:0] = [{src!r}, {tests!r}]
from pathlib import Path
from test_distributed import eval_config
from gnll.distributed.cluster import Cluster, connect
from gnll.distributed.evaluation import RayEvaluator
cfg = eval_config(Path({data!r}), Path({model!r}), Path({out!r}))
RayEvaluator(cfg, cluster=Cluster({address!r}, replicas=1)).run()
"""


def qa_rows(path: Path, n: int) -> Path:
    rows = [{"id": i, "question": f"What is {i} plus {i}?", "answer": f"{2 * i}"} for i in range(n)]
    rows[3] = {"id": 3, "question": "no answer"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_score_cli_engine_ray_writes_the_local_output_and_resumes_after_kill(
    ray_cluster, tiny_llama, tmp_path
):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    model = str(tiny_llama())
    inp = qa_rows(tmp_path / "in.jsonl", 160)
    common = ["score", "-i", str(inp), "--model", model, "--chunk-size", "4", "--no-progress"]
    run = CliRunner().invoke
    local = run(app, [*common, "-o", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 1, local.output  # one row has no answer
    remote = run(
        app, [*common, "-o", str(tmp_path / "ray.jsonl"), "--engine", "ray", "--replicas", "2"]
    )
    assert remote.exit_code == 1, remote.output
    want = (tmp_path / "local.jsonl").read_bytes()
    assert (tmp_path / "ray.jsonl").read_bytes() == want
    errors = (tmp_path / "local.jsonl.errors.jsonl").read_bytes()
    assert (tmp_path / "ray.jsonl.errors.jsonl").read_bytes() == errors

    # The driver killed with -9 mid-file; --resume (on Ray) finishes it with every row once.
    out = tmp_path / "killed.jsonl"
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-c", "from gnll.cli.main import app; app()", *common, "-o", str(out)]
    proc = subprocess.Popen([*cmd, "--engine", "ray", "--address", address], env={**os.environ})
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 12:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 12 <= out.read_bytes().count(b"\n") < 159
    resumed = run(app, [*common, "-o", str(out), "--engine", "ray", "--resume"])
    assert resumed.exit_code == 1 and "already done" in resumed.output, resumed.output
    assert out.read_bytes() == want
    assert (tmp_path / "killed.jsonl.errors.jsonl").read_bytes() == errors


def test_score_cli_engine_ray_writes_the_span_and_greedy_columns_of_the_local_engine(
    ray_cluster, tiny_llama, tmp_path
):
    """``--spans`` and ``--with-greedy`` reach the replicas: the Ray output is the local one."""
    from typer.testing import CliRunner

    from gnll.cli.main import app

    inp = tmp_path / "in.jsonl"
    rows = [{"id": i, "question": f"What is {i}?", "answer": f"It is {i}. Sure."} for i in range(8)]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["score", "-i", str(inp), "--model", str(tiny_llama()), "--chunk-size", "3"]
    common += ["--no-progress", "--spans", "sentence", "--with-greedy", "--max-new-tokens", "4"]
    run = CliRunner().invoke
    local = run(app, [*common, "-o", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 0, local.output
    remote = run(app, [*common, "-o", str(tmp_path / "ray.jsonl"), "--engine", "ray"])
    assert remote.exit_code == 0, remote.output
    got = [json.loads(x) for x in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert len(got) == 8 and all(len(r["spans"]) == 2 and "g_nll" in r for r in got)
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()


def test_more_replicas_than_the_cluster_holds_fail_at_once_in_one_line(ray_cluster):
    """The session's cluster has 2 CPUs: 4 one-CPU replicas are refused in seconds, not after a
    silent 10-minute wait for the two Ray can never place."""
    from gnll.distributed.cluster import RayUnavailable, start_replicas

    t0 = time.monotonic()
    with pytest.raises(RayUnavailable) as err:
        start_replicas(object, Cluster("auto", replicas=4))
    assert time.monotonic() - t0 < 30
    assert str(err.value).startswith("4 replicas x 1 CPU need 4 CPUs; the cluster has 2")


def test_eval_on_ray_loads_a_separate_judge_on_the_replicas_not_on_the_driver(
    ray_cluster, tiny_llama, tmp_path, monkeypatch
):
    from gnll.distributed.evaluation import RayEvaluator

    data = make_data_dir(tmp_path / "data")
    model, judge = tiny_llama(), tiny_llama(max_position_embeddings=256)  # two checkpoints
    options = dict(judge=str(judge), correctness=["judge", "f1"], measures=["g-nll"], limit=6)
    Evaluator(eval_config(data, model, tmp_path / "local", **options)).run()

    def no_loading(name, **kwargs):
        raise AssertionError(f"the driver loaded {name}")

    monkeypatch.setattr("gnll.backends.load_model", no_loading)
    cfg = eval_config(data, model, tmp_path / "ray", **options)
    RayEvaluator(cfg, cluster=Cluster("auto", replicas=2)).run()
    for name in ("results.json", "samples.jsonl"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    components = json.loads((tmp_path / "ray" / "components.json").read_text())
    assert components["judge"]["name"] == str(judge)


DRIVER = """
import sys
from gnll.cli.main import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit as exc:
    if exc.code:
        raise
print(sorted(m for m in ("gnll.backends.hf", "torch", "transformers") if m in sys.modules))
"""


def test_a_ray_driver_given_model_args_imports_no_model_library(ray_cluster, tiny_llama, tmp_path):
    """``gnll eval --engine ray --model_args ...``: the replicas load the model; the driver types
    ``--model_args``, fingerprints the model and writes the results without importing the hf
    backend, torch or transformers (it used to import all three to type ``--model_args``)."""
    out = tmp_path / "out"
    address = ray_cluster.get_runtime_context().gcs_address
    args = ["eval", "--model", str(tiny_llama()), "--tasks", "triviaqa_short", "--limit", "4"]
    args += ["--data_dir", str(make_data_dir(tmp_path / "data")), "--output_path", str(out)]
    args += ["--beams", "1", "--samples", "2", "--no-plots", "--engine", "ray"]
    args += ["--address", address, "--replicas", "1", "--model_args", "dtype=float32,batch_size=8"]
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout[-500:]
    assert json.loads((out / "results.json").read_text())["versions"]["torch"]
