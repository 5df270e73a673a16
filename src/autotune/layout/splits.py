"""Uneven pipeline splits: how Megatron places decoder layers on virtual pipeline stages when they do not
divide evenly, as `Layout.layer_split` tuples (layers per virtual stage, in layer order).

`megatron_split` builds the tuple from Megatron's flags (--decoder-first/last-pipeline-num-layers,
--account-for-embedding/loss-in-pipeline-split) and refuses what Megatron refuses; `split_flags` finds the
flags that build a tuple (None: only --pipeline-model-parallel-layout can say it); `legal_splits` lists
the splits Megatron accepts for a model whose layers do not divide, for the space and the published rows;
`too_many_stages` says why none exists when there are more virtual stages than layers.
Checked against megatron-core's own layer placement in tests/parity/test_split_parity.py.
"""

from __future__ import annotations

import re

from ..errors import BadInput

__all__ = ["megatron_split", "split_flags", "legal_splits", "too_many_stages", "split_text", "parse_split", "split_config",
           "pipeline_layout_text", "parse_pipeline_layout", "is_pipeline_layout", "layout_vpp", "MAX_STAGES"]

MAX_STAGES = 4096  # virtual stages a split may list (parse_split, parse_pipeline_layout): bounded before lists are built
_LAYOUT_MAX_CHARS = 1 << 16  # an unrolled --pipeline-model-parallel-layout string: 4,096 stages of 16 layers
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")  # an innermost '(...)*N'
_REPEAT = re.compile(r"([EtmL|])\*(\d+)")  # 'x*N'


def megatron_split(num_layers: int, pp: int, vpp: int = 1, first: int = 0, last: int = 0,
                   embedding: bool = False, loss: bool = False) -> tuple[int, ...]:
    """Layers per virtual stage as Megatron builds them from its flags (BadInput when it would refuse):
    --decoder-first/last-pipeline-num-layers put `first` / `last` layers on the first / last pipeline
    stage (split evenly over its VPP chunks) and the rest evenly over the middle stages;
    --account-for-embedding/loss-in-pipeline-split count the embedding / loss as one layer each, so the
    first / last virtual stage holds one decoder layer fewer. () when the even split needs no flag."""
    S = pp * vpp
    if (first or last) and (embedding or loss):
        raise BadInput("--decoder-first/last-pipeline-num-layers and --account-for-*-in-pipeline-split "
                       "cannot be combined; use one or the other")
    if first or last:
        middle = pp - (first > 0) - (last > 0)
        rest = num_layers - first - last
        if pp < 2 or first % vpp or last % vpp or rest < 0 or (middle == 0 and rest) or \
                (middle and (rest == 0 or rest % (middle * vpp))):  # Megatron: no middle stage without layers
            raise BadInput(f"first/last pipeline stage layers {first}/{last}: the other {rest} of {num_layers} "
                           f"layers must split evenly over {max(middle, 0)} middle stage(s) x VPP {vpp}, and "
                           f"first/last must be multiples of VPP {vpp}")
        per = rest // (middle * vpp) if middle else 0
        stage = [first // vpp if first else per] + [per] * (pp - 2) + [last // vpp if last else per]
        return tuple(stage[k % pp] for k in range(S))
    total = num_layers + embedding + loss
    if total % S:
        raise BadInput(f"{num_layers} layers{' + embedding' if embedding else ''}{' + loss' if loss else ''} "
                       f"do not split evenly over PP x VPP = {S} virtual stages")
    if not (embedding or loss):
        return ()
    out = [total // S] * S
    out[0] -= embedding
    out[-1] -= loss
    return tuple(out)


def split_flags(layer_split: tuple[int, ...], num_layers: int, pp: int, vpp: int) -> dict | None:
    """The Megatron flags that build `layer_split`: {"embedding": .., "loss": ..} or {"first": .., "last": ..},
    None when only --pipeline-model-parallel-layout can say it ({} for the even split)."""
    if not layer_split:
        return {}
    for kw in ({"embedding": True, "loss": True}, {"embedding": True}, {"loss": True}):
        try:
            if megatron_split(num_layers, pp, vpp, **kw) == layer_split:
                return kw
        except BadInput:
            pass
    first, last = layer_split[0] * vpp, layer_split[-1] * vpp
    for kw in ({"first": first, "last": last}, {"first": first}, {"last": last}):
        try:
            if megatron_split(num_layers, pp, vpp, **kw) == layer_split:
                return kw
        except BadInput:
            pass
    return None


def legal_splits(num_layers: int, pp: int, vpp: int = 1) -> list[tuple[int, ...]]:
    """Splits Megatron accepts when the layers do not divide evenly: the embedding / loss counted as layers,
    fewer layers on the first / last stage, and the balanced split --pipeline-model-parallel-layout writes
    (the first virtual stages one layer more). Empty when the even split works."""
    S = pp * vpp
    if num_layers % S == 0 or pp < 2:
        return []
    out: list[tuple[int, ...]] = []
    for kw in ({"embedding": True, "loss": True}, {"embedding": True}, {"loss": True}):
        try:
            out.append(megatron_split(num_layers, pp, vpp, **kw))
        except BadInput:
            pass
    per = -(-num_layers // S)  # every virtual stage full, the last stage short
    for kw in ({"last": num_layers - (pp - 1) * per * vpp}, {"first": num_layers - (pp - 1) * per * vpp}):
        try:
            if min(kw.values()) > 0:
                out.append(megatron_split(num_layers, pp, vpp, **kw))
        except BadInput:
            pass
    base, extra = divmod(num_layers, S)
    if base:  # fewer layers than virtual stages: the balanced split leaves stages with nothing to run
        out.append(tuple(base + (k < extra) for k in range(S)))
    return list(dict.fromkeys(out))


def too_many_stages(num_layers: int, pp: int, vpp: int = 1) -> str | None:
    """Why PP x VPP virtual stages cannot hold `num_layers` layers when there are more stages than layers and no
    split Megatron accepts places them (None otherwise): the rule's message then names the bound, not a split."""
    S = pp * vpp
    if S <= num_layers or legal_splits(num_layers, pp, vpp):
        return None
    way = f"use VPP <= {num_layers // pp}" if num_layers >= pp else f"use PP <= {num_layers} (and VPP 1)"
    return (f"PP {pp} x VPP {vpp} = {S} stages for {num_layers} layers: each stage needs at least one layer; "
            f"{way}")


def split_text(layer_split: tuple[int, ...]) -> str:
    """A split as a short string, runs folded: (2, 3, 3, 3, 2) -> '2,3x3,2'; the even split -> 'even'. It is the
    search's parameter value (studies, the Optuna dashboard) and what labels show; parse_split reads it back."""
    if not layer_split:
        return "even"
    out: list[str] = []
    k = 0
    while k < len(layer_split):
        j = k
        while j < len(layer_split) and layer_split[j] == layer_split[k]:
            j += 1
        out.append(f"{layer_split[k]}x{j - k}" if j - k > 2 else ",".join([str(layer_split[k])] * (j - k)))
        k = j
    return ",".join(out)


def parse_split(text: str) -> tuple[int, ...]:
    """split_text's inverse: 'even' -> (), '2,3x3,2' -> (2, 3, 3, 3, 2) (plain '2,3,3,3,2' too)."""
    text = str(text).strip()
    if text in ("even", ""):
        return ()
    out: list[int] = []
    try:
        for part in text.split(","):
            n, x, times = part.strip().partition("x")
            reps = int(times) if x else 1
            if reps < 1 or len(out) + reps > MAX_STAGES:  # bounded before the list is built
                raise ValueError
            out += [int(n)] * reps
    except ValueError:
        raise BadInput(f"layer split {text!r}: give 'even' or layers per virtual stage, e.g. 2,3x30,2 "
                       "(3x30: thirty stages of 3 layers)") from None
    if not out or min(out) < 0 or len(out) > MAX_STAGES:
        raise BadInput(f"layer split {text!r}: give 'even' or between 1 and {MAX_STAGES:,} non-negative stage sizes")
    return tuple(out)


def pipeline_layout_text(layer_split: tuple[int, ...]) -> str:
    """--pipeline-model-parallel-layout's string for a split: 'E' the embedding, 't' a decoder layer, 'L' the loss,
    '|' between virtual stages in order (Megatron's PipelineParallelLayerLayout.from_str reads it)."""
    stages = ["t" * k for k in layer_split]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return "|".join(stages)


def is_pipeline_layout(text: str) -> bool:
    """Whether a split is written in --pipeline-model-parallel-layout's letters ('Et*3|(tt|)*29,m|L'), not as
    layers per stage ('2,3x30,2')."""
    return bool(re.search(r"[EL|]", str(text)))  # every layout string holds E and L; 'auto' and '2,3x30' neither


def _unroll(text: str, what: str) -> str:
    """Megatron's repeats written out: '(tt|)*3' -> 'tt|tt|tt|' (innermost groups first, so groups may nest),
    then 't*3' -> 'ttt'. Every step is sized before it is built (BadInput past _LAYOUT_MAX_CHARS)."""
    def too_long(size: int) -> None:
        if size > _LAYOUT_MAX_CHARS:
            raise BadInput(f"{what}: unrolls to more than {_LAYOUT_MAX_CHARS:,} characters; give fewer stages")

    too_long(len(text))
    while (m := _GROUP.search(text)) is not None:  # each pass removes one group
        n = int(m.group(2)) if len(m.group(2)) < 8 else _LAYOUT_MAX_CHARS + 1
        too_long(len(text) - len(m.group(0)) + len(m.group(1)) * n)
        text = text[:m.start()] + m.group(1) * n + text[m.end():]
    reps = [(len(m.group(0)), int(m.group(2)) if len(m.group(2)) < 8 else _LAYOUT_MAX_CHARS + 1)
            for m in _REPEAT.finditer(text)]
    too_long(len(text) + sum(n - k for k, n in reps))
    return _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), text)


def parse_pipeline_layout(text: str) -> tuple[tuple[int, ...], int]:
    """(decoder layers per virtual stage, MTP layers) of a --pipeline-model-parallel-layout string, read the way
    megatron-core's PipelineParallelLayerLayout reads it: 'E' the embedding, 't' a decoder layer, 'm' an MTP
    layer, 'L' the loss, '|' between virtual stages (stage k is PP rank k % PP, model chunk k // PP), commas
    cosmetic, 'x*N' and '(...)*N' repeats: 'Et*4|(tttt|)*14tmL' is 16 stages, 4 / 4 x 14 / 1 decoder layers.
    The embedding must open the first stage and the loss close the last (the model places them there), MTP
    layers follow every decoder layer; BadInput names what is wrong otherwise."""
    what = f"pipeline layout {str(text)[:80]!r}"
    raw = re.sub(r"[\s,]", "", str(text))
    bad = sorted(set(re.sub(r"[EtmL|()*0-9]", "", raw)))
    if bad or not raw:
        raise BadInput(f"{what}: " + (f"unknown letter(s) {', '.join(map(repr, bad))}; " if bad else "empty; ")
                       + "write 'E' embedding, 't' decoder layer, 'm' MTP layer, 'L' loss, '|' between stages, "
                       "e.g. 'Et*3|(tt|)*29,m|L'")
    flat = _unroll(raw, what)
    if re.search(r"[()*0-9]", flat):
        raise BadInput(f"{what}: a repeat is not 'x*N' or '(...)*N'; e.g. 'Et*3|(tt|)*29,m|L'")
    stages = flat.split("|")
    if len(stages) > MAX_STAGES:
        raise BadInput(f"{what}: {len(stages):,} stages, more than {MAX_STAGES:,}")
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        raise BadInput(f"{what}: the embedding 'E' must appear once, first in the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        raise BadInput(f"{what}: the loss 'L' must appear once, last in the last stage")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise BadInput(f"{what}: MTP layers 'm' come after every decoder layer 't'")
    return tuple(s.count("t") for s in stages), flat.count("m")


def layout_vpp(stages: int, pp: int, vpp: int | None = None) -> int:
    """The VPP a --pipeline-model-parallel-layout string of `stages` virtual stages sets on PP `pp` (Megatron takes
    it from the string: stages / PP); BadInput when they do not divide, or when a VPP above 1 given beside the
    string differs."""
    got, left = divmod(stages, max(pp, 1))
    if left or (vpp and vpp > 1 and vpp != got):
        raise BadInput(f"{stages} stages on PP {pp}" + (f" x VPP {vpp}" if vpp and vpp > 1 else "")
                       + f": a pipeline layout string needs PP x VPP stages (its stage count / PP is the VPP; give "
                       f"{pp * max(vpp or 1, 1)} stages or drop the VPP)")
    return got


def split_config(layer_split: tuple[int, ...], num_layers: int, pp: int, vpp: int) -> dict:
    """megatron-core TransformerConfig fields that build `layer_split` (what Megatron's training arguments set from
    the same flags): the account-for switches, the first / last stage layer counts, else the pipeline layout."""
    if not layer_split:
        return {}
    kw = split_flags(layer_split, num_layers, pp, vpp)
    if kw is None:
        return {"pipeline_model_parallel_layout": pipeline_layout_text(layer_split)}
    names = {"embedding": "account_for_embedding_in_pipeline_split", "loss": "account_for_loss_in_pipeline_split",
             "first": "num_layers_in_first_pipeline_stage", "last": "num_layers_in_last_pipeline_stage"}
    return {names[k]: v for k, v in kw.items()}
