"""Bad input to ``cdlm-sample`` and ``cdlm-eval``: one line on stderr, exit status 2, no file.

The entry points run in-process (a fresh interpreter costs seconds per case); one case also runs
as a real subprocess, so the table's verdicts hold for the installed command too.
"""

import sys

import pytest
import torch
from conftest import run_cli
from hydra.core.global_hydra import GlobalHydra
from safetensors.torch import save_file

from cdlm.checkpoint import check_model_file
from cdlm.cli import eval as eval_cli
from cdlm.cli import sample as sample_cli
from cdlm.cli.common import UsageError, require_number
from cdlm.samplers.grids import make_grid
from cdlm.schedules import CosineMaskSchedule, LogLinearMaskSchedule

MAINS = {"cdlm-sample": sample_cli.main, "cdlm-eval": eval_cli.main}
SCALE_NEEDS_LABEL = "guidance.scale needs label=NAME (a class-conditional model)"
LIGHTNING = "is a Lightning training checkpoint (for resuming: cdlm-train resume="

CASES = [
    # cdlm-sample: types and ranges, refused before any work
    ("cdlm-sample", ["steps=abc"], "steps must be an integer >= 1, got 'abc'"),
    ("cdlm-sample", ["steps=-1"], "steps must be >= 1, got -1"),
    ("cdlm-sample", ["steps=1.5"], "steps must be an integer >= 1, got 1.5"),
    ("cdlm-sample", ["num_samples=x"], "num_samples must be an integer >= 1, got 'x'"),
    ("cdlm-sample", ["temperature=abc"], "temperature must be a number > 0, got 'abc'"),
    ("cdlm-sample", ["seq_len=abc"], "seq_len must be an integer >= 1 (or null: the training"),
    ("cdlm-sample", ["batch_size=true"], "batch_size must be an integer >= 1 (or null: one"),
    ("cdlm-sample", ["seed=abc"], "seed must be an integer, got 'abc'"),
    ("cdlm-sample", ["edit_strength=abc"], "edit_strength must be a number in (0, 1], got 'abc'"),
    ("cdlm-sample", ["label=emma", "guidance.scale=abc"], "guidance.scale must be a number >= 0"),
    ("cdlm-sample", ["grid=nope"], "unknown grid 'nope'; valid: uniform, logsnr, karras"),
    ("cdlm-sample", ["clamp=abc"], "clamp must be true or false, got 'abc'"),
    ("cdlm-sample", ["device=abc"], "unknown device 'abc'; valid: auto, cpu, cuda"),
    # two unknown keys: the first is named, with the options the defaults have
    ("cdlm-sample", ["stepz=3", "numsamples=2"], ("unknown config option 'stepz'", "steps")),
    # a guidance scale without a label would be silently ignored
    ("cdlm-sample", ["guidance.scale=[0,1,2,4]"], SCALE_NEEDS_LABEL),
    ("cdlm-sample", ["guidance.scale=2"], SCALE_NEEDS_LABEL),
    # a log-SNR grid on a masked model: found after loading it, inside the guarded runner
    (
        "cdlm-sample",
        ["ckpt=MASKED", "grid=logsnr"],
        "grid='logsnr' needs the process's noise schedule with a log-SNR (a gaussian model); "
        "this model's schedule is LogLinearMaskSchedule; use grid=uniform",
    ),
    # files that are not cdlm models
    ("cdlm-sample", ["ckpt=LIGHTNING"], (LIGHTNING, "; sample from /", "/run/model.safetensors")),
    (
        "cdlm-sample",
        ["ckpt=LEGACY"],
        ("is a torch.save (pickle) file, not a cdlm model", "resume="),
    ),
    ("cdlm-sample", ["ckpt=EMPTY"], "the file is empty (0 bytes)"),
    ("cdlm-sample", ["ckpt=TRUNCATED"], "the file is truncated (100 bytes, its header describes"),
    # cdlm-eval: the same checks
    ("cdlm-eval", ["steps=abc"], "steps must be an integer >= 1, got 'abc'"),
    ("cdlm-eval", ["num_batches=x"], "num_batches must be an integer >= 1 (or null for all)"),
    ("cdlm-eval", ["batch_size=1.5"], "batch_size must be an integer >= 1, got 1.5"),
    ("cdlm-eval", ["repeats=abc"], "repeats must be an integer >= 1, got 'abc'"),
    ("cdlm-eval", ["temperature=abc"], "temperature must be a number > 0, got 'abc'"),
    ("cdlm-eval", ["data.val_fraction=abc"], "data.val_fraction must be a number in (0, 1)"),
    ("cdlm-eval", ["metric=ode_nll", "metric.rtol=abc"], "metric.rtol must be a number > 0"),
    ("cdlm-eval", ["metric=elbo", "metric.t_samples=0"], "metric.t_samples must be >= 1, got 0"),
    ("cdlm-eval", ["guidance.scale=2"], "unknown config option 'guidance.scale'"),
    ("cdlm-eval", ["metric=elbo", "ckpt=LIGHTNING"], LIGHTNING),
    ("cdlm-eval", ["metric=elbo", "ckpt=TRUNCATED"], "the file is truncated"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """A run folder's Lightning .ckpt (a zip) beside its model file, a legacy-format torch.save
    pickle, an empty file and a truncated safetensors file."""
    folder = tmp_path_factory.mktemp("bad")
    (folder / "run" / "checkpoints").mkdir(parents=True)
    model = folder / "run" / "model.safetensors"
    save_file({"w": torch.zeros(64)}, str(model))
    files = {
        "LIGHTNING": folder / "run" / "checkpoints" / "last.ckpt",
        "LEGACY": folder / "legacy.pt",
        "EMPTY": folder / "empty.safetensors",
        "TRUNCATED": folder / "truncated.safetensors",
    }
    torch.save({"state_dict": {}}, files["LIGHTNING"])
    torch.save({"state_dict": {}}, files["LEGACY"], _use_new_zipfile_serialization=False)
    files["EMPTY"].write_bytes(b"")
    files["TRUNCATED"].write_bytes(model.read_bytes()[:100])
    return files


def call(prog: str, args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """The entry point in-process: its exit status and stderr."""
    monkeypatch.setattr(sys, "argv", [prog, *args])
    try:
        with pytest.raises(SystemExit) as exit_:
            MAINS[prog]()
    finally:
        GlobalHydra.instance().clear()  # hydra.main leaves itself initialised
    return exit_.value.code, capsys.readouterr().err


def assert_refused(prog, status, stderr, message, out):
    lines = stderr.splitlines()
    assert status == 2, stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    for fragment in [message] if isinstance(message, str) else message:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in stderr
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))


@pytest.mark.parametrize(
    "prog, args, message", CASES, ids=[f"{p[5:]} {' '.join(a)}" for p, a, _ in CASES]
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    prog, args, message, bad_files, request, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)

    def path(name):
        if name == "MASKED":
            return request.getfixturevalue("tiny_masked_checkpoint")
        return bad_files.get(name, name)

    args = [a if not a.startswith("ckpt=") else f"ckpt={path(a[5:])}" for a in args]
    if not any(a.startswith("ckpt=") for a in args):
        args.append("ckpt=missing.safetensors")  # refused before validation reaches the file
    out = tmp_path / "out.json"
    status, stderr = call(prog, [*args, f"out={out}"], monkeypatch, capsys)
    assert_refused(prog, status, stderr, message, out)


def test_the_installed_command_gives_the_same_one_line(tmp_path):
    out = tmp_path / "out.jsonl"
    result = run_cli("cdlm-sample", "ckpt=X", "steps=abc", f"out={out}", cwd=tmp_path)
    assert_refused("cdlm-sample", result.returncode, result.stderr, "got 'abc'", out)


@pytest.mark.parametrize("grid", ["logsnr", "karras"])
@pytest.mark.parametrize("schedule", [LogLinearMaskSchedule(), CosineMaskSchedule(), None])
def test_log_snr_grids_name_what_they_need(grid, schedule):
    """The library check behind the MASKED case, without a trained model."""
    found = (
        "this model has none"
        if schedule is None
        else f"this model's schedule is {type(schedule).__name__}"
    )
    with pytest.raises(ValueError) as err:
        make_grid(grid, 4, schedule)
    assert str(err.value) == (
        f"grid={grid!r} needs the process's noise schedule with a log-SNR (a gaussian model); "
        f"{found}; use grid=uniform"
    )


@pytest.mark.parametrize(
    "value, options, message",
    [
        (float("nan"), {"above": 0}, "x must be > 0, got nan"),
        (True, {"integer": True}, "x must be an integer, got True"),
        ("1", {}, "x must be a number, got '1'"),
        (2.0, {"integer": True, "at_least": 1}, "x must be an integer >= 1, got 2.0"),
        (0.5, {"above": 0, "below": 0.5}, "x must be in (0, 0.5), got 0.5"),
        (None, {"at_least": 1}, "x must be a number >= 1, got None"),
    ],
)
def test_require_number_names_key_range_and_value(value, options, message):
    with pytest.raises(UsageError) as err:
        require_number("x", value, **options)
    assert str(err.value) == message
    require_number("x", None, nullable=True, **options)  # null where allowed


def test_a_whole_safetensors_file_passes_the_header_check(bad_files):
    check_model_file(bad_files["LIGHTNING"].parent.parent / "model.safetensors")
