"""The recipe (schema_version 1) as a pydantic model, and the JSON Schema generated from it.

`schema/recipe.schema.yaml` at the repository root is generated from these models, never edited by hand:

    python -m autotune.recipes.schema > schema/recipe.schema.yaml

and a test fails when the file and the models disagree. The section models live in `sections.py`.
"""

from __future__ import annotations

import sys
from typing import Literal

import yaml
from pydantic import Field

from .sections import (
    Author,
    Correctness,
    Gpu,
    LayoutSection,
    Patch,
    Result,
    Section,
    Stack,
    WorkloadSection,
)

__all__ = ["Recipe", "Status", "SCHEMA_PATH_IN_REPO", "schema_dict", "schema_yaml"]

Status = Literal["verified", "measured", "predicted"]
SCHEMA_PATH_IN_REPO = "schema/recipe.schema.yaml"


class Recipe(Section):
    """An OpenRecipes recipe: a parallel layout for one model on one GPU kind, its measured (or predicted)
    throughput, how its correctness was checked, and the command that runs it."""

    _omit_none = frozenset({"notes"})
    schema_version: Literal[1] = Field(description="Recipe format version; this schema describes version 1.")
    model: str = Field(min_length=1, description="Model name as on Hugging Face / the catalog, e.g. Qwen3.5-122B-A10B.")
    gpu: Gpu = Field(description="The GPUs the numbers come from.")
    author: Author = Field(description="Who measured the recipe.")
    status: Status = Field(
        description="verified: measured and passed the correctness gates; measured: measured, gates not all run or "
        "passed; predicted: from autotune's cost model, never run."
    )
    stack: Stack = Field(description="Software versions of the measured run.")
    workload: WorkloadSection = Field(description="What is trained: rows, batch, precision, dataset.")
    layout: LayoutSection = Field(description="The parallel layout.")
    result: Result = Field(description="Throughput, cost and MFU, with how they were measured.")
    correctness: Correctness = Field(description="Correctness gates and their outcomes.")
    env: dict[str, str] = Field(description="Environment variables the run sets (also exported in `run`).")
    patches: list[Patch] = Field(description="Source patches needed on top of the stack; empty for none.")
    run: str = Field(min_length=1, description="Shell commands that launch the run (slime), exactly as measured.")
    notes: list[str] | None = Field(None, description="Free-text notes, e.g. why the search tried this layout (the "
                                    "planner's rationale), and what the model needs beyond its MODEL_ARGS (settings "
                                    "the command line cannot express, such as rope scaling); optional, left out when "
                                    "empty.")


def schema_dict() -> dict:
    """JSON Schema (draft 2020-12) of a recipe, as a plain dict."""
    body = Recipe.model_json_schema()
    head = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://openrecipes.dev/schema/recipe.schema.yaml",
    }
    return {**head, **body}


_HEADER = (
    "# schema/recipe.schema.yaml: the OpenRecipes recipe format (schema_version 1) as JSON Schema in YAML.\n"
    "# Generated from autotune.recipes.schema; do not edit. Regenerate with\n"
    "#   python -m autotune.recipes.schema > schema/recipe.schema.yaml\n"
)


def schema_yaml() -> str:
    """The text of schema/recipe.schema.yaml."""
    return _HEADER + yaml.safe_dump(schema_dict(), sort_keys=False, width=116, allow_unicode=True)


def main() -> None:
    sys.stdout.write(schema_yaml())


if __name__ == "__main__":
    main()
