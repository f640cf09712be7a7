"""Studies as configs (experiments/README.md): no study imports another, the library never
imports experiments/, every study script is mapped to its command and doc, every study config's
grid composes and passes cdlm-train's checks, and the shared pieces (experiments/study.py,
the learning study's multipliers) compute what they say, by hand."""

import ast
import itertools
import re
from pathlib import Path

import pytest
from conftest import experiment_module
from hydra.core.override_parser.overrides_parser import OverridesParser

from cdlm import config_dir
from cdlm.cli.train import validate
from cdlm.configs import compose, compose_checked

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
SHARED = {"study"}  # what every study may import besides the library
STUDY_CONFIGS = ["learning"]  # conf/experiment/ studies with a sweep grid


def local_imports(path: Path) -> set[str]:
    """The top-level names a module imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def studies() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.glob("*.py") if p.stem not in SHARED)


@pytest.mark.parametrize("path", studies(), ids=lambda p: p.stem)
def test_a_study_imports_no_other_study(path):
    others = {p.stem for p in EXPERIMENTS.glob("*.py")} - SHARED - {path.stem}
    assert not local_imports(path) & others, f"{path.name} imports {local_imports(path) & others}"


def test_the_library_never_imports_experiments():
    for path in (ROOT / "cdlm").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "experiments" not in local_imports(path), path
        assert not re.search(r"sys\.path.*experiments", text), path


def test_the_readme_maps_every_study_to_its_command_and_doc():
    readme = (EXPERIMENTS / "README.md").read_text(encoding="utf-8")
    for path in studies():
        assert f"`{path.name}`" in readme, f"{path.name} is not in experiments/README.md"
    for doc in re.findall(r"\]\((\.\./docs/[^)#]+)", readme):
        assert (EXPERIMENTS / doc).resolve().is_file(), doc
    for config in re.findall(r"experiment=(\w+)", readme):
        assert (config_dir() / "experiment" / f"{config}.yaml").is_file(), config


def grid(params: dict) -> list[list[str]]:
    parser = OverridesParser.create()
    axes = [
        [f"{k}={v}" for v in parser.parse_override(f"{k}={vals}").sweep_string_iterator()]
        for k, vals in params.items()
    ]
    return [list(job) for job in itertools.product(*axes)]


@pytest.mark.parametrize("name", STUDY_CONFIGS)
def test_every_job_of_a_study_grid_passes_cdlm_trains_checks(name):
    params = compose("train", [f"experiment={name}"], hydra=True).hydra.sweeper.params
    jobs = grid(dict(params))
    assert len(jobs) > 1
    for job in jobs:
        overrides = [f"experiment={name}", *job]
        validate(compose_checked("train", overrides), overrides)


study = experiment_module("study")
learning = experiment_module("learning")


def test_a_crossing_is_interpolated_between_the_points_around_it():
    curve = [(0, 1.0), (10, 0.5), (20, 0.1), (30, 0.05)]
    assert study.crossing(curve, 0.3) == pytest.approx(15.0)  # halfway from 0.5 to 0.1
    assert study.crossing(curve, 1.5) == 0.0  # below from the start
    assert study.crossing(curve, 0.01) is None  # never reached
    assert study.slope([(0, 3.0), (100, 2.0), (200, 1.0)]) == pytest.approx(-0.01)


def test_flops_at_a_fractional_step_and_the_multiplier_over_ar():
    flops = [(10, 100.0), (20, 300.0)]
    assert learning.flops_at(flops, 15) == pytest.approx(200.0)
    assert learning.flops_at(flops, 5) == pytest.approx(50.0)  # from (0, 0)
    assert learning.flops_at(flops, 25) is None

    def row(process, steps, flops):
        eps = {str(e): steps for e in learning.EPSILONS}
        return {"world": "chars", "process": process, "steps_to_eps": eps,
                "flops_to_eps": {e: flops for e in eps}}  # fmt: skip

    rows = [
        row("autoregressive", 100, 1e9),
        row("autoregressive", 300, 3e9),
        row("masked", 600, 1e10),
    ]
    learning.multipliers(rows)
    assert rows[2]["multiplier"]["0.1"] == pytest.approx(3.0)  # 600 over AR's mean, 200
    assert rows[2]["flops_multiplier"]["0.1"] == pytest.approx(5.0)
    rows[1]["steps_to_eps"]["0.1"] = None  # one AR seed never got there: no multiplier
    learning.multipliers(rows)
    assert rows[2]["multiplier"]["0.1"] is None
