"""A world as a cdlm model: a process over the world's exact posterior (``OracleNetwork``), so
that every sampler runs on the exact denoiser (``ckpt=world:<name> process=...``;
docs/guide/worlds.md)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from cdlm import worlds
from cdlm.model import Model, ModelFileError, build, qualname
from cdlm.processes.vocabulary import token_ids
from cdlm.worlds.oracle import OracleNetwork
from cdlm.worlds.uniform import UniformOracleNetwork

GAUSSIAN = "cdlm.processes.gaussian.GaussianProcess"


def world_model(
    spec: str,
    process: Any,
    device: str | torch.device = "cpu",
    embedding: Model | None = None,
    world_options: Any = None,
) -> Model:
    """The world ``world:<name>`` (conf/world/) with ``world_options`` (``worlds.options``) as a
    cdlm model of ``process``: ``oracle_model``."""
    if process is None:
        raise ModelFileError(
            f"{spec} needs a process: process=masked|gaussian|autoregressive|block|uniform"
        )
    try:
        world = worlds.load(spec, **worlds.options(spec, world_options))
    except ValueError as e:
        raise ModelFileError(str(e)) from None
    return oracle_model(world, process, device, embedding)


def oracle_model(
    world: worlds.World,
    process: Any,
    device: str | torch.device = "cpu",
    embedding: Model | None = None,
) -> Model:
    """``world`` as a cdlm model of ``process`` (a process config, e.g. conf/process/masked.yaml
    composed) whose network is the world's exact posterior (``OracleNetwork``). A gaussian
    oracle reads the posterior input unshifted (each token's own level, exactly) with no readout
    skip or prediction pieces, over a fixed normalised embedding table (seed 0) or, with
    ``embedding`` (a cdlm model), that model's own table. A process with ``uniform_noise``
    (uniform) gets the leave-one-out posterior its ELBO implies (``cdlm.worlds.uniform``)."""
    cfg = OmegaConf.to_container(process, resolve=True) if OmegaConf.is_config(process) else process
    if cfg.get("_target_") == GAUSSIAN:
        cfg = _oracle_gaussian(cfg, embedding)
    elif embedding is not None:
        raise ModelFileError("embedding= applies to a gaussian world model (process=gaussian)")
    tokenizer = copy.deepcopy(world.tokenizer)  # FIM sentinels must not reach the cached world
    kwargs = token_ids(cfg, tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        built = build(Path(world.name), {"process": cfg | kwargs}, "process")
    if embedding is not None:
        built.embedding.load_state_dict(embedding.process.embedding.state_dict())
    layout = {"shift": built.next_token_layout, "mask_id": kwargs.get("mask_id")}
    if built.uniform_noise is None:
        network = OracleNetwork(world, **built.network_kwargs, **layout)
    else:  # uniform noise: each x_t is evidence, not an observation
        noise = built.uniform_noise
        network = UniformOracleNetwork(
            world, noise.schedule, noise.support.size, **built.network_kwargs, **layout
        )
    config = {
        "process": cfg | kwargs,
        "network": {"_target_": qualname(network), "world": worlds.PREFIX + world.name},
        "seq_len": world.length,
        "labels": [],
        "world": worlds.PREFIX + world.name,
        "world_options": world.options,
    }
    return Model(built.to(device).eval(), network.to(device).eval(), tokenizer, config)


def _oracle_gaussian(cfg: dict, embedding: Model | None) -> dict:
    """A gaussian process config made exact for an oracle (see ``world_model``)."""
    objective = cfg.get("objective") or {}
    if "X0MSE" in str(objective.get("_target_", "")):
        raise ModelFileError("a gaussian world model predicts logits: objective=ce")
    cfg = cfg | {
        "input": {"_target_": "cdlm.processes.inputs.PosteriorInput", "shift": False},
        "objective": objective | {"readout_skip": False},
        "prediction": [],
    }
    if embedding is not None:
        cfg["embed_dim"] = embedding.config["process"]["embed_dim"]
    return cfg
