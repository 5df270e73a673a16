"""The core (catalog, layout, space, cost) and the CLI's start-up stay free of torch and ray."""

import subprocess
import sys


def test_core_imports_neither_torch_nor_ray():
    code = ("import sys, autotune.catalog, autotune.layout, autotune.space, autotune.cost, autotune.search.driver, "
            "autotune.cli.main; print(sorted(m for m in ('torch', 'ray', 'megatron', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
