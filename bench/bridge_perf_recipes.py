"""Megatron-Bridge's flat performance recipes (v0.6.0 on: src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py), read
without running them: one settings line per recipe function, in bench/bridge_presets.py's columns.

Each recipe is a function `<model>_<task>_<N>gpu_<gpu>_<precision>[_<variant>]_config()` that builds the model's base
config and then assigns literals to it (`cfg.model.tensor_model_parallel_size = 1`, `cfg.train.global_batch_size =
4096`, `cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)`) and calls helpers of its family's common.py and
of perf_recipes/_common.py that do the same (`_deepseek_v3_common(cfg)`, `_enable_deepseek_full_iteration_mxfp8(cfg,
fp8_output_proj=True)`). This reader walks those functions' syntax trees (Python's ast; nothing is imported or
executed): assignments of literals and of the helpers' own parameters to `cfg.<path>` are recorded in order, helper
calls are followed with their arguments bound, and an `if` is entered only where its test reads bound literals (a
helper's `layout is not None`); the others test the config's runtime state, which a reading does not have
(perf_recipes/_common.py's `_benchmark_common` switches the TE op fuser off when a recipe set it before the call,
which changes no setting autotune reads). The base model recipe's own defaults are the
family rules bench/bridge_presets.py applies to the older releases (DeepSeek-V3 and Kimi-K2 recompute selectively,
their pipeline layouts and DeepSeek-V3's MTP layer from the model recipes).

    python bench/bridge_perf_recipes.py /path/to/Megatron-Bridge [--release v0.6.0]   # prints the lines as CSV
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import subprocess
import sys
from pathlib import Path

ROOT = "src/megatron/bridge/perf_recipes"
# function-name model prefix -> (catalog model, family for bench/bridge_presets.py's rules)
MODELS = {"deepseek_v3": ("DeepSeek-V3", "deepseek"), "gpt_oss_120b": ("gpt-oss-120b", "gpt_oss"),
          "gpt_oss_20b": ("gpt-oss-20b", "gpt_oss"), "qwen3_30b_a3b": ("Qwen3-30B-A3B", "qwen3"),
          "qwen3_235b_a22b": ("Qwen3-235B-A22B", "qwen3"),
          "qwen3_next_80b_a3b": ("Qwen3-Next-80B-A3B-Instruct", "qwen3_next"),
          "llama3_8b": ("Llama-3.1-8B", "llama"), "llama3_70b": ("Llama-3.1-70B", "llama"),
          "llama31_405b": ("Llama-3.1-405B", "llama"), "kimi_k2": ("Kimi-K2-Instruct", "kimi"),
          "nemotron_3_nano": ("NVIDIA-Nemotron-3-Nano-30B-A3B", "nemotron_nano"),
          "nemotron_3_super": ("NVIDIA-Nemotron-3-Super-120B-A12B", "nemotron_super"),
          "nemotron_3_ultra": ("NVIDIA-Nemotron-3-Ultra-550B-A55B", "nemotron_super"),
          # Qwen3.5-VL: the recipes load Qwen/Qwen3.5-*, the catalog's checkpoints (vision tower included)
          "qwen35_vl_35b_a3b": ("Qwen3.5-35B-A3B", "qwen35_vl"), "qwen35_vl_122b_a10b": ("Qwen3.5-122B-A10B", "qwen35_vl"),
          "qwen35_vl_397b_a17b": ("Qwen3.5-397B-A17B", "qwen35_vl"),
          "deepseek_v4_flash": ("DeepSeek-V4-Flash", "deepseek_v4"), "deepseek_v4_pro": ("DeepSeek-V4-Pro", "deepseek_v4"),
          "nemotronh_56b": ("Nemotron-H-56B-Base-8K", "nemotronh"),
          "nemotron_3_5_lightning": ("NVIDIA-Nemotron-3.5-Lightning-30B-A3B", "nemotron_lightning"),
          # Qwen3-VL: the recipes load Qwen/Qwen3-VL-*-Instruct; the catalog's entries are their language models
          "qwen3_vl_30b_a3b": ("Qwen3-VL-30B-A3B-Instruct", "qwen3_vl"), "qwen3_vl_235b_a22b": ("Qwen3-VL-235B-A22B-Instruct", "qwen3_vl")}
PRECISIONS = {"bf16": "bf16", "fp8cs": "fp8-tensorwise", "fp8mx": "mxfp8", "fp8sc": "fp8-blockwise", "nvfp4": "nvfp4"}
NAME = re.compile(r"^(?P<m>[a-z0-9_]+?)_(?P<task>pretrain|sft|lora)_(?P<n>\d+)gpu_(?P<gpu>gb300|gb200|b300|b200|h100)_"
                  r"(?P<p>bf16|fp8cs|fp8mx|fp8sc|nvfp4)(?:_(?P<v>\w+?))?_config$")
_UNKNOWN = object()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


class _Modules:
    """Every module of the release's recipes and perf recipes, parsed: its functions and what it imports as what, so a
    call resolves to the function it names across `from ... import f as g` (the model recipes' legacy aliases)."""

    def __init__(self, files: dict[str, str]):
        self.defs: dict[str, dict[str, ast.FunctionDef]] = {}
        self.imports: dict[str, dict[str, tuple[str, str]]] = {}
        for path, text in files.items():
            mod = path[len("src/"):-len(".py")].replace("/", ".").removesuffix(".__init__")
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            self.defs[mod] = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
            self.imports[mod] = {(a.asname or a.name): (n.module, a.name) for n in tree.body
                                 if isinstance(n, ast.ImportFrom) and n.module for a in n.names}

    def lookup(self, mod: str, name: str, depth: int = 0) -> tuple[str, ast.FunctionDef] | None:
        if depth > 10 or mod not in self.defs:
            return None
        if name in self.defs[mod]:
            return mod, self.defs[mod][name]
        if name in self.imports[mod]:
            src, orig = self.imports[mod][name]
            return self.lookup(src, orig, depth + 1)
        return None


def _path(node, env: dict) -> str | None:
    """'model.tensor_model_parallel_size' for cfg.model.tensor_model_parallel_size (cfg or an alias of a cfg part)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not isinstance(env.get(node.id), _Cfg):
        return None
    return ".".join([p for p in (env[node.id].prefix,) if p] + parts[::-1])


class _Cfg:
    def __init__(self, prefix: str = ""):
        self.prefix = prefix


def _value(node, env: dict, state: dict | None = None):
    if isinstance(node, ast.Name) and node.id in env and not isinstance(env[node.id], _Cfg):
        return env[node.id]
    if state is not None and _path(node, env) is not None:  # cfg.model.moe_flex_dispatcher_backend: what it holds
        return state.get(_path(node, env), _UNKNOWN)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _flex(state: dict, prefix: str, backend) -> None:
    """megatron.bridge.training.flex_dispatcher_backend.apply_flex_dispatcher_backend on a GPU that runs the backend
    (every GPU the rows name: DeepEP on Hopper, B200 and B300, HybridEP on those and GB200 / GB300)."""
    if backend in ("deepep", "hybridep"):
        state[f"{prefix}.moe_token_dispatcher_type"] = "flex"
        state[f"{prefix}.moe_flex_dispatcher_backend"] = backend
        state[f"{prefix}.moe_shared_expert_overlap"] = False


# megatron/bridge/utils/cuda_graph.py's helpers (they write cuda_graph_modules or cuda_graph_scope, whichever the
# installed megatron-core has): name -> (the impl they set, the scope they set; None: their second argument)
_GRAPH_HELPERS = {"set_cuda_graph_modules": (None, None), "clear_cuda_graph_modules": (None, []),
                  "set_full_iteration_cuda_graph": ("full_iteration", [])}


def _bind(helper: ast.FunctionDef, call: ast.Call, env: dict, state: dict, mods: "_Modules", mod: str) -> dict:
    args = helper.args
    bound: dict = {}
    positional = [a.arg for a in args.args]
    for name, d in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        bound[name] = _value(d, {})
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        if d is not None:
            bound[a.arg] = _value(d, {})
    pairs = list(zip(positional, call.args)) + [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
    for name, arg in pairs:
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and mods.lookup(mod, arg.func.id):
            # _with_global_batch_size(qwen3_..._8gpu_..._config(), 2048): the inner recipe builds the config first
            inner = mods.lookup(mod, arg.func.id)
            _run(inner[0], inner[1], _bind(inner[1], arg, env, state, mods, mod), state, mods)
            bound[name] = _Cfg("")
            continue
        p = _path(arg, env)  # cfg, cfg.model, ...: a part of the config; else a value
        bound[name] = _Cfg(p) if p is not None else _value(arg, env, state)
    return bound


def _test(node, env: dict, state: dict):
    """The value of an `if` test over bound literals (`layout is not None`, `not x`, `a == "b"`), else _UNKNOWN."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _test(node.operand, env, state)
        return _UNKNOWN if v is _UNKNOWN else not v
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = _value(node.left, env, state), _value(node.comparators[0], env, state)
        if a is _UNKNOWN or b is _UNKNOWN:
            return _UNKNOWN
        op = node.ops[0]
        table = {ast.Is: lambda: a is b, ast.IsNot: lambda: a is not b, ast.Eq: lambda: a == b,
                 ast.NotEq: lambda: a != b}
        return table[type(op)]() if type(op) in table else _UNKNOWN
    v = _value(node, env, state)
    return _UNKNOWN if v is _UNKNOWN else bool(v)


def _run(mod: str, fn, env: dict, state: dict, mods: _Modules, depth: int = 0) -> bool:
    """Walk a function's (or a branch's) statements; True when a `return` ended it."""
    if depth > 12:
        return True
    for st in (fn.body if isinstance(fn, ast.FunctionDef) else fn):
        if isinstance(st, ast.Return):  # `return _pretrain_64gpu_config()`: an alias builds its config in the callee
            val = st.value
            if isinstance(val, ast.Call) and isinstance(val.func, ast.Name) and mods.lookup(mod, val.func.id):
                found = mods.lookup(mod, val.func.id)
                _run(found[0], found[1], _bind(found[1], val, env, state, mods, mod), state, mods, depth + 1)
            return True
        if isinstance(st, ast.If):  # entered only when its test reads bound literals
            v = _test(st.test, env, state)
            if v is not _UNKNOWN and _run(mod, st.body if v else st.orelse, env, state, mods, depth):
                return True
            continue
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            tgt, val = st.targets[0], st.value
            if isinstance(tgt, ast.Name):  # cfg = base_recipe() / model_cfg = cfg.model
                if isinstance(val, ast.Call) and isinstance(val.func, ast.Name):
                    found = mods.lookup(mod, val.func.id)
                    if found:
                        _run(found[0], found[1], _bind(found[1], val, env, state, mods, mod), state, mods, depth + 1)
                    env[tgt.id] = _Cfg("")
                elif _path(val, env) is not None:
                    env[tgt.id] = _Cfg(_path(val, env))
                elif _value(val, env) is not _UNKNOWN:  # a local literal (num_gpus = 256) a later line assigns
                    env[tgt.id] = _value(val, env)
                continue
            path = _path(tgt, env)
            if path is None:
                continue
            if isinstance(val, ast.Call) and isinstance(val.func, ast.Name) and val.func.id.endswith("Config"):
                for kw in val.keywords:  # CommOverlapConfig(tp_comm_overlap=False): its fields under the path
                    if kw.arg:
                        state[f"{path}.{kw.arg}"] = _value(kw.value, env, state)
                continue
            if isinstance(val, ast.Dict):  # env_vars: the literal keys and values
                state[path] = {_value(k, env): _value(v, env) for k, v in zip(val.keys, val.values) if k is not None}
                continue
            state[path] = _value(val, env, state)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Name):
            call = st.value
            if call.func.id in _GRAPH_HELPERS and call.args:  # megatron/bridge/utils/cuda_graph.py
                prefix = _path(call.args[0], env) or "model"
                mods_ = _value(call.args[1], env, state) if len(call.args) > 1 else []
                impl, scope = _GRAPH_HELPERS[call.func.id]
                if impl:
                    state[f"{prefix}.cuda_graph_impl"] = impl
                state[f"{prefix}.cuda_graph_scope"] = mods_ if scope is None else scope
                continue
            if call.func.id == "apply_flex_dispatcher_backend" and call.args:
                backend = _value(call.args[1], env, state) if len(call.args) > 1 else _UNKNOWN
                _flex(state, _path(call.args[0], env) or "model", backend)
                continue
            found = mods.lookup(mod, call.func.id)
            if found:
                _run(found[0], found[1], _bind(found[1], call, env, state, mods, mod), state, mods, depth + 1)
    return False


def read_recipes(files: dict[str, str]) -> list[tuple[str, str, dict]]:
    """(file, function, settings {path: value}) of every perf recipe function in `files` {path: text}."""
    mods = _Modules(files)
    out = []
    for path in sorted(files):
        if not path.startswith(ROOT + "/") or path.endswith(("common.py", "__init__.py", "environment.py")):
            continue
        mod = path[len("src/"):-len(".py")].replace("/", ".")
        for name, fn in mods.defs.get(mod, {}).items():
            if not NAME.match(name):
                continue
            state: dict = {}
            _run(mod, fn, {}, state, mods)
            out.append((path, name, state))
    return out


def _recompute(family: str, s: dict) -> str:
    gran = s.get("model.recompute_granularity")
    if gran == "full":
        method = s.get("model.recompute_method") or "uniform"
        return f"full:{method}:{s.get('model.recompute_num_layers') or 1}"
    listed = s.get("model.recompute_modules")
    mods = [m for m in (listed if isinstance(listed, list) else []) if isinstance(m, str) and m]
    if isinstance(listed, list) and not mods:  # modules [] turns recompute off (Megatron-Bridge's overrides.py)
        return "none"
    if mods and (gran not in (None, "none") or family in ("deepseek", "kimi")):
        return "selective:" + ",".join(mods)
    if gran == "selective" or family in ("deepseek", "kimi"):
        return "selective"  # Megatron's default module, core_attn
    return "none"


def graphs_name(impl, scope) -> str:
    """autotune's CUDA-graph setting of a recipe's cuda_graph_impl and cuda_graph_scope (or modules): full-iteration
    graphs (impl full_iteration, or local over the whole iteration, or no impl set beside a full_iteration scope,
    which megatron-core promotes: perf_recipes/_common.py), else TE's attention or router scopes. An impl set to
    "none" is none (v0.6.0's _benchmark_common clears such a scope; the older releases' recipes read so)."""
    scope = [scope] if isinstance(scope, str) else list(scope) if isinstance(scope, (list, tuple)) else []
    if impl == "full_iteration" or (impl == "local" and (not scope or "full_iteration" in scope)):
        return "full"
    if impl is None:
        return "full" if "full_iteration" in scope else "none"
    if impl == "none" or not isinstance(impl, str):
        return "none"
    return "attn" if "attn" in scope else ("router" if "moe_router" in scope else "none")


def dispatcher_name(kind, backend) -> str:
    """autotune's dispatcher of megatron's --moe-token-dispatcher-type and --moe-flex-dispatcher-backend: the flex
    dispatcher on DeepEP (its default backend) is 'flex', on HybridEP 'hybridep'."""
    if kind == "flex":
        return "hybridep" if backend == "hybridep" else "flex"
    return kind if kind in ("alltoall", "allgather") else "alltoall"


def row_of(rel: str, path: str, name: str, s: dict, family_layouts: dict, family_mtp: dict) -> dict | None:
    m = NAME.match(name)
    if not m or m.group("m") not in MODELS:
        return None
    model, family = MODELS[m.group("m")]
    task = m.group("task")
    if task == "lora":  # not modelled: no row can use the preset
        return None
    prec = PRECISIONS[m.group("p")]
    g = lambda k, d=None: s.get(k, d) if s.get(k, d) is not _UNKNOWN else d  # noqa: E731
    tp, pp = int(g("model.tensor_model_parallel_size", 1) or 1), int(g("model.pipeline_model_parallel_size", 1) or 1)
    vp = int(g("model.virtual_pipeline_model_parallel_size") or 1)
    dispatcher = dispatcher_name(g("model.moe_token_dispatcher_type", "alltoall"), g("model.moe_flex_dispatcher_backend"))
    ep_overlap = bool(g("comm_overlap.overlap_moe_expert_parallel_comm", False))
    tp_default = tp > 1 and (family in ("qwen3", "qwen3_next") or prec != "nvfp4") and family not in (
        "deepseek", "nemotron_super", "kimi")
    tp_overlap = g("comm_overlap.tp_comm_overlap", tp_default) and tp > 1
    shared = g("model.moe_shared_expert_overlap")
    if shared is None:
        shared = family in ("deepseek", "kimi") and dispatcher == "alltoall" and not ep_overlap
    cap = g("model.moe_expert_capacity_factor") if g("model.moe_pad_expert_input_to_capacity") else 0
    env = g("env_vars") or {}
    kernels = [k for k, on in (("paged_stash", g("model.moe_paged_stash")),
                               ("cutedsl_fused_grouped_mlp", isinstance(env, dict)
                                and str(env.get("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "")) == "1"),
                               ("fp8_dot_product_attention", g("mixed_precision.fp8_dot_product_attention")),
                               ("fp8_output_proj", g("model.fp8_output_proj")),
                               ("fine_grained_activation_offloading", g("model.fine_grained_activation_offloading")))
               if on]
    layout = g("model.pipeline_model_parallel_layout")
    if not isinstance(layout, str):
        layout = family_layouts.get(family, {}).get((pp, vp), "")
    offload = int(g("model.cpu_offloading_num_layers") or 0) if g("model.cpu_offloading") else 0
    return {"release": rel, "model": model, "gpu": m.group("gpu").upper(), "precision": prec, "task": task,
            "tp": tp, "pp": pp, "cp": int(g("model.context_parallel_size", 1) or 1), "vp": vp,
            "ep": int(g("model.expert_model_parallel_size", 1) or 1), "mbs": int(g("train.micro_batch_size", 1) or 1),
            "gbs": int(g("train.global_batch_size", 1) or 1), "fsdp": int(bool(g("ddp.use_megatron_fsdp"))),
            "recompute": _recompute(family, s), "act_offload_layers": offload, "cuda_graphs": graphs_name(s.get("model.cuda_graph_impl"), s.get("model.cuda_graph_scope")),
            "dispatcher": dispatcher, "ep_overlap": int(ep_overlap), "tp_comm_overlap": int(bool(tp_overlap)),
            "capacity_factor": cap or 0, "shared_overlap": int(bool(shared)), "pp_layout": layout,
            "mtp": family_mtp.get(family, 0), "kernels": " ".join(kernels), "recipe": name, "file": path,
            # fine-grained activation offloading's modules (TransformerConfig.offload_modules), when it is on
            "offload_modules": " ".join(g("model.offload_modules") or []) if g("model.fine_grained_activation_offloading")
            else "",
            # the recipe's row length (not a presets column: bench/bridge_recipes_fit.py reads it)
            "seq": int(g("model.seq_length") or g("dataset.seq_length") or 0)}


def read_release(repo: Path, rel: str, family_layouts: dict, family_mtp: dict) -> list[dict]:
    names = [f for f in git(repo, "ls-tree", "-r", "--name-only", rel, ROOT, "src/megatron/bridge/recipes").split()
             if f.endswith(".py")]
    files = {f: git(repo, "show", f"{rel}:{f}") for f in names}
    rows = [row_of(rel, p, n, s, family_layouts, family_mtp) for p, n, s in read_recipes(files)]
    return [r for r in rows if r]


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bridge_presets as B  # noqa: E402

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--release", default="v0.6.0")
    args = ap.parse_args()
    rows = read_release(args.repo, args.release, B._FAMILY_LAYOUTS, B._FAMILY_MTP)
    w = csv.DictWriter(sys.stdout, fieldnames=B.COLUMNS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    print(f"{len(rows)} recipes of {args.release}", file=sys.stderr)


if __name__ == "__main__":
    main()
