"""Studies as configs (experiments/README.md): no study imports another, the library never
imports experiments/, every study script is mapped to its command and doc, every study config's
grid composes and passes cdlm-train's checks, and the shared pieces (experiments/study.py,
the learning study's multipliers) compute what they say, by hand."""

import ast
import itertools
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch
from conftest import experiment_module
from hydra.core.override_parser.overrides_parser import OverridesParser

from cdlm import config_dir, pretrained
from cdlm.cli.train import validate
from cdlm.configs import compose, compose_checked

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
SHARED = {"study"}  # what every study may import besides the library
STUDY_CONFIGS = [  # conf/experiment/ studies with a sweep grid
    "learning", "duo", "duo_chars", "duo_last_step", "conditional_plan", "conditional_austen",
    "conditional_guidance", "worlds_learned",
    "worlds_learned_austen", "worlds_learned_crossover", "learning_austen", "learning_austen_cpu",
    "learning_crossover",
    "learning_tokens",
    "decoding",
    "worlds_conditional_models", "pretrained_block",
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
    composed = compose("train", [f"experiment={name}"], hydra=True)
    if pretrained.is_base(composed.init_from):  # a study that starts from a wheel's base model
        try:
            pretrained.resolve(composed.init_from)
        except ValueError as e:  # not installed: the one-line error names the install command
            pytest.skip(str(e))
    jobs = grid(dict(composed.hydra.sweeper.params))
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
        return {"world": "chars", "process": process, "lr": 1e-3, "steps_to_eps": eps,
                "flops_to_eps": {e: flops for e in eps},
                "first_validation_bound": {e: False for e in eps}}  # fmt: skip

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


def test_a_results_json_writes_an_infinite_figure_as_null_and_names_it(tmp_path):
    found = {"rows": [{"commit": "abc123", "cost": {"parallel_jobs": 1}}]}
    payload = {"rows": [{"kl_rate": float("inf"), "kl_floor": 0.1, "infinite": ["tv"]}],
               "goals": {"best": {"kl_rate": float("nan")}}, "n": 2}  # fmt: skip
    study.write("x", "Title", "body\n", payload, ["cdlm-train -m a"], found, tmp_path)
    text = (tmp_path / "x.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a results JSON"))
    assert record["rows"] == [{"kl_rate": None, "kl_floor": 0.1, "infinite": ["tv", "kl_rate"]}]
    assert record["goals"] == {"best": {"kl_rate": None, "infinite": ["kl_rate"]}}
    assert record["n"] == 2 and "infinite" not in record


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


def test_ar_reference_is_measured_where_any_job_measured_it_at_ars_fastest_rate():
    def ar(lr, steps, bound=False, process="autoregressive"):
        flops = None if steps is None else steps * 10.0
        return {"world": "chars", "process": process, "lr": lr,
                "steps_to_eps": {str(e): steps for e in learning.EPSILONS},
                "flops_to_eps": {str(e): flops for e in learning.EPSILONS},
                "first_validation_bound": {str(e): bound for e in learning.EPSILONS}}  # fmt: skip

    coarse = [ar(1e-3, 49, bound=True), ar(1e-3, 49, bound=True)]  # crossed by step 49
    ref = learning.reference(coarse, "chars", "steps_to_eps", "0.1")
    assert ref == {"value": 49, "lr": 1e-3, "seeds": 2, "bound": True}  # only a bound
    fine = [ar(1e-3, 20), ar(1e-3, 30), ar(3e-3, 18), ar(3e-3, 22), ar(3e-4, 10), ar(3e-4, None)]
    ref = learning.reference(coarse + fine, "chars", "steps_to_eps", "0.1")
    # the bounds give way to the measurements; 3e-3 (mean 20) beats 1e-3 (25); 3e-4 has a seed
    # that never got there, so its one fast seed is no reference
    assert ref == {"value": 20, "lr": 3e-3, "seeds": 2, "bound": False}
    rows = [*coarse, *fine, ar(1e-3, 100, process="masked")]
    refs = learning.multipliers(rows)
    assert refs["chars"]["flops_to_eps"]["0.1"]["value"] == pytest.approx(200.0)
    assert rows[-1]["multiplier"]["0.1"] == pytest.approx(5.0)
    assert rows[-1]["flops_multiplier"]["0.1"] == pytest.approx(5.0)


def test_the_unigram_plateau_is_the_unigram_models_excess_over_the_world():
    from cdlm import worlds

    chars = worlds.load("world:chars")
    p = chars.token_marginals()[0]  # a stationary chain: every position's marginal is the unigram
    cross_entropy = -(p * p.clamp_min(1e-300).log()).sum() / math.log(2)  # unigram model, bits
    by_hand = float(cross_entropy) - chars.entropy_rate() / math.log(2)
    assert learning.plateau_bits("chars") == pytest.approx(by_hand, abs=1e-9)
    assert learning.plateau_bits("chars") == pytest.approx(0.7791, abs=1e-4)


def test_a_recipe_row_is_labelled_by_the_settings_it_stands_for():
    assert learning.label({"recipe": "masked_no_ar_phase", "seed": "0"}) == "phases=none"
    assert learning.label({"process": "masked", "phases": "none"}) == "phases=none"
    assert learning.label({"recipe": "autoregressive_lr3e-3"}) == "default"  # lr: a column
    assert learning.label({"recipe": "block_default"}) == "default"
    block = learning.label({"recipe": "block"})
    assert "phases.ar=0.5" in block and "process.complementary=True" in block


def test_a_job_reads_its_process_world_and_rate_from_its_hydra_folder(tmp_path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "config.yaml").write_text(
        "optimizer: {lr: 0.003}\nlr_scheduler: {total_steps: 300}\ndata: {world: world:tokens2k}\n"
    )
    (hydra / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    choices: {process: autoregressive}\n"
    )
    ran = learning.ran_with({"folder": str(tmp_path)})
    assert ran == learning.Ran("autoregressive", "world:tokens2k", 0.003, 300)


def test_leaving_the_plateau_is_a_multiple_of_ars_steps_to_half_the_plateau():
    def row(process, leave, bound=False):
        eps = {str(e): None for e in learning.EPSILONS}
        return {"world": "tokens2k", "process": process, "lr": 1e-3, "steps_to_eps": eps,
                "flops_to_eps": dict(eps), "steps_to_leave": {learning.LEAVE: leave},
                "flops_to_leave": {learning.LEAVE: None if leave is None else 10.0 * leave},
                "first_validation_bound": {**{e: False for e in eps}, learning.LEAVE: bound}}  # fmt: skip

    rows = [row("autoregressive", 40), row("autoregressive", 60), row("masked", 150)]
    rows.append(row("gaussian", None))
    refs = learning.multipliers(rows)
    assert refs["tokens2k"]["steps_to_leave"][learning.LEAVE]["value"] == pytest.approx(50.0)
    assert rows[2]["leave_multiplier"][learning.LEAVE] == pytest.approx(3.0)
    assert rows[2]["leave_flops_multiplier"][learning.LEAVE] == pytest.approx(3.0)
    assert rows[3]["leave_multiplier"][learning.LEAVE] is None  # never left it


def test_learning_tokens_is_learning_in_the_token_world_and_nothing_else():
    from omegaconf import OmegaConf

    def flat(name: str) -> dict:
        config = compose("train", [f"experiment={name}", "process=masked"])
        return dict(_flatten(OmegaConf.to_container(config, resolve=False)))

    base, tokens = flat("learning"), flat("learning_tokens")
    differ = {k for k in base.keys() | tokens.keys() if base.get(k) != tokens.get(k)}
    assert differ == {
        "name", "data.world", "trainer.max_steps", "trainer.val_check_interval",
        "callbacks.excess.sequences", "callbacks.excess.draws", "callbacks.excess.group_size",
    }  # fmt: skip


def _flatten(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_a_sweep_command_names_its_folder_as_given_not_the_machine_path(tmp_path, monkeypatch):
    sweep = tmp_path / "multirun" / "ar_fine"
    sweep.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: [experiment=learning, seed=0]\n"
        f"    hydra: [hydra.sweep.dir={sweep}, hydra.mode=MULTIRUN]\n"
    )
    command = learning.sweep_command(Path("multirun/ar_fine"))  # relative, as the doc names it
    assert command == (
        "cdlm-train -m experiment=learning seed=0 hydra.sweep.dir=multirun/ar_fine "
        "hydra.mode=MULTIRUN"
    )


def test_the_decoding_studys_kl_se_matches_the_spread_over_independent_sample_sets():
    from cdlm import worlds

    decoding = experiment_module("decoding")
    world = worlds.load("world:chars", length=32)
    g = torch.Generator().manual_seed(0)
    sets = [world.sample(64, 32, generator=g) for _ in range(24)]
    spread = statistics.stdev(decoding.kl_with_se(world, s, 2)["kl_rate"] for s in sets)
    se = decoding.kl_with_se(world, sets[0], 32)["kl_rate_se"]
    assert spread / 2 < se < spread * 2, (se, spread)


def test_the_decoding_studys_band_and_goals_by_hand():
    decoding = experiment_module("decoding")

    def row(model, process, sampler, kl, speed, per_call, samples=128):
        return {"world": "w", "model": model, "process": process, "sampler": sampler,
                "batch": 1, "kl_rate": kl, "kl_rate_se": 0.01, "samples": samples,
                "speed_over_ar": {"median": speed}, "tokens_per_call": per_call}  # fmt: skip

    rows = [
        row("learned", "autoregressive", "ar", 0.10, 1.0, 1.0),
        row("learned", "block", "speculative", 0.115, 1.5, 1.2),  # inside: 0.115 <= 0.12
        row("learned", "block", "fast", 0.125, 3.0, 4.0),  # above the band's top
        row("oracle", "block", "speculative", 0.05, None, 1.6, samples=32),
    ]
    decoding.mark_band(rows)
    assert [r["within_ar_band"] for r in rows] == [True, True, False, None]
    (goal,) = decoding.goals(rows)
    assert goal["best_within_band"] == "speculative" and not goal["speed_goal_met"]
    assert goal["fastest"] == "fast" and goal["share_of_ceiling"] == pytest.approx(0.75)
    assert not goal["ceiling_goal_met"]
    rows[2]["kl_rate"] = 0.11
    decoding.mark_band(rows)
    assert decoding.goals(rows)[0]["speed_goal_met"]


def austen_job(folder: Path, command: str, overrides: list[str], report: dict) -> None:
    """A finished job of the Austen sweeps: a training job with its cached bound, or a cdlm-eval
    job with its report."""
    from cdlm.run.record import Cost, Record, write

    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    write(
        folder, Record(command, overrides, Cost(), steps=100 if command == "cdlm-train" else None)
    )
    name = "bound.json" if command == "cdlm-train" else f"{report['metric']}.json"
    (folder / name).write_text(json.dumps(report))


def test_the_austen_rows_pair_each_lever_and_carry_its_frontier_and_mauve(tmp_path):
    """learning.austen: the lever's gain is the default's bound minus its own, token-weighted over
    groups (weights 1/4, 3/4) with the draws averaged first: differences (-0.5, 0) give +0.125
    ± 0.1875; each job gets the frontier and MAUVE of the eval jobs whose ckpt names it, and
    its entropy over real text's at T = 1 (7.2 / 9.0)."""
    bound = {"tokens": [10, 30], "sequences": 4}
    austen_job(tmp_path / "austen" / "0", "cdlm-train", ["recipe=masked"],
               bound | {"bits": [[2.0, 3.0], [2.0, 3.0]]})  # fmt: skip
    austen_job(tmp_path / "austen" / "1", "cdlm-train", ["recipe=masked_complementary"],
               bound | {"bits": [[1.0, 3.5], [2.0, 2.5]]})  # fmt: skip
    points = [{"temperature": t, "entropy": e, "gen_ppl": p, "quality": {"gen_ppl_se": 9.0}}
              for t, e, p in ((0.8, 6.0, 300.0), (1.0, 7.2, 900.0))]  # fmt: skip
    frontier = {"metric": "frontier", "points": points, "num_samples": 8,
                "sampler": {"name": "ancestral", "steps": 64},
                "reference": {"token_entropy_bits": 9.0, "gen_ppl": 40.0},
                "gen_ppl_at_reference_entropy": None}  # fmt: skip
    austen_job(tmp_path / "frontier" / "0", "cdlm-eval", [f"ckpt={tmp_path}/austen/1"], frontier)
    mauve = {"metric": "mauve", "num_samples": 8,
             "mauve": {"mean": 0.5, "min": 0.4, "median": 0.5, "max": 0.6, "per_seed": [0.4, 0.6]}}  # fmt: skip
    austen_job(tmp_path / "mauve" / "0", "cdlm-eval", [f"ckpt={tmp_path}/austen/1"], mauve)
    rows, found = learning.austen(tmp_path)
    default, lever = rows
    assert len(found["rows"]) == 4
    assert default["lever"] == "default" and "paired_gain_bits" not in default
    assert default["bound_bits"] == pytest.approx(0.25 * 2.0 + 0.75 * 3.0, abs=1e-12)
    assert (lever["world"], lever["process"], lever["lever"]) == (
        "austen",
        "masked",
        "complementary",
    )
    assert lever["paired_gain_bits"] == pytest.approx(0.125, abs=1e-12)
    assert lever["paired_gain_se"] == pytest.approx(0.1875, abs=1e-12)
    assert lever["entropy_over_real_at_t1"] == pytest.approx(0.8)
    assert lever["mauve"]["max"] == 0.6 and lever["mauve_seeds"] == 2
    assert "frontier" not in default and "mauve" not in default
    text = learning.austen_table(rows)
    assert "+0.125 ± 0.188 (+0.7 SE)" in text and "T 1: 900 ± 9 at 7.20" in text
