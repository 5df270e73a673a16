"""The recipe schema: the seeds validate, bad recipes are rejected with field paths, the schema file is current."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from autotune.recipes import RecipeInvalid, parse_recipe, schema_dict, schema_yaml
from autotune.recipes.schema import SCHEMA_PATH_IN_REPO, Recipe

from recipe_seeds import REPO, SEED_DIR, SEED_PAGE


def test_seed_recipe_validates(seed_path):
    recipe = parse_recipe(seed_path.read_text(), str(seed_path))
    assert recipe.model == "Qwen3.5-122B-A10B" and recipe.gpu.type == "H200" and recipe.status == "verified"


def test_seed_files_are_the_seed_page_recipes():
    """Each file is copied from the seed page unchanged, header comments included."""
    if not SEED_PAGE.exists():
        pytest.skip("seed page not present in this checkout")
    page = SEED_PAGE.read_text()
    for path in sorted(SEED_DIR.glob("*.yaml")):
        text = path.read_text()
        assert text.startswith(f"# recipes/qwen3.5-122b-a10b/h200/{path.name}\n")
        assert text in page + "\n", path.name


def test_optional_field_appears_only_where_given():
    second = parse_recipe((SEED_DIR / "attune-tp1-pp4-ep8.yaml").read_text())
    first = parse_recipe((SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml").read_text())
    assert second.correctness.convergence.worst_step_tolerance_ratio == pytest.approx(0.026)
    assert first.correctness.convergence.worst_step_tolerance_ratio is None
    assert first.result.mfu_note is None and first.layout.layer_split is None and first.layout.offload is None


def _mutated(mutate) -> str:
    data = yaml.safe_load((SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml").read_text())
    mutate(data)
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize(
    "mutate,path",
    [
        (lambda d: d["layout"].update(tp="one"), "layout.tp"),
        (lambda d: d["layout"].update(tp=True), "layout.tp"),
        (lambda d: d["stack"].update(cuda=12.9), "stack.cuda"),
        (lambda d: d["result"].pop("mfu"), "result.mfu"),
        (lambda d: d.pop("run"), "run"),
        (lambda d: d["layout"].update(tpp=1), "layout.tpp"),
        (lambda d: d.update(notes="x"), "notes"),
        (lambda d: d["result"].update(tokens_per_s_per_gpu=-5.0), "result.tokens_per_s_per_gpu"),
        (lambda d: d.update(status="guessed"), "status"),
        (lambda d: d["layout"].update(dispatcher="ring"), "layout.dispatcher"),
        (lambda d: d["workload"]["dataset"].update(rows_sha256="abc"), "workload.dataset.rows_sha256"),
        (lambda d: d["correctness"]["convergence"].update(correlation=1.5), "correctness.convergence.correlation"),
        (lambda d: d["layout"]["recompute"].update(method=None), "layout.recompute"),
        (lambda d: d["correctness"]["component_tests"].append({"test": "x"}), "correctness.component_tests[0].shape"),
    ],
)
def test_bad_recipe_is_rejected_with_field_path(mutate, path):
    with pytest.raises(RecipeInvalid) as info:
        parse_recipe(_mutated(mutate), "bad.yaml")
    paths = [p.split(":")[0] for p in info.value.problems]
    assert path in paths, info.value.problems


def test_every_error_is_reported_at_once():
    def two(d):
        d["result"]["tokens_per_s_per_gpu"] = -1.0
        d["layout"]["tpp"] = 1

    with pytest.raises(RecipeInvalid) as info:
        parse_recipe(_mutated(two))
    assert {p.split(":")[0] for p in info.value.problems} == {"result.tokens_per_s_per_gpu", "layout.tpp"}


def test_not_a_mapping_and_bad_yaml_are_rejected():
    for text in ("- a\n- b\n", "a: [1,\n"):
        with pytest.raises(RecipeInvalid):
            parse_recipe(text)


def test_schema_file_matches_the_models():
    """Fails when schema/recipe.schema.yaml and the models disagree: regenerate with
    `python -m autotune.recipes.schema > schema/recipe.schema.yaml`."""
    on_disk = (REPO / SCHEMA_PATH_IN_REPO).read_text()
    assert on_disk == schema_yaml()
    assert yaml.safe_load(on_disk) == json.loads(json.dumps(schema_dict()))


def test_schema_generator_entry_point_prints_the_schema():
    out = subprocess.run([sys.executable, "-m", "autotune.recipes.schema"], capture_output=True, text=True, check=True)
    assert out.stdout == schema_yaml()


def _properties(node, where="$"):
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            yield f"{where}.{name}", prop
        for key, value in node.items():
            yield from _properties(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _properties(value, f"{where}[{i}]")


def test_every_field_is_described():
    props = list(_properties(schema_dict()))
    assert len(props) > 80
    undocumented = [where for where, prop in props if not prop.get("description")]
    assert undocumented == []
    closed = [k for k, d in schema_dict()["$defs"].items() if d.get("additionalProperties") is not False]
    assert closed == []


def test_seeds_validate_against_the_generated_json_schema(seed_path):
    jsonschema = pytest.importorskip("jsonschema")
    data = json.loads(json.dumps(yaml.safe_load(seed_path.read_text()), default=str))
    jsonschema.validate(data, schema_dict())
    bad = dict(data, result=dict(data["result"], tokens_per_s_per_gpu=-1))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema_dict())


def test_recipe_fields_in_seed_order(seed_path):
    keys = list(yaml.safe_load(seed_path.read_text()))
    optional = [k for k in Recipe.model_fields if k in Recipe._omit_none]  # autotune's additions, left out when empty
    assert keys == [k for k in Recipe.model_fields if k not in optional]
    assert optional == ["notes"] and list(Recipe.model_fields)[-1] == "notes"
