"""``cdlm-serve``: serve one model (file, folder, Hub id, or a world's exact posterior) over
HTTP with LitServe's OpenAI spec: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``
and ``/health`` on 127.0.0.1, concurrent requests drawn together in batches
(docs/guide/serving.md)."""

from __future__ import annotations

import importlib.util
import sys

from omegaconf import DictConfig

from cdlm import config_dir
from cdlm.cli.common import model_options, resolve_device, run, validate_model_and_output
from cdlm.validation import COUNT, POSITIVE, Choice, Number, check, require

RULES = {
    "host": Choice(("127.0.0.1", "0.0.0.0", "::")),  # the addresses LitServe binds
    "port": Number(integer=True, at_least=1024, at_most=65535),
    "max_batch_size": COUNT,
    "batch_timeout": Number(at_least=0),
    "timeout": POSITIVE,
}


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option, and that LitServe is installed, before the model loads."""
    check(cfg, RULES)
    template = cfg.chat_template
    require(
        template is None or isinstance(template, str),
        f"chat_template must be a Jinja template string, got {template!r}",
    )
    require(
        importlib.util.find_spec("litserve") is not None,
        "cdlm-serve needs LitServe: pip install 'cdlm[serve]'",
    )
    validate_model_and_output(cfg)


def serve(cfg: DictConfig) -> None:
    """Builds the server (the model loads in its worker) and runs it until interrupted."""
    from cdlm.serve.server import build, serve

    device, options = str(resolve_device(cfg.device)), model_options(cfg)
    limits = {k: cfg[k] for k in ("max_batch_size", "batch_timeout", "timeout")}
    server = build(str(cfg.ckpt), device, options, cfg.chat_template, **limits)
    serve(server, cfg.host, cfg.port, str(cfg.ckpt))


def main() -> None:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        options = (config_dir() / "serve.yaml").read_text(encoding="utf-8").split("\nhydra:")[0]
        print(f"{__doc__}\n\nOptions (key=value), from conf/serve.yaml:\n\n{options}")
        return
    run("cdlm-serve", "serve", serve, validate)


if __name__ == "__main__":
    main()
