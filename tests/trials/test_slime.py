"""SlimeBackend: MODEL_ARGS, the Ray Job entrypoint against the seed run blocks, log parsing on real
Megatron-LM/slime line formats, and real Ray Jobs on a local Ray with its dashboard (slime itself needs
GPUs, so a small script that prints Megatron's lines stands in for train_async.py)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from autotune.catalog import Workload, load_model
from autotune.layout import layout_from_args
from autotune.trials.backends.slime import launch_script, parse_training_log, slime_model_args, window_metrics
from autotune.trials.spec import TrialResult, TrialSpec, read_model
from trial_helpers import wait_result


ROOT = Path(__file__).resolve().parents[2]
SEEDS = sorted((ROOT / "recipes" / "qwen3.5-122b-a10b" / "h200").glob("*.yaml"))

# REFERENCE.md: slime's Qwen3.5 MoE arguments with the 122B sizes (the seed's MODEL_ARGS).
REFERENCE_122B = """--spec slime_plugins.models.qwen3_5 get_qwen3_5_spec --disable-bias-linear --qk-layernorm
--group-query-attention --num-attention-heads 32 --num-query-groups 2 --kv-channels 256 --num-layers 48
--hidden-size 3072 --ffn-hidden-size 1024 --use-gated-attention --normalization RMSNorm
--apply-layernorm-1p --position-embedding-type rope --norm-epsilon 1e-6 --rotary-percent 0.25 --swiglu
--untie-embeddings-and-output-weights --vocab-size 248320 --rotary-base 10000000 --moe-ffn-hidden-size 1024
--moe-shared-expert-intermediate-size 1024 --moe-router-score-function softmax
--moe-token-dispatcher-type alltoall --moe-router-topk 8 --moe-layer-freq [1]*48 --num-experts 256
--moe-grouped-gemm --moe-token-drop-policy probs --moe-router-dtype fp32 --moe-permute-fusion
--moe-aux-loss-coeff 0 --attention-output-gate --moe-shared-expert-gate""".split()


def test_model_args_qwen35_122b_are_the_reference_list_plus_gdn():
    args = slime_model_args(load_model("Qwen3.5-122B-A10B"))
    assert args[: len(REFERENCE_122B)] == REFERENCE_122B
    assert args[len(REFERENCE_122B):] == [
        "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "4",
        "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "128", "--linear-value-head-dim", "128",
        "--linear-num-key-heads", "16", "--linear-num-value-heads", "64",
    ]


def test_model_args_generalise_from_the_spec():
    tiny = slime_model_args(load_model("tiny-moe"))
    assert "--spec" not in tiny and "--experimental-attention-variant" not in tiny  # plain GPT spec, no GDN
    assert tiny[tiny.index("--num-experts") + 1] == "8" and tiny[tiny.index("--moe-router-topk") + 1] == "2"
    assert tiny[tiny.index("--rotary-base") + 1] == "1000000"  # read from the config.json
    llama = slime_model_args(load_model("Llama-3.1-70B"))
    assert not any(a.startswith("--moe") for a in llama) and "--num-experts" not in llama
    assert llama[llama.index("--norm-epsilon") + 1] == "1e-5"
    ds = slime_model_args(load_model("DeepSeek-V3"))
    assert ds[ds.index("--moe-layer-freq") + 1] == "[0]*3+[1]*58"  # three dense layers first
    assert ds[ds.index("--moe-router-score-function") + 1] == "sigmoid"


def _seed_spec(recipe: dict, steps: int | None = None) -> TrialSpec:
    """The seed recipe's trial: its layout from the run block, 32 H200, its steps and window."""
    steps = steps or recipe["result"]["steps_per_run"]
    window = (2, steps - 1) if steps < recipe["result"]["steps_per_run"] else tuple(recipe["result"]["window"])
    layout = layout_from_args(recipe["run"])
    w = Workload(steps=steps, window=window)
    return TrialSpec(study="seed", number=0, model="Qwen3.5-122B-A10B", gpu="H200", count=32, gpus_per_node=8, layout=layout.to_dict(),
                     workload=dataclasses.asdict(w), steps=w.steps, warmup_steps=w.window[0])


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_entrypoint_runs_the_seed_command_argument_by_argument(path, tmp_path):
    """bash runs the script with `printf` as the interpreter: what it prints is exactly the argv slime
    would get, which must be the seed's command with MODEL_ARGS and the data paths filled in."""
    recipe = yaml.safe_load(path.read_text())
    model_args = slime_model_args(load_model("Qwen3.5-122B-A10B"))
    script = launch_script(_seed_spec(recipe), python="printf '%s\\n'", slime_dir=str(tmp_path))
    env = {"PATH": "/usr/bin:/bin", "HF_CKPT": "/ckpt/hf", "TORCH_DIST": "/ckpt/dist", "SFT_DATA": "/data/rows.parquet"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout.splitlines()

    seed_cmd = recipe["run"].split("python3 -m <slime entry module>", 1)[1]
    expected = []
    for tok in shlex.split(seed_cmd.replace("\\\n", " "), comments=True):
        if tok == "${MODEL_ARGS[@]}":
            expected += model_args
        else:
            expected.append(env.get(tok[1:], tok) if tok.startswith("$") else tok)
    assert out[0] == "train_async.py"
    assert out[1:] == expected
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script  # the seed's environment comes along


# --- log parsing --------------------------------------------------------------------------------
# Verbatim from a published Megatron-LM run log (2025-08-01; two ranks' memory reports interleaved on
# one line, as they are when several ranks print at once).
MEGATRON_LOG = textwrap.dedent("""\
    [Rank 2] (after 1 iterations) memory (MB) | allocated: 9334.3779296875 | max allocated: 12680.6357421875 | reserved: 13236.0 | max reserved: 13236.0[Rank 6] (after 1 iterations) memory (MB) | allocated: 10850.67578125 | max allocated: 10850.70751953125 | reserved: 11000.0 | max reserved: 11000.0
    [Rank 0] (after 1 iterations) memory (MB) | allocated: 10770.3779296875 | max allocated: 15754.88818359375 | reserved: 16334.0 | max reserved: 16334.0
     [2025-08-01 07:19:37] iteration        1/    5000 | consumed samples:          128 | elapsed time per iteration (ms): 19138.8 | throughput per GPU (TFLOP/s/GPU): 80.2 | learning rate: 6.976744E-08 | global batch size:   128 | lm loss: 1.043863E+01 | loss scale: 1.0 | grad norm: 26.203 | number of skipped iterations:   0 | number of nan iterations:   0 |
     [2025-08-01 07:19:50] iteration        2/    5000 | consumed samples:          256 | elapsed time per iteration (ms): 12936.1 | throughput per GPU (TFLOP/s/GPU): 118.7 | learning rate: 1.395349E-07 | global batch size:   128 | lm loss: 1.044022E+01 | loss scale: 1.0 | grad norm: 26.305 | number of skipped iterations:   0 | number of nan iterations:   0 |
""")


def test_parse_real_megatron_lines():
    steps, peak = parse_training_log(MEGATRON_LOG, seq_len=4096, global_batch=999)
    assert [s.step for s in steps] == [0, 1]  # iterations count from 1, steps from 0
    assert steps[1].time_s == pytest.approx(12.9361)
    assert steps[1].tokens == 128 * 4096  # the line's global batch size, not the default
    assert steps[0].lm_loss == pytest.approx(10.43863) and steps[1].grad_norm == pytest.approx(26.305)
    mb = 1024 * 1024
    assert peak == {0: int(15754.88818359375 * mb), 2: int(12680.6357421875 * mb), 6: int(10850.70751953125 * mb)}
    assert steps[0].peak_memory_bytes == [peak[0], peak[2], peak[6]]


def _megatron_line(it: int, n: int, ms: float, gbs: int, loss: float, legacy: bool = False) -> str:
    """Formatted with training_log's own format strings (current, and the older one without a timestamp)."""
    s = "" if legacy else " [2026-10-13 10:00:00.000000]"
    s += " iteration {:8d}/{:8d} |".format(it, n)
    s += " consumed samples: {:12d} |".format(it * gbs)
    s += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    s += (" learning rate: {:.3E} |" if legacy else " learning rate: {:.6E} |").format(1e-5)
    s += " global batch size: {:5d} |".format(gbs)
    s += " lm loss: {:.6E} |".format(loss)
    s += " loss scale: {:.1f} |".format(1.0)
    s += " grad norm: {:.3f} |".format(0.5)
    return s + " number of skipped iterations: {:3d} | number of nan iterations: {:3d} |".format(0, 0)


def test_window_metrics_from_formatted_lines():
    times = [5000.0, 3000.0, 2000.0, 2100.0, 1900.0, 2000.0]
    log = "\n".join(_megatron_line(i + 1, 6, t, 128, 2.0 - i / 10, legacy=i % 2 == 1) for i, t in enumerate(times))
    steps, _ = parse_training_log(log, seq_len=8192, global_batch=128)
    m = window_metrics(steps, (2, 5), gpus=32)
    window_s = sum(times[2:]) / 1000
    assert m["tokens_per_s_per_gpu"] == pytest.approx(4 * 128 * 8192 / window_s / 32)
    assert m["step_time_s"] == pytest.approx(window_s / 4)
    w = [t / 1000 for t in times[2:]]
    mean = sum(w) / 4
    assert m["step_time_cv_percent"] == pytest.approx((sum((x - mean) ** 2 for x in w) / 3) ** 0.5 / mean * 100)
    assert window_metrics(steps[:-1], (2, 5), gpus=32) is None  # a missing step is no measurement


def test_parse_slime_step_and_perf_lines():
    """slime's own loop: `step N: {...}` per train step and `perf N: {...}` per rollout (Ray's actor
    prefix and slime's logger prefix in front; nan as Python prints it)."""
    lines = []
    for i in range(3):
        lines.append(f"(MegatronTrainRayActor pid=2301) [2026-10-13 10:00:0{i}] model.py:918 - step {i}: "
                     f"{{'train/loss': {1.5 - i / 10}, 'train/grad_norm': {0.25 * (i + 1)}, "
                     f"'train/lr-pg_0': 1e-05, 'train/global_batch_size': 128, 'train/step': {i}}}")
        lines.append(f"[2026-10-13 10:00:0{i}] train_metric_utils.py:401 - perf {i}: {{'perf/train_wait_time': 0.5, "
                     f"'perf/actor_train_time': 10.0, 'perf/train_time': 11.0, 'perf/step_time': {11.5 + i}, "
                     f"'perf/wait_time_ratio': 0.04}}")
    lines.append("(MegatronTrainRayActor pid=2301) [2026-10-13 10:00:03] memory_utils.py:49 - [Rank 0] Memory-Usage "
                 "after update_weights: {'gpu': '0', 'total_GB': 139.8, 'free_GB': 20.1, 'used_GB': 119.7, "
                 "'allocated_GB': 90.5, 'reserved_GB': 110.25, 'host_total_GB': 2015.5}")
    lines.append("step 3: {'train/loss': nan, 'train/grad_norm': nan, 'train/global_batch_size': 128}")
    steps, peak = parse_training_log("\n".join(lines), seq_len=8192, global_batch=128)
    assert [s.step for s in steps] == [0, 1, 2]  # step 3 has no perf line: no time, not a step
    assert [s.time_s for s in steps] == [11.5, 12.5, 13.5]
    assert steps[2].lm_loss == pytest.approx(1.3) and steps[1].grad_norm == pytest.approx(0.5)
    assert peak == {0: int(110.25 * 1024**3)}


# --- real Ray Jobs ------------------------------------------------------------------------------
FAKE_SLIME = textwrap.dedent('''\
    """Stands in for slime's train_async.py: prints Megatron's per-iteration and memory lines."""
    import json, os, sys, time
    argv = sys.argv[1:]
    arg = lambda flag: argv[argv.index(flag) + 1]
    if os.environ.get("FAKE_ARGV_OUT"):
        json.dump(argv, open(os.environ["FAKE_ARGV_OUT"], "w"))
    n, gbs, mode = int(arg("--num-rollout")), int(arg("--global-batch-size")), os.environ.get("FAKE_MODE", "ok")
    for it in range(1, n + 1):
        time.sleep(0.05)
        if mode == "hang":
            time.sleep(600)
        if mode == "oom" and it == 3:
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
                  "capacity of 139.81 GiB of which 1.20 GiB is free.", file=sys.stderr, flush=True)
            sys.exit(1)
        if it == 1:
            for r in (0, 8):
                print("[Rank {}] (after 1 iterations) memory (MB) | allocated: {:.2f} | max allocated: {:.2f} | "
                      "reserved: {:.2f} | max reserved: {:.2f}".format(r, 1000.0, 2000.0 + r, 2500.0, 2600.0))
        s = " iteration {:8d}/{:8d} |".format(it, n) + " consumed samples: {:12d} |".format(it * gbs)
        s += " elapsed time per iteration (ms): {:.1f} |".format(1000.0 + 100 * (it % 2))
        s += " global batch size: {:5d} | lm loss: {:.6E} | loss scale: 1.0 | grad norm: {:.3f} |".format(gbs, 3.0 / it, 1.0)
        print("(MegatronTrainRayActor pid=4242)" + s, flush=True)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard():
    """One local Ray with its dashboard (the Job API) for this module. Its dashboard and job-agent
    ports are free ones: the defaults (8265, 52365) may belong to another Ray on this machine."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": _free_port(), "dashboard_agent_listen_port": _free_port()})
    ctx = ray.init(address=cluster.address, logging_level="ERROR")
    yield "http://" + ctx.dashboard_url
    ray.shutdown()
    cluster.shutdown()


def _backend(url: str, tmp_path: Path, **env):
    from autotune.trials.backends import get_backend

    fake = tmp_path / "fake_train_async.py"
    fake.write_text(FAKE_SLIME)
    return get_backend("slime", address=url, entry=str(fake), python=sys.executable, slime_dir=str(tmp_path),
                       env={"HF_CKPT": "/ckpt", **env})


@pytest.mark.slow
def test_ray_job_collects_megatron_lines_into_a_result(dashboard, tmp_path, tmp_trial):
    spec = _seed_spec(yaml.safe_load(SEEDS[0].read_text()), steps=6)  # window 2..5
    backend = _backend(dashboard, tmp_path, FAKE_ARGV_OUT=str(tmp_path / "argv.json"))
    handle = backend.submit(spec, tmp_trial)
    res = wait_result(backend, handle, 60.0)
    assert res.status == "ok", res.reason
    assert res.backend == "slime" and [s.step for s in res.steps] == list(range(6))
    times = [1.0 + 0.1 * ((i + 1) % 2) for i in range(2, 6)]  # iterations 3..6
    assert res.tokens_per_s_per_gpu == pytest.approx(4 * 128 * 8192 / sum(times) / 32)
    assert res.peak_memory_bytes == int(2008.0 * 1024 * 1024)
    assert read_model(TrialResult, tmp_trial / "trial_result.json") == res
    assert "iteration        6/       6" in (tmp_trial / "logs" / "job.log").read_text()
    argv = json.loads((tmp_path / "argv.json").read_text())  # what slime would have been given
    assert argv[argv.index("--num-experts") + 1] == "256" and argv[argv.index("--num-rollout") + 1] == "6"
    assert argv[argv.index("--hf-checkpoint") + 1] == "/ckpt"
    assert read_model(type(spec), tmp_trial / "trial_spec.json").command[:2] == ["bash", "-c"]


@pytest.mark.slow
def test_ray_job_past_its_timeout_is_stopped(dashboard, tmp_path, tmp_trial):
    from ray.job_submission import JobStatus

    spec = _seed_spec(yaml.safe_load(SEEDS[0].read_text()), steps=6).model_copy(update={"timeout_s": 4.0})
    backend = _backend(dashboard, tmp_path, FAKE_MODE="hang")
    handle = backend.submit(spec, tmp_trial)
    res = wait_result(backend, handle, 60.0)
    assert res.status == "timeout"
    deadline = time.monotonic() + 30
    while backend.client.get_job_status(handle.token.job_id) != JobStatus.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.3)


@pytest.mark.slow
def test_ray_job_that_runs_out_of_memory_is_an_oom_result(dashboard, tmp_path, tmp_trial):
    spec = _seed_spec(yaml.safe_load(SEEDS[0].read_text()), steps=6)
    backend = _backend(dashboard, tmp_path, FAKE_MODE="oom")
    res = wait_result(backend, backend.submit(spec, tmp_trial))
    assert res.status == "oom" and res.attempts == 1, res.reason  # a result: not retried
    assert "CUDA out of memory" in res.reason
    assert [s.step for s in res.steps] == [0, 1]  # what ran before it failed is kept
