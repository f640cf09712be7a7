"""Every config file composes, and every group option instantiates."""

import copy
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.distillation.callbacks import EvaluateRounds, Rounds
from cdlm.distillation.module import Distillation, student_of
from cdlm.distillation.report import RoundEval
from cdlm.distillation.targets import halvings
from cdlm.networks.transformer import Transformer
from cdlm.processes import AutoregressiveProcess, GaussianProcess, MaskedProcess, UniformProcess
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.processes.objectives import X0MSE, CrossEntropy
from cdlm.processes.vocabulary import token_ids
from cdlm.samplers.base import sampler_name
from cdlm.training.module import DiffusionLM
from cdlm.training.phases import Phases
from cdlm.worlds import load

CONF = config_dir()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(*overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_config_dir_is_the_repo_conf():
    assert (CONF / "train.yaml").is_file() and (CONF / "sample.yaml").is_file()


class StubTokenizer:
    mask_token_id, eos_token_id = 3, 1
    all_special_ids = [0, 1, 3]  # pad, eos, mask: what uniform's noise support leaves out

    def __len__(self):
        return 50


@pytest.mark.parametrize(
    "process, schedule_group, expected",
    [
        ("gaussian", "schedule", GaussianProcess),
        ("masked", "mask_schedule", MaskedProcess),
        ("autoregressive", None, AutoregressiveProcess),
        ("uniform", "mask_schedule", UniformProcess),
    ],
)
def test_processes_and_schedules_instantiate(process, schedule_group, expected):
    for schedule in options(schedule_group) if schedule_group else [None]:
        overrides = [f"process={process}"] + ([f"{schedule_group}={schedule}"] if schedule else [])
        cfg = compose_train(*overrides)
        obj = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
        assert isinstance(obj, expected) and obj.vocab_size == 50
        if schedule:
            assert type(obj.schedule).__name__.lower().startswith(schedule.replace("_", ""))
        net = instantiate(cfg.network, **obj.network_kwargs, max_seq_len=8)
        assert net.causal == (process == "autoregressive")


@pytest.mark.parametrize("process", ["gaussian", "masked", "uniform"])
@pytest.mark.parametrize("sampler", options("time_sampler"))
def test_time_samplers_instantiate_inside_each_process(process, sampler):
    cfg = compose_train(f"process={process}", f"time_sampler@process.time_sampler={sampler}")
    if sampler == "gumbel" and process != "gaussian":  # log-SNR levels: VP schedules only
        with pytest.raises(Exception, match="applies to process=gaussian"):
            instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
        return
    obj = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
    assert type(obj.time_sampler).__name__.lower().endswith(sampler.replace("_", ""))


RECIPES = {  # what each conf/recipe row must change in the built process (docs/results/historical/continuous.md)
    "today": ("GaussianProcess", "Warped", 1.0, []),
    "shared": ("GaussianProcess", "Warped", 0.5, []),
    "logit_normal": ("GaussianProcess", "LogitNormal", 1.0, []),
    "gumbel": ("GaussianProcess", "LogSNRGumbel", 0.5, []),
    "self_cond": ("GaussianProcess", "Warped", 1.0, []),
    "xpred": ("GaussianProcess", "Warped", 1.0, ["XPrediction", "PreconditionSkip"]),
    "combined": ("GaussianProcess", "LogSNRGumbel", 0.5, ["XPrediction", "PreconditionSkip"]),
    "candi": ("GaussianProcess", "Stratified", 0.0, []),  # docs/guide/levers.md, issue 39
    "masked": ("MaskedProcess", None, None, None),
    "autoregressive": ("AutoregressiveProcess", None, None, None),
    # the rows of the studies (experiments/README.md): a process, or one lever on it
    "gaussian": ("GaussianProcess", "LogitNormal", 1.0, []),
    "gaussian_self_cond": ("GaussianProcess", "LogitNormal", 1.0, []),
    "gaussian_embed16": ("GaussianProcess", "LogitNormal", 1.0, []),
    "gaussian_importance": ("GaussianProcess", "LogitNormal", 1.0, []),
    "masked_no_ar_phase": ("MaskedProcess", None, None, None),
    "block": ("BlockProcess", None, None, None),
    "uniform": ("UniformProcess", None, None, None),
    "uniform_curriculum": ("UniformProcess", None, None, None),
    "uniform_curriculum_world": ("UniformProcess", None, None, None),
    # the lever rows of the GPU learning study (scripts/gpu_learning.sh)
    "masked_bell": ("MaskedProcess", None, None, None),
    "masked_flat": ("MaskedProcess", None, None, None),
    "masked_complementary": ("MaskedProcess", None, None, None),
    "masked_clipped": ("MaskedProcess", None, None, None),
    "gaussian_bell": ("GaussianProcess", "Bell", 1.0, []),
    "uniform_bell": ("UniformProcess", None, None, None),
    "uniform_flat": ("UniformProcess", None, None, None),
    # the learned rows of the conditional worlds study (conf/experiment/worlds_conditional_models.yaml)
    "gaussian_clean_prompt": ("GaussianProcess", "LogitNormal", 1.0, []),
    "gaussian_noised_prompt": ("GaussianProcess", "LogitNormal", 1.0, []),
    "block_default": ("BlockProcess", None, None, None),
    "autoregressive_fim": ("AutoregressiveProcess", None, None, None),
    # AR at its best rate in the worlds (conf/experiment/learning_tokens.yaml)
    "autoregressive_lr3e-3": ("AutoregressiveProcess", None, None, None),
}
# the one setting each study row changes from its process's defaults
CHANGES = {
    "gaussian_self_cond": ("process.input.self_cond_prob", 0.5),
    "gaussian_embed16": ("process.embed_dim", 16),
    "gaussian_importance": ("process.importance_weight", True),
    "masked_no_ar_phase": ("phases.ar", 0.0),
    "block": ("process.complementary", True),
    "uniform_curriculum": ("process.curriculum.share", 0.5),
    "uniform_curriculum_world": ("process.curriculum.gamma_max", 4),
    "masked_bell": ("process.time_sampler._target_", "cdlm.time_samplers.Bell"),
    "masked_flat": ("process.flat_weight", True),
    "masked_complementary": ("process.complementary", True),
    "masked_clipped": ("process.time_sampler._target_", "cdlm.time_samplers.Clipped"),
    "gaussian_bell": ("process.time_sampler._target_", "cdlm.time_samplers.Bell"),
    "uniform_bell": ("process.time_sampler._target_", "cdlm.time_samplers.Bell"),
    "uniform_flat": ("process.flat_weight", True),
    "gaussian_noised_prompt": ("process.prompt_view", "noised"),
    "autoregressive_fim": ("process.fim_rate", 0.5),
    "autoregressive_lr3e-3": ("optimizer.lr", 3e-3),
}


@pytest.mark.parametrize("recipe", sorted(CHANGES))
def test_a_study_row_changes_the_setting_it_names(recipe):
    key, value = CHANGES[recipe]
    base = {p: p for p in ("gaussian", "masked", "block", "uniform", "autoregressive")}
    process = next(v for k, v in base.items() if recipe.startswith(k))
    assert OmegaConf.select(compose_train(f"recipe={recipe}"), key) == value
    assert OmegaConf.select(compose_train(f"process={process}"), key) != value


def test_every_recipe_row_has_an_expectation():
    assert set(RECIPES) == set(options("recipe"))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_builds_the_process_it_names(recipe):
    kind, levels, token_noise, pieces = RECIPES[recipe]
    cfg = compose_train(f"recipe={recipe}")
    # FIM adds its sentinels to a real tokenizer
    tokenizer = (
        copy.deepcopy(load("world:chars").tokenizer) if cfg.process.get("fim_rate") else None
    )
    obj = instantiate(cfg.process, **token_ids(cfg.process, tokenizer or StubTokenizer()))
    assert type(obj).__name__ == kind
    if kind != "GaussianProcess":
        return
    assert type(obj.time_sampler).__name__ == levels and obj.token_noise == token_noise
    assert [type(p).__name__ for p in obj.prediction] == pieces
    reading = {"self_cond": ("VectorInput", False), "candi": ("PosteriorInput", False)}
    assert (type(obj.input).__name__, cfg.phases.ar > 0) == reading.get(
        recipe, ("PosteriorInput", True)
    )
    assert (obj.hybrid is not None) == (recipe == "candi")
    instantiate(cfg.network, **obj.network_kwargs, max_seq_len=9)


@pytest.mark.parametrize("objective", options("objective"))
@pytest.mark.parametrize("piece", options("input"))
def test_inputs_and_objectives_instantiate_inside_the_gaussian_process(piece, objective):
    overrides = [
        "process=gaussian",
        f"input@process.input={piece}",
        f"objective@process.objective={objective}",
    ]
    cfg = compose_train(*overrides)
    kinds = {"vector": VectorInput, "posterior": PosteriorInput, "ce": CrossEntropy, "mse": X0MSE}
    if piece == "vector" and objective == "mse":
        # neither piece tells the network each token's own level: per-token noise is refused
        with pytest.raises(Exception, match="token_noise"):
            instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
        cfg = compose_train(*overrides, "process.token_noise=0")
    obj = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
    assert type(obj.input) is kinds[piece] and type(obj.objective) is kinds[objective]
    assert obj.next_token_layout == (piece == "posterior")  # the posterior config shifts
    net = instantiate(cfg.network, **obj.network_kwargs, max_seq_len=9)
    assert net.out_proj.out_features == (50 if objective == "ce" else obj.embed_dim)


@pytest.mark.parametrize(
    "process, default",
    [("gaussian", "ar_anneal"), ("masked", "ar_anneal"), ("autoregressive", "none")],
)
def test_each_process_chooses_its_phases_and_each_option_reaches_the_callback(process, default):
    for phases in [None, *options("phases")]:
        cfg = compose_train(f"process={process}", *([f"phases={phases}"] if phases else []))
        expected = OmegaConf.load(CONF / "phases" / f"{phases or default}.yaml")
        callback = instantiate(cfg.callbacks.phases)
        assert isinstance(callback, Phases)
        assert (callback.ar, callback.anneal) == (expected.ar, expected.anneal)
    assert OmegaConf.load(CONF / "phases" / "none.yaml") == {"ar": 0.0, "anneal": 0.0}


@pytest.mark.parametrize("module", options("module"))
def test_modules_instantiate_with_the_condition_dropout(module):
    """Every module config builds its module: the diffusion module from a process and network,
    a distillation module around a tiny teacher of the process its method accepts, with the
    method, rounds and round callbacks that its config names."""
    process_kind = {"distill_sdtt": "masked", "distill_dcd": "uniform"}.get(module, "gaussian")
    tiny = ["network.d_model=16", "network.n_layers=1", "network.n_heads=2"]
    cfg = compose_train(
        f"module={module}", f"process={process_kind}", "condition.dropout=0.25", *tiny
    )
    factory = instantiate(cfg.module, _partial_=True)
    assert factory.keywords["label_dropout"] == 0.25
    process = instantiate(cfg.process, **token_ids(cfg.process, StubTokenizer()))
    net = instantiate(cfg.network, **process.network_kwargs, max_seq_len=9)
    built = {"optimizer": instantiate(cfg.optimizer), "lr_scheduler": instantiate(cfg.lr_scheduler)}
    if module == "diffusion":
        assert factory.func is DiffusionLM
        lm = factory(process=process, network=net, **built)
        assert lm.label_dropout == 0.25 and lm.eval_times == tuple(cfg.module.eval_times)
        return
    student = student_of(net)
    lm = factory(process=process, network=student, teacher=net, model_config={}, **built)
    assert isinstance(lm, Distillation) and lm.label_dropout == 0.25 and lm.teacher is net
    method = cfg.module.method
    assert type(lm.method).__name__ == method._target_.rsplit(".", 1)[-1]
    for key, value in method.items():
        if key == "divergence":
            assert type(lm.method.divergence).__name__ == value._target_.rsplit(".", 1)[-1]
        elif key != "_target_":
            assert getattr(lm.method, key) == value, key
    end = cfg.module.end_steps
    rounds = halvings(cfg.module.start_steps, end) if lm.method.halves else [end]
    assert lm.counts == rounds and lm.steps == rounds[0]
    assert (lm.ema_target is not None) == (module == "distill_consistency")
    callbacks = lm.configure_callbacks()
    assert [type(c) for c in callbacks] == [Rounds, EvaluateRounds]  # round_dir: null
    assert isinstance(callbacks[1].evaluate, RoundEval)
    assert callbacks[1].evaluate.num_samples == cfg.module.round_eval.num_samples
    optimizer = lm.configure_optimizers()["optimizer"]
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in student.parameters()
    }


def test_network_optimizer_scheduler_instantiate():
    cfg = compose_train()
    net = instantiate(cfg.network, in_dim=8, out_dim=10, max_seq_len=16)
    assert isinstance(net, Transformer)
    opt = instantiate(cfg.optimizer)(net.parameters())
    sched = instantiate(cfg.lr_scheduler)(opt)
    assert sched.get_last_lr()[0] > 0
    # the default warmup is a share of the step budget: 5% of trainer.max_steps
    lrs = []
    for _ in range(cfg.trainer.max_steps // 10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    peak = cfg.optimizer.lr
    warmup = round(0.05 * cfg.trainer.max_steps)
    assert lrs[warmup - 1] == pytest.approx(peak) and lrs[warmup - 2] < peak


@pytest.mark.parametrize("logger", options("logger"))
def test_loggers_and_callbacks_instantiate(logger, tmp_path):
    cfg = compose_train(f"logger={logger}")
    OmegaConf.update(cfg, "hydra.runtime.output_dir", str(tmp_path), force_add=True)
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    assert instantiate(cfg.logger) is not None
    callbacks = {name: instantiate(c) for name, c in cfg.callbacks.items()}
    assert all(c is not None for c in callbacks.values())
    # the model export and sample logging are callbacks from config too, after the EMA
    names = list(callbacks)
    assert names.index("ema") < min(names.index("export"), names.index("samples"))
    assert str(callbacks["export"].path) == str(tmp_path / "model.safetensors")
    samples = callbacks["samples"]
    assert samples.sampler is None  # the process's default sampler
    assert (samples.every, samples.num_samples, samples.steps) == (500, 4, 32)
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert trainer_cfg["default_root_dir"] == str(tmp_path)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_compose(experiment):
    cfg = compose_train(f"experiment={experiment}")
    assert cfg.name == experiment
    assert "log_samples" not in cfg and "eval_times" not in cfg  # moved to callbacks, module


@pytest.mark.parametrize("sampler", options("sampler"))
def test_sample_config_and_samplers_compose(sampler):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("sample", overrides=[f"sampler={sampler}", "ckpt=x"])
    assert sampler_name(instantiate(cfg.sampler)) == sampler  # masked: its rule's registered name


@pytest.mark.parametrize("task", options("task"))
def test_eval_config_and_tasks_compose(task):
    """Each task config builds a task of its own name (tests/test_task_contract.py runs them)."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("eval", overrides=[f"task={task}", "ckpt=x"])
    assert instantiate(cfg.task).name == task


def test_every_yaml_file_is_covered():
    covered = {
        "process",
        "schedule",
        "mask_schedule",
        "metric",
        "network",
        "optimizer",
        "lr_scheduler",
        "logger",
        "callbacks",
        "experiment",
        "sampler",
        "data",
        "trainer",
        "time_sampler",
        "input",
        "objective",
        "phases",
        "module",
        "cache",  # composed and built in tests/test_block.py::test_the_cache_group_builds_the_cache
        "task",
        "recipe",  # test_each_recipe_builds_the_process_it_names
        "world",  # tests/test_worlds.py::test_every_world_builds
    }
    groups = {p.parent.name for p in Path(CONF).rglob("*.yaml") if p.parent != Path(CONF)}
    assert groups <= covered, groups - covered


def test_the_block_quickstart_recipe_is_an_ar_phase_then_complementary_block_adaptation():
    cfg = compose_train("experiment=block_quickstart")
    assert cfg.process._target_ == "cdlm.processes.block.BlockProcess"
    assert cfg.process.shift and cfg.process.causal_clean and cfg.process.ar_weight > 0
    assert cfg.process.complementary and cfg.process.block_size == 4
    assert cfg.phases.ar == 0.5 and cfg.phases.anneal == 0.0
    assert cfg.trainer.max_time == "00:00:10:00"  # the quickstart's budget


def test_the_gaussian_default_is_the_recipe_docs_continuous_chose():
    # docs/results/historical/continuous.md chose recipe=logit_normal for the quickstart by measurement
    default, chosen = compose_train(), compose_train("recipe=logit_normal")
    for key in ("process", "phases"):
        assert OmegaConf.to_container(default[key]) == OmegaConf.to_container(chosen[key])
    assert default.process.time_sampler.shift == 2.0
