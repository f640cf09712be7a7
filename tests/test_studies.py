"""Studies as configs (experiments/README.md): no study imports another, the library never
imports experiments/, every study script is mapped to its command and doc, every study config's
grid composes and passes cdlm-train's checks, and the shared pieces (experiments/study.py,
the learning study's multipliers) compute what they say, by hand."""

import ast
import itertools
import json
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
STUDY_CONFIGS = [  # conf/experiment/ studies with a sweep grid
    "learning", "duo", "duo_chars", "conditional_plan", "conditional_austen", "worlds_learned",
    "worlds_learned_austen", "worlds_learned_crossover", "learning_austen", "learning_crossover",
    "worlds_conditional",
]  # fmt: skip
README = EXPERIMENTS / "README.md"


def local_imports(path: Path) -> set[str]:
    """The top-level names a module imports (at any depth: a function's import counts)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def studies() -> list[set[str]]:
    """Each study's modules: the files named on one row of experiments/README.md's table."""
    rows = [
        line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `")
    ]
    return [set(re.findall(r"`(\w+)\.py`", row.split("|")[1])) for row in rows]


def test_every_script_is_one_studys_and_shared_is_study_py():
    named = [m for study in studies() for m in study]
    assert len(named) == len(set(named)), "a module on two rows of experiments/README.md"
    found = {p.stem for p in EXPERIMENTS.glob("*.py")} - SHARED
    assert found == set(named), f"not in experiments/README.md's table: {found - set(named)}"


@pytest.mark.parametrize("modules", studies(), ids=lambda m: min(m, key=len))
def test_a_study_imports_no_other_study(modules):
    others = {p.stem for p in EXPERIMENTS.glob("*.py")} - SHARED - modules
    for name in modules:
        imported = local_imports(EXPERIMENTS / f"{name}.py") & others
        assert not imported, f"{name}.py imports another study: {imported}"


def test_the_library_never_imports_experiments():
    for path in (ROOT / "cdlm").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "experiments" not in local_imports(path), path
        assert not re.search(r"sys\.path.*experiments", text), path


def test_the_readme_links_docs_and_configs_that_exist():
    readme = README.read_text(encoding="utf-8")
    for doc in re.findall(r"\]\((\.\./docs/[^)#]+)", readme):
        if not doc.endswith("learning.md"):  # written by the study's first run
            assert (EXPERIMENTS / doc).resolve().is_file(), doc
    for config in re.findall(r"experiment=(\w+)", readme):
        assert (config_dir() / "experiment" / f"{config}.yaml").is_file(), config


def grid(params: dict) -> list[list[str]]:
    """Every job's overrides of a basic-sweeper ``params`` block (a single value is one job's)."""
    parser = OverridesParser.create()
    axes = []
    for key, values in params.items():
        override = parser.parse_override(f"{key}={values}")
        found = override.sweep_string_iterator() if override.is_sweep_override() else [values]
        axes.append([f"{key}={v}" for v in found])
    return [list(job) for job in itertools.product(*axes)]


@pytest.mark.parametrize("name", STUDY_CONFIGS)
def test_every_job_of_a_study_grid_passes_cdlm_trains_checks(name):
    params = compose("train", [f"experiment={name}"], hydra=True).hydra.sweeper.params
    jobs = grid(dict(params))
    assert jobs
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


def test_each_spec_is_evaluated_once_in_a_child_and_then_read_back(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        "import json, sys\n"
        "spec = json.loads(sys.argv[2]); out = sys.argv[4]\n"
        "open(out, 'w').write(json.dumps([{'name': spec['name'], 'opt': sys.argv[5]}]))\n"
        "open(out + '.ran', 'a').write('x')\n"
    )
    specs = [{"name": "a"}, {"name": "b"}]
    rows = study.evaluate_children(script, specs, tmp_path / "out", 2, ["--flag"])
    assert rows == [{"name": "a", "opt": "--flag"}, {"name": "b", "opt": "--flag"}]
    assert study.evaluate_children(script, specs, tmp_path / "out", 2, ["--flag"]) == rows
    assert (tmp_path / "out" / "a.json.ran").read_text() == "x"  # once: the second read it back


def test_a_results_doc_keeps_its_reading_and_carries_the_header(tmp_path):
    found = {"rows": [{"commit": "abc123", "cost": {"parallel_jobs": 2}}]}
    path = study.write("x", "Title", "body\n", {"rows": [1]}, ["cdlm-train -m a"], found, tmp_path)
    text = path.read_text()
    assert text.startswith("# Title\n\n- **Command:** `cdlm-train -m a`\n- **Commits:** `abc123`")
    assert "at most 2 job(s)" in text
    path.write_text(text + "\nThe reading, by hand.\n")
    study.write("x", "Title", "new body\n", {"rows": [2]}, ["cdlm-train -m a"], found, tmp_path)
    text = path.read_text()
    assert "new body" in text and "body\n\n" not in text.split(study.END)[0].split("new")[0]
    assert text.endswith("The reading, by hand.\n")
    record = json.loads((tmp_path / "x.json").read_text())
    assert record["command"] == "cdlm-train -m a" and record["commits"] == ["abc123"]
    assert record["rows"] == [2]


def test_the_conditional_tables_grid_and_its_floor_rule(tmp_path):
    conditional = experiment_module("worlds_conditional")
    files = conditional.prompt_files(tmp_path)
    for world, tasks in files.items():
        for process in conditional.GROUPS:
            cmd = conditional.command(tmp_path, world, process, tasks, 8)
            sweep = dict(a.split("=", 1) for a in cmd[2:] if not a.startswith("hydra."))
            jobs = grid(sweep)
            assert len(jobs) == conditional.GROUPS[process].jobs(len(tasks)), (world, process)
    row = {"kl_rate": 0.30, "kl_floor": 0.25, "kl_floor_se": 0.01}  # one set's s.d.: 0.028
    assert conditional.at_floor(row)  # 0.05 above: within 2 s.d. (0.057)
    assert not conditional.at_floor(row | {"kl_rate": 0.31})
