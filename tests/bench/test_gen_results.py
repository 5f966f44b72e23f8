"""docs/gen_results.py renders bench/results into docs/results.md: its figures must read as recorded."""
import importlib.util
from pathlib import Path

GEN = Path(__file__).resolve().parents[2] / "docs" / "gen_results.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_results", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_microbenchmark_figures_keep_their_digits():
    """Trailing zeros go only after a decimal point: a profile's rows 10 and 300 once read 1 and 3."""
    gen = _gen()
    assert [gen.short(x) for x in (10, 300, 3110, 2.5, 0.125, 1.0, 0.0)] == ["10", "300", "3,110", "2.5", "0.125", "1", "0"]
    assert gen.flatten({"rows": [1, 10, 32], "s": {"old": 5.2}}) == [("rows", "1, 10, 32"), ("s/old", "5.2")]
