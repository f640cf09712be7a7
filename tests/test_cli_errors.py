"""Bad input to ``cdlm-train``, ``cdlm-sample`` and ``cdlm-eval`` gives one line on stderr, exit
status 2, no traceback and no output file (docs/guide/reliability.md): the cases a drawn option
cannot reach (models of each process, files, combinations of options) and one wording of each
kind of option rule. The rules themselves are fuzzed over every key in ``tests/test_fuzz.py``.

The entry points run in-process (a fresh interpreter costs seconds per case); one case also runs
as a real subprocess, so the table's verdicts hold for the installed command too. Upper-case
values (``ckpt=MASKED``, ``data.path=LATIN1``, ``out=MISSING/x``) name the files of the
``bad_files`` fixture and the trained models, one of each process, so every process's default
path through loading is covered.
"""

import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN, run_cli
from hydra.core.global_hydra import GlobalHydra
from safetensors.torch import save_file

from cdlm.cli import eval as eval_cli
from cdlm.cli import sample as sample_cli
from cdlm.cli import train as train_cli
from cdlm.model_file import check_model_file
from cdlm.samplers.grids import make_grid
from cdlm.schedules import CosineMaskSchedule, LogLinearMaskSchedule
from cdlm.validation import Number, UsageError

MAINS = {"cdlm-sample": sample_cli.main, "cdlm-eval": eval_cli.main, "cdlm-train": train_cli.main}
SCALE_NEEDS_LABEL = ("guidance.scale needs", "label=NAME (a class-conditional model)")
LIGHTNING = "is a Lightning training checkpoint (for resuming: cdlm-train resume="
MODELS = {
    "GAUSSIAN": "tiny_checkpoint",
    "MASKED": "tiny_masked_checkpoint",
    "AR": "tiny_ar_checkpoint",
}
LONG_PROMPT = "prompt=" + "word " * 40

CASES = [
    # cdlm-sample: types and ranges, refused before any work
    ("cdlm-sample", ["steps=abc"], "steps must be an integer >= 1, got 'abc'"),
    ("cdlm-sample", ["steps=1.5"], "steps must be an integer >= 1, got 1.5"),
    ("cdlm-sample", ["num_samples=0"], "num_samples must be >= 1, got 0"),
    ("cdlm-sample", ["seq_len=abc"], "seq_len must be an integer >= 1 (or null: the training"),
    ("cdlm-sample", ["edit_strength=0"], "edit_strength must be in (0, 1], got 0"),
    ("cdlm-sample", ["label=emma", "guidance.scale=abc"], "guidance.scale must be a number >= 0"),
    ("cdlm-sample", ["grid=nope"], "unknown grid 'nope'; valid: uniform, logsnr, karras"),
    ("cdlm-sample", ["clamp=abc"], "clamp must be true or false, got 'abc'"),
    ("cdlm-sample", ["device=abc"], "unknown device 'abc'; valid: auto, cpu, cuda"),
    ("cdlm-sample", ["prompt=a", "infill=b"], "give at most one of prompt=, infill=, edit="),
    # unknown keys and group options: the first is named, with the options there are
    ("cdlm-sample", ["stepz=3", "numsamples=2"], ("unknown config option 'stepz'", "steps")),
    ("cdlm-sample", ["sampler=nope"], ("Could not find 'sampler/nope'", "ddpm")),
    # a guidance scale without a label would be silently ignored
    ("cdlm-sample", ["guidance.scale=[0,1,2,4]"], SCALE_NEEDS_LABEL),
    ("cdlm-sample", ["guidance.scale=2"], SCALE_NEEDS_LABEL),
    # found after loading the model, inside the guarded runner
    (
        "cdlm-sample",
        ["ckpt=MASKED", "grid=logsnr"],
        "grid='logsnr' needs the process's noise schedule with a log-SNR (a gaussian model); "
        "this model's schedule is LogLinearMaskSchedule; use grid=uniform",
    ),
    ("cdlm-sample", ["ckpt=MASKED", "sampler=ddim"], "sampler 'ddim' does not fit a 'masked'"),
    ("cdlm-sample", ["ckpt=GAUSSIAN", "sampler=ancestral"], "does not fit a 'gaussian' model"),
    ("cdlm-sample", ["ckpt=AR", "sampler=ddpm"], "sampler 'ddpm' does not fit"),
    (
        "cdlm-sample",
        ["ckpt=AR", "sampler=ar", "sampler.graph=true", "device=cpu"],
        "sampler.graph=true replays the decode step from a CUDA graph and needs a CUDA device",
    ),
    # each process's default sampler path, up to a label that does not exist
    ("cdlm-sample", ["ckpt=GAUSSIAN", "label=nobody"], "unknown label 'nobody'; this model knows"),
    ("cdlm-sample", ["ckpt=MASKED", "label=nobody"], "unknown label 'nobody'; this model knows"),
    ("cdlm-sample", ["ckpt=AR", "label=nobody"], "unknown label 'nobody'; this model knows"),
    # a canvas longer than the network
    ("cdlm-sample", ["ckpt=GAUSSIAN", "seq_len=64"], "longer than this network's max_seq_len"),
    ("cdlm-sample", ["ckpt=MASKED", LONG_PROMPT], "longer than the canvas of 16 (seq_len)"),
    ("cdlm-sample", ["ckpt=MASKED", "infill='a [[40]] b'"], "longer than the canvas of 16"),
    ("cdlm-sample", ["ckpt=MASKED", "edit=missing.txt"], "edit file not found: missing.txt"),
    # files that are not cdlm models
    ("cdlm-sample", ["ckpt=LIGHTNING"], (LIGHTNING, "; sample from /", "/run/model.safetensors")),
    (
        "cdlm-sample",
        ["ckpt=LEGACY"],
        ("is a torch.save (pickle) file, not a cdlm model", "resume="),
    ),
    ("cdlm-sample", ["ckpt=EMPTY"], "the file is empty (0 bytes)"),
    ("cdlm-sample", ["ckpt=TRUNCATED"], "the file is truncated (100 bytes, its header describes"),
    ("cdlm-sample", ["ckpt=CORRUPT"], "cannot read checkpoint"),
    ("cdlm-sample", ["ckpt=FOREIGN"], "is not a cdlm checkpoint (no 'cdlm-1' metadata)"),
    ("cdlm-sample", ["ckpt=NOMODEL"], "is a folder without model.safetensors"),
    ("cdlm-sample", ["ckpt=missing.safetensors"], "checkpoint not found: missing.safetensors"),
    # where the output goes
    ("cdlm-sample", ["out=MISSING/x.jsonl"], "/missing does not exist"),
    ("cdlm-sample", ["out=UNWRITABLE/x.jsonl"], "cannot write in"),
    ("cdlm-sample", ["out=NOMODEL"], "is a folder; give a file name"),
    # cdlm-eval: the same checks
    ("cdlm-eval", ["num_batches=x"], "num_batches must be an integer >= 1 (or null for all)"),
    ("cdlm-eval", ["metric=ode_nll", "metric.rtol=abc"], "metric.rtol must be a number > 0"),
    ("cdlm-eval", ["metric=elbo", "metric.t_samples=0"], "metric.t_samples must be >= 1, got 0"),
    ("cdlm-eval", ["guidance.scale=2"], "unknown config option 'guidance.scale'"),
    ("cdlm-eval", ["metric=nope"], ("Could not find 'metric/nope'", "elbo")),
    (
        "cdlm-eval",
        ["metric=elbo", "ckpt=MASKED"],
        "metric=elbo scores gaussian models, not 'masked'",
    ),
    ("cdlm-eval", ["metric=ode_nll", "ckpt=AR"], "scores gaussian models, not 'autoregressive'"),
    ("cdlm-eval", ["metric=elbo", "ckpt=LIGHTNING"], LIGHTNING),
    ("cdlm-eval", ["metric=elbo", "ckpt=TRUNCATED"], "the file is truncated"),
    ("cdlm-eval", ["metric=elbo", "ckpt=LEGACY"], "is a torch.save (pickle) file"),
    ("cdlm-eval", ["metric=elbo", "ckpt=CORRUPT"], "cannot read checkpoint"),
    # held-out text the model is scored on
    ("cdlm-eval", ["metric=elbo", "ckpt=GAUSSIAN", "data.path=EMPTY_TXT"], "holds no text"),
    ("cdlm-eval", ["metric=elbo", "ckpt=GAUSSIAN", "data.path=SHORT"], "corpus too small"),
    ("cdlm-eval", ["metric=elbo", "ckpt=GAUSSIAN", "data.path=LATIN1"], "is not UTF-8 text"),
    ("cdlm-eval", ["metric=elbo", "ckpt=GAUSSIAN", "data.path=NOTEXT"], "no .txt, .txt.gz or .py"),
    ("cdlm-eval", ["out=MISSING/r.json"], "/missing does not exist"),
    ("cdlm-eval", ["out=UNWRITABLE/r.json"], "cannot write in"),
    # cdlm-train: types, ranges and unknown options, refused before Hydra makes the run folder
    ("cdlm-train", ["trainer.max_steps=abc"], "trainer.max_steps must be an integer (or -1"),
    ("cdlm-train", ["trainer.max_time=10min"], "trainer.max_time must be 'DD:HH:MM:SS'"),
    ("cdlm-train", ["trainer.val_check_interval=0"], "trainer.val_check_interval must be > 0"),
    ("cdlm-train", ["data.val_fraction=1"], "data.val_fraction must be in (0, 1), got 1"),
    ("cdlm-train", ["phases.ar=abc"], "phases.ar must be a number in [0, 1), got 'abc'"),
    ("cdlm-train", ["phases.ar=0.8", "phases.anneal=0.5"], "shares of the budget"),
    ("cdlm-train", ["stepz=3"], ("unknown config option 'stepz'", "seed")),
    ("cdlm-train", ["process=nope"], ("Could not find 'process/nope'", "masked")),
    ("cdlm-train", ["process=masked", "schedule=linear"], "schedule= does not apply"),
    # files it is given
    ("cdlm-train", ["resume=missing.ckpt"], "resume=missing.ckpt: no such file"),
    ("cdlm-train", ["resume=EMPTY_CKPT"], "is not a whole Lightning checkpoint"),
    ("cdlm-train", ["resume=TORN"], "is not a whole Lightning checkpoint"),
    (
        "cdlm-train",
        ["resume=GAUSSIAN"],
        "is a cdlm model file: start from its weights with init_from",
    ),
    ("cdlm-train", ["init_from=missing.safetensors"], "checkpoint not found"),
    ("cdlm-train", ["init_from=LIGHTNING"], LIGHTNING),
    ("cdlm-train", ["module=distill_progressive", "teacher=LEGACY"], "is a torch.save (pickle)"),
    # corpora: found while the data is read, after which the run folder is removed again
    ("cdlm-train", ["data.path=EMPTY_TXT"], "holds no text"),
    ("cdlm-train", ["data.path=SHORT"], "corpus too small"),
    ("cdlm-train", ["data.path=LATIN1"], "is not UTF-8 text (byte 3); convert it first"),
    ("cdlm-train", ["data.path=NOTEXT"], "is a folder with no .txt, .txt.gz or .py files"),
    ("cdlm-train", ["module=distill_progressive"], "needs teacher=PATH"),
    # the output folder
    ("cdlm-train", ["hydra.run.dir=UNWRITABLE/run"], "cannot write in"),
    ("cdlm-train", ["hydra.run.dir=EMPTY/run"], "is a file, not a folder"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """A run folder's Lightning .ckpt (a zip) beside its model file, a legacy-format torch.save
    pickle, empty, truncated and corrupt files, and corpora that cannot train."""
    folder = tmp_path_factory.mktemp("bad")
    (folder / "run" / "checkpoints").mkdir(parents=True)
    model = folder / "run" / "model.safetensors"
    save_file({"w": torch.zeros(64)}, str(model))
    files = {
        "LIGHTNING": folder / "run" / "checkpoints" / "last.ckpt",
        "LEGACY": folder / "legacy.pt",
        "EMPTY": folder / "empty.safetensors",
        "TRUNCATED": folder / "truncated.safetensors",
        "CORRUPT": folder / "corrupt.safetensors",
        "FOREIGN": model,  # a whole safetensors file, but not a cdlm model
        "NOMODEL": folder / "nomodel",
        "MISSING": folder / "missing",
        "EMPTY_CKPT": folder / "empty.ckpt",
        "TORN": folder / "torn.ckpt",
        "EMPTY_TXT": folder / "empty.txt",
        "SHORT": folder / "short.txt",
        "LATIN1": folder / "latin1.txt",
        "NOTEXT": folder / "notext",
    }
    torch.save({"state_dict": {}}, files["LIGHTNING"])
    torch.save({"state_dict": {}}, files["LEGACY"], _use_new_zipfile_serialization=False)
    files["EMPTY"].write_bytes(b"")
    files["TRUNCATED"].write_bytes(model.read_bytes()[:100])
    files["CORRUPT"].write_bytes(b"\xff" * 8 + os.urandom(500))
    files["NOMODEL"].mkdir()
    files["EMPTY_CKPT"].write_bytes(b"")
    files["TORN"].write_bytes(files["LIGHTNING"].read_bytes()[:-64])
    files["EMPTY_TXT"].write_text("")
    files["SHORT"].write_text("It is a truth.\n")
    files["LATIN1"].write_bytes("caf\xe9 au lait. ".encode("latin-1") * 200)
    files["NOTEXT"].mkdir()
    (files["NOTEXT"] / "notes.csv").write_text("a,b\n")
    files["UNWRITABLE"] = unwritable_folder(folder)
    return files


def unwritable_folder(base: Path) -> Path:
    """A folder no file can be made in: read-only for a user; /sys for root, whom permission
    bits do not stop."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = base / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


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
    "prog, args, message", CASES, ids=[f"{p[5:]} {' '.join(a)[:60]}" for p, a, _ in CASES]
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    prog, args, message, bad_files, tiny_corpus, request, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)

    def resolve(arg: str) -> str:
        key, _, value = arg.partition("=")
        name, _, rest = value.partition("/")
        if name in MODELS:
            return f"{key}={request.getfixturevalue(MODELS[name])}"
        if name in bad_files:
            return f"{key}={bad_files[name]}" + (f"/{rest}" if rest else "")
        return arg

    args = [resolve(a) for a in args]
    given = {a.split("=", 1)[0] for a in args}
    if prog == "cdlm-train":  # the tiny recipe; its output is the run folder
        out = Path(next((a[15:] for a in args if a.startswith("hydra.run.dir=")), tmp_path / "run"))
        if "data.path" not in given:
            args.insert(0, f"data.path={tiny_corpus}")
        args = [*TINY_TRAIN, "+trainer.enable_progress_bar=false", *args]
        if "hydra.run.dir" not in given:
            args.append(f"hydra.run.dir={out}")
    else:
        out = Path(next((a[4:] for a in args if a.startswith("out=")), tmp_path / "out.json"))
        if "ckpt" not in given:
            args.append("ckpt=missing.safetensors")  # refused before validation reaches the file
        if "out" not in given:
            args.append(f"out={out}")
        if prog == "cdlm-eval":
            args.append("scorer=none")
    status, stderr = call(prog, args, monkeypatch, capsys)
    if out.is_dir() and prog != "cdlm-train":  # out=FOLDER: refused, and left as it was
        assert not any(out.iterdir())
        out = out / "none"
    assert_refused(prog, status, stderr, message, out)


def test_a_second_training_in_a_busy_folder_is_refused(tmp_path, monkeypatch, capsys):
    """Another process holds the run folder's lock: refused before Hydra writes into it."""
    import subprocess

    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242'); print('held', flush=True); "
            "time.sleep(60)",
            str(folder / ".cdlm.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        args = [*TINY_TRAIN, f"hydra.run.dir={folder}"]
        status, stderr = call("cdlm-train", args, monkeypatch, capsys)
    finally:
        holder.kill()
        holder.wait()
    assert status == 2 and stderr.strip().splitlines() == [
        f"cdlm-train: error: {folder} is in use by another run (pid 4242); two runs cannot "
        "share one output folder"
    ]
    assert [p.name for p in folder.iterdir()] == [".cdlm.lock"]  # no .hydra/ written
    from cdlm.io import folder_lock

    with folder_lock(folder):  # the holder's death released it
        pass


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
def test_number_rules_name_key_range_and_value(value, options, message):
    with pytest.raises(UsageError) as err:
        Number(**options).check("x", value)
    assert str(err.value) == message
    Number(nullable=True, **options).check("x", None)  # null where allowed


def test_a_whole_safetensors_file_passes_the_header_check(bad_files):
    check_model_file(bad_files["LIGHTNING"].parent.parent / "model.safetensors")
